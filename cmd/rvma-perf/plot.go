package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// A throughput plot: per-path goodput over time, sampled every 100 ms, as
// an SVG file (no dependency: a handful of polylines and labels).

type series struct {
	t     []float64   // seconds since start
	gbps  [][]float64 // per path
	names []string
}

// sampler records each path's cumulative bytes every interval.
type sampler struct {
	every time.Duration
	stop  chan struct{}
	done  chan series
}

func startSampler(paths int, bytesOf func() []uint64, every time.Duration) *sampler {
	s := &sampler{every: every, stop: make(chan struct{}), done: make(chan series, 1)}
	go func() {
		var out series
		out.gbps = make([][]float64, paths)
		for i := range paths {
			out.names = append(out.names, fmt.Sprintf("path %d", i))
		}
		start := time.Now()
		prev := bytesOf()
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-s.stop:
				s.done <- out
				return
			case <-tick.C:
			}
			cur := bytesOf()
			out.t = append(out.t, time.Since(start).Seconds())
			for i := range paths {
				out.gbps[i] = append(out.gbps[i], float64(cur[i]-prev[i])*8/every.Seconds()/1e9)
			}
			prev = cur
		}
	}()
	return s
}

func (s *sampler) finish() series {
	close(s.stop)
	return <-s.done
}

var plotColors = []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
	"#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd"}

// writeSVG draws the series.
func writeSVG(w io.Writer, title string, s series) error {
	const W, H, L, R, T, B = 800.0, 400.0, 60.0, 120.0, 40.0, 50.0
	maxT, maxG := 0.1, 0.001
	for i := range s.t {
		maxT = max(maxT, s.t[i])
		for p := range s.gbps {
			maxG = max(maxG, s.gbps[p][i])
		}
	}
	maxG *= 1.1
	x := func(t float64) float64 { return L + (W-L-R)*t/maxT }
	y := func(g float64) float64 { return H - B - (H-T-B)*g/maxG }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%g" height="%g" font-family="sans-serif" font-size="12">`+"\n", W, H)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/><text x="%g" y="20" font-size="14">%s</text>`+"\n", L, escape(title))
	fmt.Fprintf(&b, `<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="black"/><line x1="%g" y1="%g" x2="%g" y2="%g" stroke="black"/>`+"\n",
		L, H-B, W-R, H-B, L, T, L, H-B)
	for k := 0; k <= 4; k++ {
		g := maxG * float64(k) / 4
		fmt.Fprintf(&b, `<text x="%g" y="%g" text-anchor="end">%.3g</text>`+"\n", L-5, y(g)+4, g)
		tt := maxT * float64(k) / 4
		fmt.Fprintf(&b, `<text x="%g" y="%g" text-anchor="middle">%.2g</text>`+"\n", x(tt), H-B+16, tt)
	}
	fmt.Fprintf(&b, `<text x="%g" y="%g" text-anchor="middle">seconds</text>`+"\n", (L+W-R)/2, H-10)
	fmt.Fprintf(&b, `<text x="15" y="%g" transform="rotate(-90 15 %g)" text-anchor="middle">Gbit/s</text>`+"\n", (T+H-B)/2, (T+H-B)/2)
	for p := range s.gbps {
		color := plotColors[p%len(plotColors)]
		var pts []string
		for i := range s.t {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(s.t[i]), y(s.gbps[p][i])))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>`+"\n", color, strings.Join(pts, " "))
		fmt.Fprintf(&b, `<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="%s" stroke-width="3"/><text x="%g" y="%g">%s</text>`+"\n",
			W-R+10, T+float64(p)*18, W-R+30, T+float64(p)*18, color, W-R+35, T+float64(p)*18+4, escape(s.names[p]))
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func escape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}

func savePlot(path, title string, s series) error {
	if !strings.HasSuffix(path, ".svg") {
		return fmt.Errorf("--plot %s: only .svg is written", path)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := writeSVG(f, title, s); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
