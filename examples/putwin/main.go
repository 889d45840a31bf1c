// Command putwin is the smallest complete rvma program: every rank puts a
// greeting into its right neighbour's window, once with fences (MPI style)
// and once into a notified window (RVMA style: the target learns that the
// greeting arrived with no fence and no extra message). It checks what it
// received and prints timings.
//
//	rvmarun -n 4 putwin
//
// Run without a launcher it is a world of one rank that greets itself.
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/rvma/rvma/rma"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "putwin:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	comm, err := rma.Init(ctx, nil)
	if err != nil {
		return err
	}
	defer comm.Close(ctx)
	me, n := comm.Rank(), comm.Size()
	right, left := (me+1)%n, (me+n-1)%n
	msg := func(from int) string { return fmt.Sprintf("hello from rank %02d", from) }

	// MPI style: fence, put, fence.
	win, err := comm.Allocate(ctx, 64, nil)
	if err != nil {
		return err
	}
	t0 := time.Now()
	if err := win.Fence(ctx, rma.ModeNoPrecede); err != nil {
		return err
	}
	if err := win.Put(ctx, []byte(msg(me)), right, 0); err != nil {
		return err
	}
	if err := win.Fence(ctx, rma.ModeNoSucceed); err != nil {
		return err
	}
	fenced := time.Since(t0)
	if got := string(win.Bytes()[:len(msg(left))]); got != msg(left) {
		return fmt.Errorf("fence window holds %q, want %q", got, msg(left))
	}

	// RVMA style: the window expects the left neighbour's message per
	// epoch (its length, which is not this rank's from rank 100 on).
	nwin, err := comm.Allocate(ctx, 64, &rma.WinConfig{Notify: &rma.NotifyConfig{Expect: len(msg(left))}})
	if err != nil {
		return err
	}
	t0 = time.Now()
	if err := nwin.Put(ctx, []byte(msg(me)), right, 0); err != nil {
		return err
	}
	if _, err := nwin.WaitEpoch(ctx); err != nil {
		return err
	}
	notified := time.Since(t0)
	if got := string(nwin.Bytes()[:len(msg(left))]); got != msg(left) {
		return fmt.Errorf("notified window holds %q, want %q", got, msg(left))
	}
	fmt.Printf("rank %d of %d got %q: fence epoch %v, notified epoch %v\n", me, n, msg(left), fenced.Round(time.Microsecond), notified.Round(time.Microsecond))
	if err := nwin.Free(ctx); err != nil {
		return err
	}
	return win.Free(ctx)
}
