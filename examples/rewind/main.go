// Command rewind shows recovery by rewinding RVMA-notified windows: a
// timestep simulation on a ring of ranks in which one rank fails in the
// middle of an epoch (injected), every rank rolls its window back to the
// last epoch all of them completed, and the simulation continues. The
// final state must equal a fault-free run's byte for byte, and the program
// checks that it does.
//
//	rvmarun -n 4 rewind [--steps 60] [--fail-rank 1] [--fail-step 25] [--cells 4096]
//
// Each rank owns a segment of a periodic 1-D field. A step puts the
// segment's two end cells into the neighbours' notified windows (the
// window of step e is filled in slot e%2, so a neighbour running one step
// ahead never overwrites what is being read), waits for the epoch (both
// neighbours' cells arrived: no fence, no message), and averages each cell
// with its neighbours. The field itself lives in the window's memory, so
// the window's snapshots (NotifyConfig.History) hold the whole state.
package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"time"
	"unsafe"

	"github.com/rvma/rvma/rma"
)

type options struct {
	steps, cells       int
	failRank, failStep int
	timeout            time.Duration
	json               bool
}

func main() {
	var o options
	flag.IntVar(&o.steps, "steps", 60, "timesteps")
	flag.IntVar(&o.cells, "cells", 4096, "cells per rank")
	flag.IntVar(&o.failRank, "fail-rank", 1, "rank that fails (-1: none)")
	flag.IntVar(&o.failStep, "fail-step", 25, "step in which it fails, after half of its puts")
	flag.DurationVar(&o.timeout, "detect", 200*time.Millisecond, "how long a rank waits for an epoch before it declares a failure")
	flag.BoolVar(&o.json, "json", false, "print a JSON line (rank 0)")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	comm, err := rma.Init(ctx, nil)
	if err != nil {
		fail(err)
	}
	ok, err := run(ctx, comm, o)
	if err != nil {
		// Said before Close, which waits for the other ranks: one that
		// failed may never come.
		fmt.Fprintln(os.Stderr, "rewind:", err)
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		comm.Close(cctx)
		ccancel()
		os.Exit(2)
	}
	if err := comm.Close(ctx); err != nil {
		fail(err)
	}
	if !ok {
		os.Exit(1)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "rewind:", err)
	os.Exit(2)
}

var errInjected = errors.New("injected failure")

// sim is one rank's part: cells, then ghost slots [left, right] for even
// and odd steps, all in one notified window.
type sim struct {
	comm        *rma.Comm
	o           options
	n           int
	mem         []byte
	cells       []float64
	win         *rma.Win
	left, right int
	tmp         []float64
}

const (
	slotBytes = 16 // left and right ghost cell of one parity
)

func newSim(ctx context.Context, comm *rma.Comm, o options) (*sim, error) {
	s := &sim{comm: comm, o: o, n: o.cells}
	p := comm.Size()
	s.left, s.right = (comm.Rank()+p-1)%p, (comm.Rank()+1)%p
	words := make([]float64, o.cells+4)
	s.mem = unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), 8*len(words))
	s.cells = words[:o.cells]
	s.tmp = make([]float64, o.cells)
	expect := map[int]int{s.left: 8, s.right: 8}
	if p == 1 {
		expect = map[int]int{0: 16}
	} else if p == 2 {
		expect = map[int]int{s.left: 16} // left and right are the same rank
	}
	// History 2: a rank that completed the failed epoch must go back two.
	var err error
	s.win, err = comm.Create(ctx, s.mem, &rma.WinConfig{Notify: &rma.NotifyConfig{ExpectFrom: expect, History: 2}})
	return s, err
}

// ghostOff is the byte offset of the ghost cell a rank receives from its
// left (side 0) or right (side 1) neighbour in step e.
func (s *sim) ghostOff(e, side int) int { return 8*s.n + slotBytes*(e%2) + 8*side }

func (s *sim) init() {
	for i := range s.cells {
		g := s.comm.Rank()*s.n + i
		s.cells[i] = float64((g*7919)%1000) / 1000
	}
}

// putStep sends my end cells of step e; the failing rank stops halfway.
func (s *sim) putStep(ctx context.Context, e int, failing bool) error {
	// My first cell is my left neighbour's right ghost, my last cell my
	// right neighbour's left ghost.
	if err := s.win.Put(ctx, s.mem[:8], s.left, s.ghostOff(e, 1)); err != nil {
		return err
	}
	if failing {
		return errInjected
	}
	return s.win.Put(ctx, s.mem[8*(s.n-1):8*s.n], s.right, s.ghostOff(e, 0))
}

func (s *sim) compute(e int) {
	gl := math.Float64frombits(binary.LittleEndian.Uint64(s.mem[s.ghostOff(e, 0):]))
	gr := math.Float64frombits(binary.LittleEndian.Uint64(s.mem[s.ghostOff(e, 1):]))
	c := s.cells
	for i := range c {
		l, r := gl, gr
		if i > 0 {
			l = c[i-1]
		}
		if i < len(c)-1 {
			r = c[i+1]
		}
		s.tmp[i] = (l + c[i] + r) / 3
	}
	copy(c, s.tmp)
}

type stats struct {
	perStep     time.Duration
	failedAt    int
	rewoundTo   uint64
	recoveryDur time.Duration
}

// simulate runs the steps, injecting the failure if asked, and returns
// the final cells.
func (s *sim) simulate(ctx context.Context, inject bool) ([]byte, stats, error) {
	var st stats
	s.init()
	base := s.win.Epoch() // epochs of earlier runs; step e is epoch base+e
	if err := s.comm.Barrier(ctx); err != nil {
		return nil, st, err
	}
	t0 := time.Now()
	for e := 1; e <= s.o.steps; e++ {
		failing := inject && e == s.o.failStep && s.comm.Rank() == s.o.failRank
		if e == s.o.failStep {
			inject = false // the redo of the step succeeds
		}
		perr := s.putStep(ctx, e, failing)
		if perr != nil && !errors.Is(perr, errInjected) {
			return nil, st, perr
		}
		bad := int64(0)
		if perr != nil {
			bad = 1 // this rank failed: it will not complete the epoch
		} else {
			wctx, cancel := context.WithTimeout(ctx, s.o.timeout)
			_, werr := s.win.WaitEpoch(wctx)
			cancel()
			if werr != nil {
				if !errors.Is(werr, context.DeadlineExceeded) {
					return nil, st, werr
				}
				bad = 1 // a neighbour failed
			}
		}
		// Agree on whether the step failed; if so, on the last epoch
		// every rank completed, and rewind to it.
		flags := []int64{bad, -int64(s.win.Epoch())}
		if err := s.comm.AllreduceInt64(ctx, rma.ReduceMax, flags); err != nil {
			return nil, st, err
		}
		if flags[0] == 0 {
			s.compute(e)
			continue
		}
		tr := time.Now()
		agreed := uint64(-flags[1])
		if err := s.win.FlushAll(ctx); err != nil {
			return nil, st, err
		}
		if err := s.comm.Barrier(ctx); err != nil { // no puts of the failed step in flight
			return nil, st, err
		}
		step := int(agreed - base)
		if step == 0 {
			// Failed in the first step: start again from the initial state.
			if err := s.win.AbandonEpoch(); err != nil {
				return nil, st, err
			}
			s.init()
		} else if _, err := s.win.Rewind(int(s.win.Epoch()-agreed) + 1); err != nil {
			return nil, st, err
		}
		if err := s.comm.Barrier(ctx); err != nil { // every window rewound before anyone puts again
			return nil, st, err
		}
		st.failedAt, st.rewoundTo, st.recoveryDur = e, uint64(step), time.Since(tr)
		if step > 0 {
			// The snapshot holds the state at the end of step's wait: redo
			// that step's computation, then continue after it.
			s.compute(step)
		}
		e = step
	}
	st.perStep = time.Since(t0) / time.Duration(s.o.steps)
	if err := s.comm.Barrier(ctx); err != nil {
		return nil, st, err
	}
	return bytes.Clone(s.mem[:8*s.n]), st, nil
}

func run(ctx context.Context, comm *rma.Comm, o options) (bool, error) {
	s, err := newSim(ctx, comm, o)
	if err != nil {
		return false, err
	}
	ref, refStats, err := s.simulate(ctx, false)
	if err != nil {
		return false, fmt.Errorf("fault-free run: %w", err)
	}
	// The fault-free run leaves the window at epoch steps; the second run
	// continues the epoch count, which does not matter to rewinding.
	got, st, err := s.simulate(ctx, o.failRank >= 0)
	if err != nil {
		return false, fmt.Errorf("run with a failure: %w", err)
	}
	same := []int64{0}
	if !bytes.Equal(ref, got) {
		same[0] = 1
	}
	if err := comm.AllreduceInt64(ctx, rma.ReduceSum, same); err != nil {
		return false, err
	}
	ok := same[0] == 0
	if comm.Rank() == 0 {
		if o.json {
			b, _ := json.Marshal(map[string]any{"example": "rewind", "ranks": comm.Size(), "steps": o.steps, "cells": o.cells,
				"us_per_step": float64(refStats.perStep.Nanoseconds()) / 1e3, "failed_step": st.failedAt, "rewound_to_step": st.rewoundTo,
				"recovery_ms": float64(st.recoveryDur.Microseconds()) / 1e3, "ok": ok})
			fmt.Println(string(b))
		} else {
			fmt.Printf("rewind: %d ranks, %d steps of %d cells per rank; fault-free %.1f us/step\n", comm.Size(), o.steps, o.cells,
				float64(refStats.perStep.Nanoseconds())/1e3)
			if st.failedAt > 0 {
				fmt.Printf("  rank %d failed in step %d; all ranks rewound to the end of step %d in %v (after %v of failure detection)\n",
					o.failRank, st.failedAt, st.rewoundTo, st.recoveryDur.Round(time.Microsecond), o.timeout)
			}
			fmt.Printf("  final state equals the fault-free run's byte for byte: %v\n", ok)
		}
	}
	return ok, s.win.Free(ctx)
}
