// Command overhead is capi/bench/overhead.c in Go, calling rma directly:
// the same loop under the same launcher, so that the two differ only by
// the C API's crossing.
//
//	rvmarun -n 2 --provider shm overhead OP ITERS
package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/rvma/rvma/rma"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: overhead rank|putflush|fopflush ITERS")
		os.Exit(2)
	}
	op := os.Args[1]
	iters, err := strconv.Atoi(os.Args[2])
	check(err)
	ctx := context.Background()
	c, err := rma.Init(ctx, nil)
	check(err)
	if c.Size() != 2 {
		check(fmt.Errorf("run it on 2 ranks"))
	}
	w, err := c.Allocate(ctx, 1<<16, nil)
	check(err)
	if c.Rank() == 0 {
		check(w.LockAll(ctx))
		data, one, old := make([]byte, 8), binary.LittleEndian.AppendUint64(nil, 1), make([]byte, 8)
		var t0 time.Time
		sink := 0
		for i := -iters / 10; i < iters; i++ {
			if i == 0 {
				t0 = time.Now()
			}
			switch op {
			case "rank":
				sink += c.Rank()
			case "putflush":
				check(w.Put(ctx, data, 1, 0))
				check(w.Flush(ctx, 1))
			case "fopflush":
				check(w.FetchAndOp(ctx, one, old, rma.Int64, rma.Sum, 1, 0))
				check(w.Flush(ctx, 1))
			default:
				check(fmt.Errorf("unknown op %s", op))
			}
		}
		ns := float64(time.Since(t0).Nanoseconds()) / float64(iters)
		check(w.UnlockAll(ctx))
		fmt.Printf("%s %d %.1f ns/iteration\n", op, iters, ns)
		_ = sink
	}
	check(c.Barrier(ctx))
	check(w.Free(ctx))
	check(c.Close(ctx))
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
