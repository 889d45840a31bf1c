package main

import (
	"fmt"
	"io"
	"time"

	"github.com/rvma/rvma/internal/plot"
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

func (s series) lines(title string) plot.Lines {
	return plot.Lines{Title: title, XLabel: "seconds", YLabel: "Gbit/s", X: s.t, Y: s.gbps, Names: s.names}
}

func writeSVG(w io.Writer, title string, s series) error { return plot.WriteSVG(w, s.lines(title)) }

func savePlot(path, title string, s series) error { return plot.Save(path, s.lines(title)) }
