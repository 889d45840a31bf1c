package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// progress draws a bar on a terminal and prints plain lines otherwise.
type progress struct {
	w     io.Writer
	total int64
	tty   bool
	every time.Duration
	drawn bool
}

func newProgress(w io.Writer, total int64) *progress {
	p := &progress{w: w, total: total, every: time.Second}
	if f, ok := w.(*os.File); ok {
		if _, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS); err == nil {
			p.tty, p.every = true, 200*time.Millisecond
		}
	}
	return p
}

func (p *progress) update(done int64, repaired int, elapsed time.Duration) {
	frac := 1.0
	if p.total > 0 {
		frac = float64(done) / float64(p.total)
	}
	rate := float64(done) * 8 / max(elapsed.Seconds(), 1e-9) / 1e6
	eta := "?"
	if done > 0 && done < p.total {
		eta = (time.Duration(float64(elapsed) / frac * (1 - frac))).Round(100 * time.Millisecond).String()
	} else if done >= p.total {
		eta = "0s"
	}
	if p.tty {
		const width = 30
		fill := int(frac * width)
		fmt.Fprintf(p.w, "\r[%s%s] %5.1f%% %s/%s %7.1f Mbit/s ETA %-7s repaired %d ",
			strings.Repeat("#", fill), strings.Repeat(" ", width-fill), 100*frac, size(done), size(p.total), rate, eta, repaired)
		p.drawn = true
		return
	}
	fmt.Fprintf(p.w, "haul: %5.1f%% %d/%d bytes %.1f Mbit/s ETA %s repaired %d\n", 100*frac, done, p.total, rate, eta, repaired)
}

func (p *progress) end() {
	if p.drawn {
		fmt.Fprintln(p.w)
		p.drawn = false
	}
}

func size(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2fGiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1fMiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1fKiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%dB", n)
}
