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

// A notified-window ping-pong, one way per op: rank 0 puts 8 bytes into
// rank 1's per-origin notified window and waits for rank 1's put back.
func BenchmarkNotifiedPingPong(b *testing.B) {
	for _, prov := range []string{"shm", "udp"} {
		b.Run(prov, func(b *testing.B) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			comms, err := NewWorld(ctx, 2, &Config{Provider: prov})
			if err != nil {
				b.Fatal(err)
			}
			defer func() {
				done := make(chan struct{}, 2)
				for _, c := range comms {
					go func() { c.Close(ctx); done <- struct{}{} }()
				}
				<-done
				<-done
			}()
			wins := make([]*Win, 2)
			errs := make(chan error, 2)
			for r, c := range comms {
				go func() {
					var err error
					wins[r], err = c.Allocate(ctx, 64, &WinConfig{Notify: &NotifyConfig{ExpectFrom: map[int]int{1 - r: 8}}})
					errs <- err
				}()
			}
			for range 2 {
				if err := <-errs; err != nil {
					b.Fatal(err)
				}
			}
			data := make([]byte, 8)
			n := b.N
			go func() {
				w := wins[1]
				for range n {
					if _, err := w.WaitEpoch(ctx); err != nil {
						errs <- err
						return
					}
					if err := w.Put(ctx, data, 0, 0); err != nil {
						errs <- err
						return
					}
				}
				errs <- nil
			}()
			b.ReportAllocs()
			b.ResetTimer()
			w := wins[0]
			for range n {
				if err := w.Put(ctx, data, 1, 0); err != nil {
					b.Fatal(err)
				}
				if _, err := w.WaitEpoch(ctx); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			if err := <-errs; err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(2*n), "ns/way")
		})
	}
}

// 64 puts of 8 bytes and one Flush, as MPI's put-rate tests do.
func BenchmarkPutRate(b *testing.B) {
	for _, prov := range []string{"shm", "udp"} {
		b.Run(prov, func(b *testing.B) {
			w, done := benchWorld(b, prov)
			defer done()
			ctx := context.Background()
			data := make([]byte, 8)
			b.SetBytes(64 * 8)
			b.ReportAllocs()
			for b.Loop() {
				for i := range 64 {
					if err := w.Put(ctx, data, 1, 8*i); err != nil {
						b.Fatal(err)
					}
				}
				if err := w.Flush(ctx, 1); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
