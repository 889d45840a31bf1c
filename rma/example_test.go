package rma_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"

	"github.com/rvma/rvma/rma"
)

// Four ranks in one process each put their rank into a slot of rank 0's
// window between two fences, as an MPI program would.
func Example_fence() {
	ctx := context.Background()
	comms, _ := rma.NewWorld(ctx, 4, nil)
	var wg sync.WaitGroup
	for _, c := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close(ctx)
			win, _ := c.Allocate(ctx, 8*c.Size(), &rma.WinConfig{DispUnit: 8})
			win.Fence(ctx, rma.ModeNoPrecede)
			me := binary.LittleEndian.AppendUint64(nil, uint64(c.Rank()*10))
			win.Put(ctx, me, 0, c.Rank())
			win.Fence(ctx, rma.ModeNoSucceed)
			if c.Rank() == 0 {
				for r := range c.Size() {
					fmt.Print(binary.LittleEndian.Uint64(win.Bytes()[8*r:]), " ")
				}
				fmt.Println()
			}
			win.Free(ctx)
		}()
	}
	wg.Wait()
	// Output: 0 10 20 30
}

// A notified window: rank 1 expects 5 bytes from rank 0 per epoch and
// learns they arrived by waiting on the window; rank 0 needs no fence and
// sends no message.
func Example_notified() {
	ctx := context.Background()
	comms, _ := rma.NewWorld(ctx, 2, nil)
	var wg sync.WaitGroup
	for _, c := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close(ctx)
			win, _ := c.Allocate(ctx, 16, &rma.WinConfig{Notify: &rma.NotifyConfig{ExpectFrom: map[int]int{0: 5}}})
			switch c.Rank() {
			case 0:
				win.Put(ctx, []byte("hello"), 1, 0)
				win.FlushAll(ctx)
			case 1:
				epoch, _ := win.WaitEpoch(ctx)
				fmt.Printf("epoch %d: %s\n", epoch, win.Bytes()[:5])
			}
			win.Free(ctx)
		}()
	}
	wg.Wait()
	// Output: epoch 1: hello
}

// A shared counter: every rank adds to rank 0's counter with the NIC's
// fetch-and-add under a shared lock, and gets a distinct ticket.
func Example_fetchAndOp() {
	ctx := context.Background()
	comms, _ := rma.NewWorld(ctx, 3, nil)
	var wg sync.WaitGroup
	tickets := make([]uint64, 3)
	for _, c := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close(ctx)
			win, _ := c.Allocate(ctx, 8, nil)
			c.Barrier(ctx) // serialise the ranks so the tickets are predictable
			for r := range c.Size() {
				if r == c.Rank() {
					one, old := binary.LittleEndian.AppendUint64(nil, 1), make([]byte, 8)
					win.Lock(ctx, rma.LockShared, 0)
					win.FetchAndOp(ctx, one, old, rma.Int64, rma.Sum, 0, 0)
					win.Unlock(ctx, 0)
					tickets[c.Rank()] = binary.LittleEndian.Uint64(old)
				}
				c.Barrier(ctx)
			}
			win.Free(ctx)
		}()
	}
	wg.Wait()
	fmt.Println(tickets)
	// Output: [0 1 2]
}
