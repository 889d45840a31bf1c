package rma

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// The per-operation cost of the API HPC codes call most, two ranks of one
// process on each provider: rank 0 works inside a LockAll epoch, rank 1
// only serves. Compare the providers, and a change against the code before
// it, side by side in one run (benchstat), never against a fixed figure.

// benchWins opens two ranks on prov with a window each (cfg gives rank r's,
// nil meaning a plain 64 KiB window); they are freed and closed when the
// benchmark ends.
func benchWins(b *testing.B, prov string, cfg func(r int) *WinConfig) (context.Context, []*Win) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	comms, err := NewWorld(ctx, 2, &Config{Provider: prov})
	if err != nil {
		cancel()
		b.Fatal(err)
	}
	wins := make([]*Win, 2)
	errs := make(chan error, 2)
	all := func(f func(r int) error) {
		for r := range comms {
			go func() { errs <- f(r) }()
		}
		for range comms {
			if err := <-errs; err != nil {
				b.Error(err)
			}
		}
	}
	b.Cleanup(func() {
		all(func(r int) error {
			if wins[r] != nil {
				wins[r].Free(ctx)
			}
			return comms[r].Close(ctx)
		})
		cancel()
	})
	all(func(r int) (err error) {
		var wc *WinConfig
		if cfg != nil {
			wc = cfg(r)
		}
		wins[r], err = comms[r].Allocate(ctx, 1<<16, wc)
		return err
	})
	if b.Failed() {
		b.FailNow()
	}
	return ctx, wins
}

// lockedWin is rank 0's window of benchWins, inside a LockAll epoch.
func lockedWin(b *testing.B, prov string) *Win {
	ctx, wins := benchWins(b, prov, nil)
	if err := wins[0].LockAll(ctx); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { wins[0].UnlockAll(ctx) })
	return wins[0]
}

func BenchmarkPutFlush(b *testing.B) {
	for _, prov := range []string{"shm", "udp"} {
		b.Run(prov, func(b *testing.B) {
			w := lockedWin(b, prov)
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
			w := lockedWin(b, prov)
			ctx := context.Background()
			res, one := make([]byte, 8), u64(1)
			b.ReportAllocs()
			for b.Loop() {
				if err := w.FetchAndOp(ctx, one, res, Int64, Sum, 1, 0); err != nil {
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
			ctx, wins := benchWins(b, prov, func(r int) *WinConfig {
				return &WinConfig{Notify: &NotifyConfig{ExpectFrom: map[int]int{1 - r: 8}}}
			})
			errs := make(chan error, 1)
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
			w := lockedWin(b, prov)
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

// BenchmarkCheckpoint is what a notified window's epoch costs with a
// snapshot at each (History), and with its replica written to the buddy
// too (Replicate), against none: 2 ranks on shm, a window of the size of
// halo3d's at -n 64 (2.7 MB), one 8-byte put per epoch.
func BenchmarkCheckpoint(b *testing.B) {
	const size = 2700 << 10
	for _, tc := range []struct {
		name string
		nc   NotifyConfig
	}{
		{"none", NotifyConfig{}},
		{"snapshot", NotifyConfig{History: 2}},
		{"replicate", NotifyConfig{History: 2, Replicate: true}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			ctx := context.Background()
			comms, err := NewWorld(ctx, 2, &Config{Provider: "shm"})
			require.NoError(b, err)
			wins := make([]*Win, 2)
			var wg sync.WaitGroup
			for r, c := range comms {
				wg.Add(1)
				go func() {
					defer wg.Done()
					nc := tc.nc
					nc.ExpectFrom = map[int]int{1 - r: 8}
					var err error
					wins[r], err = c.Allocate(ctx, size, &WinConfig{Notify: &nc})
					require.NoError(b, err)
				}()
			}
			wg.Wait()
			b.SetBytes(size)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				require.NoError(b, wins[1].Put(ctx, wins[1].Bytes()[:8], 0, 0))
				_, err := wins[0].WaitEpoch(ctx)
				require.NoError(b, err)
			}
			b.StopTimer()
			for _, c := range comms {
				wg.Add(1)
				go func() { defer wg.Done(); c.Close(ctx) }()
			}
			wg.Wait()
		})
	}
}

// A message ping-pong, one way per op: Send and Recv of 8 bytes between
// two ranks, the path of collectives, PSCW's messages and halo exchanges
// written with messages.
func BenchmarkSendRecv(b *testing.B) {
	for _, prov := range []string{"shm", "udp"} {
		b.Run(prov, func(b *testing.B) {
			_, wins := benchWins(b, prov, nil)
			c0, c1 := wins[0].c, wins[1].c
			ctx := context.Background()
			data := make([]byte, 8)
			n := b.N
			errs := make(chan error, 1)
			go func() {
				for range n {
					if _, err := c1.Recv(ctx, 0, 1); err != nil {
						errs <- err
						return
					}
					if err := c1.Send(ctx, 0, 1, data); err != nil {
						errs <- err
						return
					}
				}
				errs <- nil
			}()
			b.ReportAllocs()
			b.ResetTimer()
			for range n {
				if err := c0.Send(ctx, 1, 1, data); err != nil {
					b.Fatal(err)
				}
				if _, err := c0.Recv(ctx, 1, 1); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			require.NoError(b, <-errs)
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(2*n), "ns/way")
		})
	}
}

// BenchmarkApplyAtomic: accumulating 1 MiB into shared memory, as a
// direct accumulate or the target's engine does, element by element
// atomically (narrow elements a word at a time where the CPU allows).
func BenchmarkApplyAtomic(b *testing.B) {
	for _, c := range []struct {
		op Op
		dt Datatype
	}{{Sum, Int8}, {Bxor, Int32}, {Sum, Int32}, {Sum, Float64}, {Max, Int16}} {
		b.Run(fmt.Sprintf("%v-%v", c.op, c.dt), func(b *testing.B) {
			buf := make([]uint64, 1<<17)
			mem := unsafe.Slice((*byte)(unsafe.Pointer(&buf[0])), 1<<20)
			origin := make([]byte, 1<<20)
			b.SetBytes(1 << 20)
			b.ReportAllocs()
			for b.Loop() {
				applyAtomic(c.op, c.dt, mem, origin, nil)
			}
		})
	}
}

// BenchmarkAccumulateEpoch: rank 0 sends 100000 one-element accumulates to
// rank 1's window over its own memory (active messages the target's engine
// applies) in one fence epoch, as a code accumulating per graph edge does;
// ns/acc is the epoch's time per accumulate.
func BenchmarkAccumulateEpoch(b *testing.B) {
	for _, prov := range []string{"shm", "udp"} {
		b.Run(prov, func(b *testing.B) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			comms, err := NewWorld(ctx, 2, &Config{Provider: prov})
			require.NoError(b, err)
			const n = 100000
			wins := make([]*Win, 2)
			var wg sync.WaitGroup
			both := func(f func(r int)) {
				for r := range comms {
					wg.Add(1)
					go func() { defer wg.Done(); f(r) }()
				}
				wg.Wait()
			}
			both(func(r int) {
				var err error
				wins[r], err = comms[r].Create(ctx, make([]byte, 4*n), nil)
				require.NoError(b, err)
			})
			one := []byte{1, 0, 0, 0}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				both(func(r int) {
					require.NoError(b, wins[r].Fence(ctx, 0))
					if r == 0 {
						for i := range n {
							require.NoError(b, wins[0].Accumulate(ctx, one, Int32, Sum, 1, 4*((i*7919)%n)))
						}
					}
					require.NoError(b, wins[r].Fence(ctx, 0))
				})
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/acc")
			b.StopTimer()
			both(func(r int) {
				wins[r].Free(ctx)
				comms[r].Close(ctx)
			})
		})
	}
}

// 64 notified puts of 8 bytes per epoch into a per-origin notified window,
// the target waiting for each epoch: what a notified put costs the origin
// when it streams (halo exchanges put a face as many runs).
func BenchmarkNotifiedPutRate(b *testing.B) {
	for _, prov := range []string{"shm", "udp"} {
		b.Run(prov, func(b *testing.B) {
			ctx, wins := benchWins(b, prov, func(r int) *WinConfig {
				return &WinConfig{Notify: &NotifyConfig{ExpectFrom: map[int]int{1 - r: 64 * 8}, Depth: 64}}
			})
			errs := make(chan error, 1)
			data := make([]byte, 8)
			n := b.N
			go func() {
				for range n {
					if _, err := wins[1].WaitEpoch(ctx); err != nil {
						errs <- err
						return
					}
				}
				errs <- nil
			}()
			b.SetBytes(64 * 8)
			b.ReportAllocs()
			b.ResetTimer()
			w := wins[0]
			for range n {
				for i := range 64 {
					if err := w.Put(ctx, data, 1, 8*i); err != nil {
						b.Fatal(err)
					}
				}
			}
			if err := <-errs; err != nil {
				b.Fatal(err)
			}
		})
	}
}

// A notified strided put, as a halo exchange's face: 64 rows of 512
// bytes, 1 KiB apart at the target ("rows"), against the same bytes
// contiguous ("contiguous"), both ranks putting one to the other and
// waiting for the other's, an epoch each.
func BenchmarkNotifiedLayoutPut(b *testing.B) {
	for _, prov := range []string{"shm", "udp"} {
		for _, shape := range []struct {
			name string
			tl   Layout
		}{{"rows", Layout{Count: 64, Block: 512, Stride: 1024}}, {"contiguous", Layout{}}} {
			b.Run(prov+"/"+shape.name, func(b *testing.B) {
				ctx, wins := benchWins(b, prov, func(r int) *WinConfig {
					return &WinConfig{Notify: &NotifyConfig{ExpectFrom: map[int]int{1 - r: 64 * 512}}}
				})
				n := b.N
				round := func(r int) error {
					data := make([]byte, 64*512)
					for range n {
						if err := wins[r].PutLayout(ctx, data, Layout{}, 1-r, 0, shape.tl); err != nil {
							return err
						}
						if _, err := wins[r].WaitEpoch(ctx); err != nil {
							return err
						}
					}
					return nil
				}
				errs := make(chan error, 1)
				go func() { errs <- round(1) }()
				b.SetBytes(64 * 512)
				b.ReportAllocs()
				b.ResetTimer()
				if err := round(0); err != nil {
					b.Fatal(err)
				}
				if err := <-errs; err != nil {
					b.Fatal(err)
				}
			})
		}
	}
}
