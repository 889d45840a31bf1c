// Command rewind shows recovery from a real failure: a timestep simulation
// on a ring of ranks whose state lives in RVMA-notified windows, run under
// rvmarun --restart so that a rank killed with SIGKILL is respawned. The
// survivors' waits fail with ErrPeer, every rank calls Comm.Recover, the
// windows go back to the last epoch every rank retains (the respawned
// rank's from its buddy's replica), and the simulation goes on. The final
// state must equal the fault-free answer, which every rank computes
// serially at the end, byte for byte.
//
//	rvmarun -n 4 --restart 1 --kill 1@500ms rewind [--steps 400] [--cells 4096]
//	rvmarun -n 4 --restart 1 rewind --fail-rank 2 --fail-step 25
//
// Each rank owns a segment of a periodic 1-D field. A step puts the
// segment's two end cells into the neighbours' notified windows (the
// cells of step e land in slot e%2, so a neighbour one step ahead never
// overwrites what is being read), waits for the epoch (both neighbours'
// cells arrived: no fence, no message), and averages each cell with its
// neighbours. The window keeps snapshots every --checkpoint epochs
// (NotifyConfig.History, Every) and a replica of each at the next rank
// (Replicate).
package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"hash/crc64"
	"math"
	"os"
	"syscall"
	"time"
	"unsafe"

	"github.com/rvma/rvma/rma"
)

type options struct {
	steps, cells       int
	failRank, failStep int
	checkpoint         int
	history            int
	pace               time.Duration
	json               bool
	trace              bool
}

func main() {
	var o options
	flag.IntVar(&o.steps, "steps", 400, "timesteps")
	flag.IntVar(&o.cells, "cells", 4096, "cells per rank")
	flag.IntVar(&o.failRank, "fail-rank", -1, "rank that kills itself with SIGKILL (-1: none; rvmarun --kill kills from outside)")
	flag.IntVar(&o.failStep, "fail-step", 25, "step in which it does, after the first of its two puts")
	flag.IntVar(&o.checkpoint, "checkpoint", 1, "snapshot (and replicate) the window every N epochs")
	flag.IntVar(&o.history, "history", 0, "snapshots kept (0: enough for the ring: ranks half the ring apart may be that many epochs apart)")
	flag.DurationVar(&o.pace, "pace", 2*time.Millisecond, "sleep per step, so that a timed kill lands mid-run")
	flag.BoolVar(&o.json, "json", false, "print a JSON line (rank 0)")
	flag.BoolVar(&o.trace, "trace", false, "print wall-clock timestamps (Unix microseconds) of start, Init, failures and recoveries to stderr")
	flag.Parse()
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	comm, err := rma.Init(ctx, nil)
	if err != nil {
		fail(err)
	}
	if o.trace {
		trace(comm, "start", start)
		trace(comm, "init", time.Now())
	}
	ok, err := run(ctx, comm, o)
	if errors.Is(err, rma.ErrFinished) {
		// Respawned after the others had produced the result (with this
		// rank's part, before it died): nothing is left to do.
		fmt.Fprintf(os.Stderr, "rewind: rank %d (incarnation %d): the job finished without it: %v\n", comm.Rank(), comm.Incarnation(), err)
		comm.Close(ctx)
		return
	}
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
		if !ok {
			fail(err)
		}
		// The result is in and checked: a rank that died while the ranks
		// close changes nothing of it.
		fmt.Fprintln(os.Stderr, "rewind: closing:", err)
	}
	if !ok {
		os.Exit(1)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "rewind:", err)
	os.Exit(2)
}

// trace prints an event's wall-clock time (--trace), for measuring
// recovery across processes: "rewind: trace RANK INC EVENT UNIX_MICROS".
func trace(c *rma.Comm, event string, t time.Time) {
	fmt.Fprintf(os.Stderr, "rewind: trace %d %d %s %d\n", c.Rank(), c.Incarnation(), event, t.UnixMicro())
}

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

const slotBytes = 16 // left and right ghost cell of one parity

func newSim(ctx context.Context, comm *rma.Comm, o options) (*sim, error) {
	s := &sim{comm: comm, o: o, n: o.cells}
	p := comm.Size()
	s.left, s.right = (comm.Rank()+p-1)%p, (comm.Rank()+1)%p
	expect := map[int]int{s.left: 8, s.right: 8}
	if p == 1 {
		expect = map[int]int{0: 16}
	} else if p == 2 {
		expect = map[int]int{s.left: 16} // left and right are the same rank
	}
	history := o.history
	if history == 0 {
		// Neighbours are at most one epoch apart, so ranks half the ring
		// apart at most p/2; one more snapshot than that (in checkpoints)
		// always leaves an epoch every rank retains.
		history = (p/2+o.checkpoint-1)/o.checkpoint + 2
	}
	var err error
	s.win, err = comm.Allocate(ctx, 8*(o.cells+4), &rma.WinConfig{Notify: &rma.NotifyConfig{ExpectFrom: expect,
		History: history, Every: o.checkpoint, Replicate: true}})
	if err != nil {
		return nil, err
	}
	s.mem = s.win.Bytes()
	words := unsafe.Slice((*float64)(unsafe.Pointer(&s.mem[0])), o.cells+4)
	s.cells = words[:o.cells]
	s.tmp = make([]float64, o.cells)
	return s, nil
}

// ghostOff is the byte offset of the ghost cell a rank receives from its
// left (side 0) or right (side 1) neighbour in step e.
func (s *sim) ghostOff(e, side int) int { return 8*s.n + slotBytes*(e%2) + 8*side }

func initCell(g int) float64 { return float64((g*7919)%1000) / 1000 }

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

// recovery is what one rank saw of the failures.
type recovery struct {
	failures  int
	rewoundTo int
	took      time.Duration
	stats     rma.RecoveryStats
}

// recover calls Recover and returns the step to go on from, having redone
// the computation of the step restored (a snapshot holds the state at the
// end of its epoch's wait).
func (s *sim) recover(ctx context.Context, rec *recovery) (int, error) {
	t0 := time.Now()
	if err := s.comm.Recover(ctx); err != nil {
		return 0, err
	}
	rec.failures++
	rec.took += time.Since(t0)
	rec.stats = s.comm.RecoveryStats()
	if s.o.trace {
		trace(s.comm, "recovered", time.Now())
	}
	e := int(s.win.Epoch())
	rec.rewoundTo = e
	if e > 0 {
		s.compute(e)
	}
	if s.o.trace {
		trace(s.comm, "computing", time.Now())
	}
	return e, nil
}

// start brings the window to its first step: a respawned rank recovers
// (the others recover with it), the others initialise their cells.
func (s *sim) start(ctx context.Context, rec *recovery) (int, error) {
	c := s.comm
	if c.Restarted() {
		e, err := s.recover(ctx, rec)
		if err != nil {
			return 0, err
		}
		fmt.Fprintf(os.Stderr, "rewind: rank %d (incarnation %d) restored its window at step %d from rank %d's replica\n",
			c.Rank(), c.Incarnation(), e, (c.Rank()+1)%c.Size())
		return e, nil
	}
	for i := range s.cells {
		s.cells[i] = initCell(c.Rank()*s.n + i)
	}
	// Epoch 0 is retained too, so that a failure in the first steps
	// rewinds to the start.
	if err := s.win.Snapshot(ctx); err != nil {
		return 0, err
	}
	// A rank that passed the barrier may die before this one has: the
	// window and its snapshot exist everywhere, so recover as from a step.
	if err := c.Barrier(ctx); err != nil {
		if !errors.Is(err, rma.ErrPeer) {
			return 0, err
		}
		return s.recover(ctx, rec)
	}
	return 0, nil
}

// advance runs the steps after e, recovering from failures.
func (s *sim) advance(ctx context.Context, e int, rec *recovery) error {
	c := s.comm
	for e < s.o.steps {
		e++
		err := s.win.Put(ctx, s.mem[:8], s.left, s.ghostOff(e, 1))
		if err == nil && e == s.o.failStep && c.Rank() == s.o.failRank && c.Incarnation() == 0 {
			// A real failure: the process is gone, its memory with it.
			if s.o.trace {
				trace(c, "kill", time.Now())
			}
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
		if err == nil {
			err = s.win.Put(ctx, s.mem[8*(s.n-1):8*s.n], s.right, s.ghostOff(e, 0))
		}
		if err == nil {
			_, err = s.win.WaitEpoch(ctx)
		}
		if err != nil {
			if !errors.Is(err, rma.ErrPeer) {
				return err
			}
			if s.o.trace {
				trace(c, "errpeer", time.Now())
			}
			if e, err = s.recover(ctx, rec); err != nil {
				return err
			}
			continue
		}
		s.compute(e)
		if s.o.pace > 0 {
			time.Sleep(s.o.pace)
		}
	}
	return nil
}

// reference is the fault-free answer for rank's segment: the whole ring,
// serially.
func reference(p, n, steps, rank int) []float64 {
	all := make([]float64, p*n)
	for i := range all {
		all[i] = initCell(i)
	}
	next := make([]float64, len(all))
	for range steps {
		for i := range all {
			next[i] = (all[(i-1+len(all))%len(all)] + all[i] + all[(i+1)%len(all)]) / 3
		}
		all, next = next, all
	}
	return all[rank*n : (rank+1)*n]
}

func bytesOf(f []float64) []byte { return unsafe.Slice((*byte)(unsafe.Pointer(&f[0])), 8*len(f)) }

func run(ctx context.Context, comm *rma.Comm, o options) (bool, error) {
	if o.checkpoint < 1 {
		return false, fmt.Errorf("--checkpoint %d: want 1 or more", o.checkpoint)
	}
	s, err := newSim(ctx, comm, o)
	if err != nil {
		if errors.Is(err, rma.ErrPeer) {
			// Recovery restores windows: before they exist there is
			// nothing to recover into.
			err = fmt.Errorf("a rank died while the windows were being created, before recovery can start: %w", err)
		}
		return false, err
	}
	// A rank may die until the verdict is in: the ranks then recover and
	// go on from the step restored.
	var rec recovery
	e, err := s.start(ctx, &rec)
	if err != nil {
		return false, err
	}
	t0 := time.Now()
	for {
		var ok bool
		err := s.advance(ctx, e, &rec)
		if err == nil {
			ok, err = s.verdict(ctx, &rec, time.Since(t0))
		}
		if err == nil {
			if err := s.win.Free(ctx); err != nil {
				// The verdict is in: a rank that died since changes
				// nothing of it.
				fmt.Fprintln(os.Stderr, "rewind: freeing the window:", err)
			}
			return ok, nil
		}
		if !errors.Is(err, rma.ErrPeer) {
			return false, err
		}
		if e, err = s.recover(ctx, &rec); err != nil {
			return false, err
		}
	}
}

// verdict compares every rank's cells with the fault-free answer and
// reports (rank 0).
func (s *sim) verdict(ctx context.Context, rec *recovery, took time.Duration) (bool, error) {
	comm, o, got := s.comm, s.o, s.cells
	if err := comm.Barrier(ctx); err != nil {
		return false, err
	}
	want := reference(comm.Size(), o.cells, o.steps, comm.Rank())
	// Every rank's verdict, failures seen and recovery time.
	stats := []int64{0, int64(rec.failures), rec.took.Microseconds(), int64(crc64.Checksum(bytesOf(got), crc64.MakeTable(crc64.ECMA)) >> 2)}
	if string(bytesOf(got)) != string(bytesOf(want)) {
		stats[0] = 1
	}
	sum := []int64{stats[0], stats[3]}
	if err := comm.AllreduceInt64(ctx, rma.ReduceSum, sum); err != nil {
		return false, err
	}
	// Recover's phases, the slowest rank's each (the times from the kill
	// are --trace's: scripts/recovery-time.sh lines them up).
	st := rec.stats
	most := []int64{stats[1], stats[2], st.Agree.Microseconds(), st.Quiet.Microseconds(),
		st.Reconnect.Microseconds(), st.Exchange.Microseconds(), st.Restore.Microseconds()}
	if err := comm.AllreduceInt64(ctx, rma.ReduceMax, most); err != nil {
		return false, err
	}
	ms := func(us int64) float64 { return float64(us) / 1e3 }
	ok := sum[0] == 0
	if comm.Rank() == 0 {
		if o.json {
			b, _ := json.Marshal(map[string]any{"example": "rewind", "ranks": comm.Size(), "steps": o.steps, "cells": o.cells,
				"recoveries": most[0], "recovery_ms_max": ms(most[1]), "rewound_to_step": rec.rewoundTo,
				"agree_ms": ms(most[2]), "quiet_ms": ms(most[3]), "reconnect_ms": ms(most[4]), "exchange_ms": ms(most[5]), "restore_ms": ms(most[6]),
				"checksum": fmt.Sprintf("%x", uint64(sum[1])), "ok": ok})
			fmt.Println(string(b))
		} else {
			fmt.Printf("rewind: %d ranks, %d steps of %d cells per rank (rank 0's incarnation %d ran for %v)\n", comm.Size(), o.steps, o.cells,
				comm.Incarnation(), took.Round(time.Millisecond))
			if most[0] > 0 {
				fmt.Printf("  recovered from %d failure(s); rank 0 went back to step %d; the longest Recover took %v\n",
					most[0], rec.rewoundTo, time.Duration(most[1])*time.Microsecond)
				fmt.Printf("  Recover's phases (slowest rank each): agree %.1f ms, quiet %.1f, reconnect %.1f, exchange %.1f, restore %.1f\n",
					ms(most[2]), ms(most[3]), ms(most[4]), ms(most[5]), ms(most[6]))
			}
			fmt.Printf("  final state equals the fault-free run's byte for byte: %v (checksum %x)\n", ok, uint64(sum[1]))
		}
	}
	return ok, nil
}
