package rma

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/internal/lockcheck"
)

// On shm, the operations into a window of this host are made by the
// origin through the mapping: right values, and nothing allocated per
// operation.
func TestDirectNoAlloc(t *testing.T) {
	comms := newWorld(t, 2, &Config{Provider: "shm"})
	wins := make([]*Win, 2)
	each(t, comms, func(ctx context.Context, c *Comm) (err error) {
		wins[c.Rank()], err = c.Allocate(ctx, 4096, nil)
		return err
	})
	ctx := context.Background()
	w := wins[0]
	require.NoError(t, w.LockAll(ctx))
	data, one, res, cmp := u64(7), u64(1), make([]byte, 8), make([]byte, 8)
	half := binary.LittleEndian.AppendUint64(nil, math.Float64bits(0.5))
	small := []byte{1, 0, 2, 0, 3, 0, 4, 0} // four Int16
	got := make([]byte, 8)
	ops := []struct {
		name string
		do   func() error
	}{
		{"put+flush", func() error {
			if err := w.Put(ctx, data, 1, 0); err != nil {
				return err
			}
			return w.Flush(ctx, 1)
		}},
		{"get+flush", func() error {
			if err := w.Get(ctx, got, 1, 0); err != nil {
				return err
			}
			return w.Flush(ctx, 1)
		}},
		{"fetch_and_op", func() error { return w.FetchAndOp(ctx, one, res, Int64, Sum, 1, 8) }},
		{"compare_and_swap", func() error { return w.CompareAndSwap(ctx, one, cmp, res, Uint64, 1, 16) }},
		{"accumulate int16", func() error { return w.Accumulate(ctx, small, Int16, Sum, 1, 24) }},
		{"get_accumulate float64", func() error {
			return w.GetAccumulate(ctx, half, res, Float64, Sum, 1, 32)
		}},
		{"rput", func() error {
			r, err := w.Rput(ctx, data, 1, 40)
			if err != nil {
				return err
			}
			return r.Wait(ctx)
		}},
	}
	for _, op := range ops {
		allocs := testing.AllocsPerRun(50, func() { require.NoError(t, op.do()) })
		if !lockcheck.Enabled { // the debug build's lock records allocate
			require.Zero(t, allocs, op.name)
		}
	}
	require.Equal(t, uint32(directMapped), w.direct[1].state.Load(), "the target's window is mapped")
	require.NoError(t, w.Flush(ctx, 1))
	mem := wins[1].Bytes()
	require.Equal(t, uint64(7), binary.LittleEndian.Uint64(mem[0:]))
	require.Equal(t, uint64(7), binary.LittleEndian.Uint64(got))
	require.Equal(t, uint64(51), binary.LittleEndian.Uint64(mem[8:]), "50 increments and the warm-up call")
	require.Equal(t, uint64(1), binary.LittleEndian.Uint64(mem[16:]), "swapped once, then the compare fails")
	for i, v := range []uint16{1, 2, 3, 4} {
		require.Equal(t, 51*v, binary.LittleEndian.Uint16(mem[24+2*i:]))
	}
	require.Equal(t, 25.5, math.Float64frombits(binary.LittleEndian.Uint64(mem[32:])))
	require.NoError(t, w.UnlockAll(ctx))
	each(t, comms, func(ctx context.Context, c *Comm) error { return wins[c.Rank()].Free(ctx) })
}

// Every rank updates rank 0's counters at once, each counter with a
// different kind of atomic: the CPU's on a mapped window (shm), the NIC's,
// and the target's engine (unaligned elements, other types) must all be
// atomic with each other, and a fetch-and-add hands out every value once.
func TestAtomicsAgree(t *testing.T) {
	const n = 200
	for _, prov := range []string{"loop", "udp", "shm", "auto"} {
		t.Run(prov, func(t *testing.T) {
			comms := newWorld(t, 4, &Config{Provider: prov})
			size := len(comms)
			tickets := make([][]uint64, size)
			var final []byte
			each(t, comms, func(ctx context.Context, c *Comm) error {
				w, err := c.Allocate(ctx, 128, nil)
				if err != nil {
					return err
				}
				if err := w.LockAll(ctx); err != nil {
					return err
				}
				res, cas := make([]byte, 8), make([]byte, 8)
				for range n {
					// A ticket: fetch-and-add of 8 bytes.
					if err := w.FetchAndOp(ctx, u64(1), res, Int64, Sum, 0, 0); err != nil {
						return err
					}
					if err := w.Flush(ctx, 0); err != nil {
						return err
					}
					tickets[c.Rank()] = append(tickets[c.Rank()], binary.LittleEndian.Uint64(res))
					// Int32 and Int16 sums, a Float64 sum, and an unaligned Int64.
					if err := w.Accumulate(ctx, []byte{1, 0, 0, 0}, Int32, Sum, 0, 8); err != nil {
						return err
					}
					if err := w.Accumulate(ctx, []byte{1, 0}, Int16, Sum, 0, 14); err != nil {
						return err
					}
					if err := w.Accumulate(ctx, binary.LittleEndian.AppendUint64(nil, math.Float64bits(1)), Float64, Sum, 0, 16); err != nil {
						return err
					}
					if err := w.Accumulate(ctx, u64(1), Int64, Sum, 0, 25); err != nil {
						return err
					}
					// A compare-and-swap increment, retried until it wins.
					for cur := uint64(0); ; {
						if err := w.CompareAndSwap(ctx, u64(cur+1), u64(cur), cas, Uint64, 0, 40); err != nil {
							return err
						}
						if err := w.Flush(ctx, 0); err != nil {
							return err
						}
						old := binary.LittleEndian.Uint64(cas)
						if old == cur {
							break
						}
						cur = old
					}
				}
				if err := w.UnlockAll(ctx); err != nil {
					return err
				}
				if err := c.Barrier(ctx); err != nil {
					return err
				}
				if c.Rank() == 0 {
					final = slices.Clone(w.Bytes())
				}
				return w.Free(ctx)
			})
			total := uint64(size * n)
			require.Equal(t, total, binary.LittleEndian.Uint64(final[0:]))
			require.Equal(t, uint32(total), binary.LittleEndian.Uint32(final[8:]))
			require.Equal(t, uint16(total), binary.LittleEndian.Uint16(final[14:]))
			require.Equal(t, float64(total), math.Float64frombits(binary.LittleEndian.Uint64(final[16:])))
			require.Equal(t, total, binary.LittleEndian.Uint64(final[25:]))
			require.Equal(t, total, binary.LittleEndian.Uint64(final[40:]))
			all := slices.Concat(tickets...)
			slices.Sort(all)
			for i, v := range all {
				require.Equal(t, uint64(i), v, fmt.Sprintf("ticket %d", i))
			}
		})
	}
}

// TestCarrierChoice: each window reaches each peer through the carrier
// that how the peer is reached calls for, chosen once: a window of this
// host from Allocate is mapped (shm), caller memory and a rank's own
// window take the RC connection, and with several paths large transfers
// go over them in front of either. Puts and gets through every carrier
// move the right bytes, and Recover's forgetting makes the next access
// choose again.
func TestCarrierChoice(t *testing.T) {
	type kind = string
	name := func(c carrier) kind {
		switch c := c.(type) {
		case *directCarrier:
			return "direct"
		case *rcCarrier:
			return "rc"
		case *pathsCarrier:
			return "paths(" + fmt.Sprintf("%T", c.near)[len("*rma."):] + ")"
		}
		return fmt.Sprintf("%T", c)
	}
	for _, tc := range []struct {
		provider string
		paths    int
		create   bool
		want     [2]kind // towards rank 0 (itself) and rank 1, from rank 0
	}{
		{"shm", 1, false, [2]kind{"rc", "direct"}},
		{"shm", 1, true, [2]kind{"rc", "rc"}},
		{"udp", 1, false, [2]kind{"rc", "rc"}},
		{"loop", 2, false, [2]kind{"rc", "paths(rcCarrier)"}},
	} {
		t.Run(fmt.Sprintf("%s/paths%d/create%v", tc.provider, tc.paths, tc.create), func(t *testing.T) {
			cfg := &Config{Provider: tc.provider, Paths: tc.paths}
			if tc.paths > 1 {
				cfg.Multipath.Small = 4096
			}
			comms := newWorld(t, 2, cfg)
			wins := make([]*Win, 2)
			const size = 1 << 16
			each(t, comms, func(ctx context.Context, c *Comm) (err error) {
				if tc.create {
					wins[c.Rank()], err = c.Create(ctx, make([]byte, size), nil)
				} else {
					wins[c.Rank()], err = c.Allocate(ctx, size, nil)
				}
				return err
			})
			ctx := context.Background()
			w := wins[0]
			require.NoError(t, w.LockAll(ctx))
			for target := range 2 {
				for _, n := range []int{8, 300, 8192} {
					data := make([]byte, n)
					for i := range data {
						data[i] = byte(i*7 + n + target)
					}
					require.NoError(t, w.Put(ctx, data, target, 100))
					require.NoError(t, w.Flush(ctx, target))
					got := make([]byte, n)
					require.NoError(t, w.Get(ctx, got, target, 100))
					require.NoError(t, w.Flush(ctx, target))
					require.Equal(t, data, got, "target %d, %d bytes", target, n)
				}
				c := w.carrier(ctx, target)
				require.Equal(t, tc.want[target], name(c), "target %d", target)
				require.Same(t, c, w.carrier(ctx, target), "chosen once")
			}
			require.NoError(t, w.UnlockAll(ctx))
			w.forgetCarriers([]bool{false, true})
			require.Nil(t, w.carriers[1].Load())
			require.NotNil(t, w.carriers[0].Load())
		})
	}
}

// TestGatheredGets: strided gets of small blocks from a window reached
// through the NIC travel as one message the target packs; the blocks land
// in order, also when the origin is strided too (then as READs), and a
// get past the window is refused before anything moves.
func TestGatheredGets(t *testing.T) {
	for _, provider := range []string{"loop", "udp", "shm"} {
		t.Run(provider, func(t *testing.T) {
			comms := newWorld(t, 2, &Config{Provider: provider})
			const n = 200 // a n x n matrix of int32
			mem := make([]byte, 4*n*n)
			for i := range n * n {
				binary.LittleEndian.PutUint32(mem[4*i:], uint32(i))
			}
			wins := make([]*Win, 2)
			each(t, comms, func(ctx context.Context, c *Comm) (err error) {
				b := make([]byte, 4*n*n)
				if c.Rank() == 1 {
					b = mem
				}
				wins[c.Rank()], err = c.Create(ctx, b, nil)
				return err
			})
			ctx := context.Background()
			w := wins[0]
			require.NoError(t, w.LockAll(ctx))
			got := make([]byte, 4*n*n)
			col := Layout{Count: n, Block: 4, Stride: 4 * n}
			for j := range n {
				_, err := w.RgetLayout(ctx, got[4*n*j:4*n*(j+1)], Layout{}, 1, 4*j, col)
				require.NoError(t, err)
			}
			// Strided on both sides: a column into a column.
			back := make([]byte, 4*n*n)
			_, err := w.RgetLayout(ctx, back, col, 1, 4*3, col)
			require.NoError(t, err)
			_, err = w.RgetLayout(ctx, got[:4*n], Layout{}, 1, 4*n*n-8, col)
			require.ErrorIs(t, err, ErrOutOfBounds)
			require.NoError(t, w.FlushAll(ctx))
			for j := range n {
				for i := range n {
					require.Equal(t, uint32(i*n+j), binary.LittleEndian.Uint32(got[4*(n*j+i):]), "column %d row %d", j, i)
				}
			}
			for i := range n {
				require.Equal(t, uint32(i*n+3), binary.LittleEndian.Uint32(back[4*n*i:]), "row %d", i)
			}
			require.NoError(t, w.UnlockAll(ctx))
		})
	}
}

// TestNotifiedPutNoAlloc: on shm, a put into a notified window the
// target shares, strided (a halo's face: 64 rows) or contiguous, is placed
// by the origin with nothing allocated per put (the requests' path built
// a request per row, and allocated for them); the target's epoch holds
// its bytes.
func TestNotifiedPutNoAlloc(t *testing.T) {
	const rows, block, stride = 64, 512, 1024
	comms := newWorld(t, 2, &Config{Provider: "shm"})
	wins := make([]*Win, 2)
	each(t, comms, func(ctx context.Context, c *Comm) (err error) {
		wins[c.Rank()], err = c.Allocate(ctx, rows*stride, &WinConfig{Notify: &NotifyConfig{ExpectFrom: map[int]int{1 - c.Rank(): rows * block}}})
		return err
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	data := make([]byte, rows*block)
	for _, tl := range []Layout{{Count: rows, Block: block, Stride: stride}, {}} {
		round := byte(0)
		allocs := testing.AllocsPerRun(100, func() {
			round++
			for i := range data {
				data[i] = round + byte(i/block)
			}
			require.NoError(t, wins[0].PutLayout(ctx, data, Layout{}, 1, 0, tl))
			_, err := wins[1].WaitEpoch(ctx)
			require.NoError(t, err)
		})
		if !lockcheck.Enabled && !raceEnabled { // lock records allocate; the race detector's pools drop
			require.Zero(t, allocs, "layout %+v", tl)
		}
		got := wins[1].Bytes()
		if tl.Count == 0 {
			require.Equal(t, data, got[:len(data)])
			continue
		}
		for r := range rows {
			require.Equal(t, data[r*block:(r+1)*block], got[r*stride:r*stride+block], "row %d", r)
		}
	}
}
