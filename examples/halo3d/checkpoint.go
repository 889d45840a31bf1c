package main

// Recovery from a real failure (--checkpoint N, under rvmarun --restart):
// the notify variant's window keeps a snapshot every N iterations
// (NotifyConfig.History, Every) and a replica of each at the next rank
// (Replicate). Everything an iteration needs is in that window's memory:
// the array that holds the state at a checkpoint epoch (u[1] when N is
// even, since the state of an even epoch's iteration is there; both
// arrays when N is odd), the staging of the faces, x faces included (per
// parity, so a neighbour one epoch ahead never writes what the snapshot
// of this one holds; no put lands in an array), and a header with the
// reference checksum. The other array's constant boundary planes are
// set by initialising it, its interior is the next stencil's output, and
// epoch 0 (the initial state) is computed again. When a rank is
// killed, the survivors' waits fail with ErrPeer, rvmarun respawns it,
// every rank calls Comm.Recover, and the window comes back at the latest
// epoch every rank retains (the respawned rank's from its buddy's
// replica). A snapshot holds the window as its epoch's wait left it, so
// each rank redoes the rest of that iteration (unstaging the y and z
// faces, the stencil) and goes on with the next.
//
// Around the iterations: the reference (the sendrecv variant, run first
// from the same initial state) is kept in the window's header, so a
// respawned rank gets it back with its window; a failure before every
// rank stored it rewinds to epoch 0, and the ranks, agreeing that one of
// them lacks it, compute it again (with fresh tags: messages of the
// interrupted run may still wait in an inbox). The reductions after the
// iterations, and rank 0's serial solution, are inside the recovery loop
// too: a failure there rewinds to the last checkpoint and redoes the
// tail. Not recoverable: a death while the windows are created, before
// the first snapshot, or after the last barrier (Free, Close): the job
// then fails as without --checkpoint.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"time"

	"github.com/rvma/rvma/rma"
)

// history is how many snapshots a rank keeps: ranks next to each other
// on the process grid are at most one epoch apart, so ranks at its
// diameter (in hops between neighbours) at most that many; the slowest
// rank's latest checkpoint is then within diameter/every+1 checkpoints of
// the fastest's, and one more allows for a dead rank's last replica torn
// by its death.
func history(dims [3]int, every int) int {
	diameter := dims[0] + dims[1] + dims[2] - 3
	return (diameter+every-1)/every + 2
}

// ckState is what a rank knows of a checkpointed run across recoveries.
type ckState struct {
	recoveries int       // failures recovered from, as the ranks agreed
	t0         time.Time // start of the timed iterations
	serial     float64   // rank 0: the serial solution's checksum, once computed
	serialUS   float64
	haveSerial bool
}

// runCheckpointed is run for --checkpoint: the notify variant, recovering
// from deaths, checked against the sendrecv variant and the serial
// solution as without it.
func (v *variant) runCheckpointed(ctx context.Context) (bool, error) {
	g, comm, o := v.g, v.comm, v.o
	var st ckState
	recover := comm.Restarted()
	// A respawned rank too: the array outside the window keeps its
	// boundary planes from here.
	g.initArrays()
	if !recover {
		g.hdr[0] = math.NaN()
		// Epoch 0 is retained too, so that a failure before the first
		// checkpoint rewinds to the start.
		if err := v.nwin.Snapshot(ctx); err != nil {
			return false, err
		}
		if err := comm.Barrier(ctx); err != nil {
			if !errors.Is(err, rma.ErrPeer) {
				return false, err
			}
			recover = true
		}
	}
	var us, sum float64
	for {
		if recover {
			if err := v.recover(ctx, &st); err != nil {
				return false, fmt.Errorf("recover: %w", err)
			}
		}
		var err error
		if us, sum, err = v.attempt(ctx, &st); err == nil {
			break
		}
		if !errors.Is(err, rma.ErrPeer) {
			return false, fmt.Errorf("notify: %w", err)
		}
		if o.trace {
			trace(comm, "errpeer", time.Now())
		}
		recover = true
	}
	ref := g.hdr[0]
	r := result{Example: "halo3d", Sync: "notify", Ranks: comm.Size(), Dims: fmt.Sprintf("%dx%dx%d", g.dims[0], g.dims[1], g.dims[2]),
		N: o.local[0], Iters: o.iters, Warmup: o.warmup, Compute: !o.exchangeOnly, USPerIter: us, Checksum: sum, OK: close(sum, ref),
		Checkpoint: o.checkpoint, Recoveries: st.recoveries}
	if comm.Rank() == 0 && o.json {
		b, _ := json.Marshal(r)
		fmt.Println(string(b))
	}
	printSummary(comm, g, o, []result{r})
	ok := r.OK
	if st.haveSerial {
		ok = printSerial(g, o, st.serial, st.serialUS, ref) && ok
	}
	if err := v.nwin.Free(ctx); err != nil {
		return false, err
	}
	if err := v.win.Free(ctx); err != nil {
		return false, err
	}
	return ok, nil
}

// recover calls Comm.Recover: the notified window is then at the latest
// epoch every rank retains.
func (v *variant) recover(ctx context.Context, st *ckState) error {
	comm := v.comm
	fresh := comm.Restarted()
	t0 := time.Now()
	if err := comm.Recover(ctx); err != nil {
		return err
	}
	st.recoveries++
	// Recover completed or dropped the puts in flight.
	v.pending, v.spare = nil, nil
	// Work around a race in rma's Recover: when a flush marker finds the
	// dead rank's mapped window gone, Recover stops waiting for the
	// window's operations in flight, so a put to the dead incarnation can
	// fail after Recover cleared the window's recorded failures, and the
	// next flush (Free's) would report it. Waiting for them here, and
	// dropping what they report, leaves nothing behind; a new failure
	// shows in the next wait.
	_ = v.nwin.FlushAll(ctx)
	if v.o.trace {
		now := time.Now()
		trace(comm, "recovered", now)
		fmt.Fprintf(os.Stderr, "halo3d: rank %d: Recover took %v, back at epoch %d\n", comm.Rank(), now.Sub(t0).Round(time.Microsecond), v.nwin.Epoch())
	}
	if fresh {
		fmt.Fprintf(os.Stderr, "halo3d: rank %d (incarnation %d) restored its window at iteration %d from rank %d's replica\n",
			comm.Rank(), comm.Incarnation(), v.nwin.Epoch(), (comm.Rank()+1)%comm.Size())
	}
	return nil
}

// attempt runs from wherever the window is to the end: the reference if
// some rank lacks it, the iterations, the reductions and the serial
// solution. It returns the slowest rank's time per timed iteration and
// the global checksum.
func (v *variant) attempt(ctx context.Context, st *ckState) (float64, float64, error) {
	g, comm, o := v.g, v.comm, v.o
	// Agree whether every rank has the reference (a failure before every
	// rank stored it leaves some without), and on the failures so far (a
	// respawned rank knows of its own only).
	agree := []float64{0, float64(st.recoveries)}
	if math.IsNaN(g.hdr[0]) {
		agree[0] = 1
	}
	if err := comm.AllreduceFloat64(ctx, rma.ReduceMax, agree); err != nil {
		return 0, 0, err
	}
	st.recoveries = int(agree[1])
	e := int(v.nwin.Epoch())
	if e == 0 {
		g.initArrays() // u[0] may be outside the window
	}
	if agree[0] == 1 {
		if e != 0 {
			return 0, 0, fmt.Errorf("the window is at epoch %d but a rank has no reference checksum", e)
		}
		v.tagBase = 6 * st.recoveries
		_, ref, err := v.run(ctx, "sendrecv", o)
		if err != nil {
			return 0, 0, err
		}
		g.initArrays()
		g.hdr[0] = ref
		if err := v.nwin.Snapshot(ctx); err != nil {
			return 0, 0, err
		}
		if err := comm.Barrier(ctx); err != nil {
			return 0, 0, err
		}
	}
	w, n := o.warmup, o.warmup+o.iters
	if e > 0 {
		// The snapshot holds the window as epoch e's wait left it: the
		// rest of iteration e is to do.
		c := (e - 1) % 2
		g.unstage(c)
		if !o.exchangeOnly {
			jacobi(g.u[1-c], g.u[c], g.nx, g.ny, g.nz, g.sx, g.sy)
		}
	}
	if st.recoveries > 0 && o.trace {
		trace(comm, "computing", time.Now())
	}
	if e > w && st.t0.IsZero() {
		st.t0 = time.Now() // a respawned rank, past the warm-up
	}
	cur := e % 2
	for it := e + 1; it <= n; it++ {
		if it == w+1 {
			if err := comm.Barrier(ctx); err != nil {
				return 0, 0, err
			}
			st.t0 = time.Now()
		}
		if err := v.exchange(ctx, "notify", cur, int64(it)); err != nil {
			return 0, 0, err
		}
		if !o.exchangeOnly {
			jacobi(g.u[1-cur], g.u[cur], g.nx, g.ny, g.nz, g.sx, g.sy)
		}
		cur = 1 - cur
	}
	el := []float64{time.Since(st.t0).Seconds()}
	if err := rma.WaitAll(ctx, v.pending...); err != nil {
		return 0, 0, err
	}
	v.pending = nil
	if err := comm.AllreduceFloat64(ctx, rma.ReduceMax, el); err != nil {
		return 0, 0, err
	}
	sum := []float64{interiorSum(g.u[cur], g.nx, g.ny, g.nz, g.sx, g.sy)}
	if err := comm.AllreduceFloat64(ctx, rma.ReduceSum, sum); err != nil {
		return 0, 0, err
	}
	if o.serial && !o.exchangeOnly && comm.Rank() == 0 && !st.haveSerial {
		// Here, not after the last barrier, so that a failure while rank
		// 0 computes it is recovered from too.
		st.serial, st.serialUS = g.serial(o)
		st.haveSerial = true
	}
	if err := comm.Barrier(ctx); err != nil {
		return 0, 0, err
	}
	return el[0] / float64(o.iters) * 1e6, sum[0], nil
}
