package rma

import (
	"context"
	"testing"
	"time"
)

// The per-operation cost of the API HPC codes call most, two ranks of one
// process on each provider: rank 0 works inside a LockAll epoch, rank 1
// only serves. Compare the providers, and a change against the code before
// it, side by side in one run (benchstat), never against a fixed figure.

func benchWorld(b *testing.B, prov string) (*Win, func()) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	comms, err := NewWorld(ctx, 2, &Config{Provider: prov})
	if err != nil {
		b.Fatal(err)
	}
	wins := make([]*Win, 2)
	errs := make(chan error, 2)
	for r, c := range comms {
		go func() {
			var err error
			wins[r], err = c.Allocate(ctx, 1<<16, nil)
			errs <- err
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
	}
	if err := wins[0].LockAll(ctx); err != nil {
		b.Fatal(err)
	}
	return wins[0], func() {
		wins[0].UnlockAll(ctx)
		for r, c := range comms {
			go func() { errs <- wins[r].Free(ctx) }()
			_ = c
		}
		<-errs
		<-errs
		for _, c := range comms {
			go func() { c.Close(ctx) }()
		}
		cancel()
	}
}

func BenchmarkPutFlush(b *testing.B) {
	for _, prov := range []string{"shm", "udp"} {
		b.Run(prov, func(b *testing.B) {
			w, done := benchWorld(b, prov)
			defer done()
			ctx := context.Background()
			data := make([]byte, 8)
			b.SetBytes(8)
			b.ReportAllocs()
			for b.Loop() {
				if err := w.Put(ctx, data, 1, 0); err != nil {
					b.Fatal(err)
				}
				if err := w.Flush(ctx, 1); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkFetchAndOp(b *testing.B) {
	for _, prov := range []string{"shm", "udp"} {
		b.Run(prov, func(b *testing.B) {
			w, done := benchWorld(b, prov)
			defer done()
			ctx := context.Background()
			res := make([]byte, 8)
			b.ReportAllocs()
			for b.Loop() {
				if err := w.FetchAndOp(ctx, u64(1), res, Int64, Sum, 1, 0); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
