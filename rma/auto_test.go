//go:build linux

package rma

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestAutoProvider: under "auto", ranks of one host connect through
// shared memory and the others through UDP, in one world, and every kind
// of operation works across both; "udp" and "shm" force one provider.
func TestAutoProvider(t *testing.T) {
	require.NotEmpty(t, hostIdentity(), "Linux has a boot id")
	for _, tc := range []struct {
		name     string
		cfg      Config
		want     [4][4]string // want[r][peer]
		directTo int          // rank 0's direct operations go to this peer (-1: none)
	}{
		{"auto two hosts", Config{Provider: "auto", Hosts: []string{"a", "a", "b", "b"}},
			grid("shm", "udp", [2]int{0, 1}, [2]int{2, 3}), 1},
		{"auto one host", Config{Provider: "auto"}, grid("shm", "", [2]int{0, 3}, [2]int{0, 3}), 1},
		{"forced udp", Config{Provider: "udp", Hosts: []string{"a", "a", "a", "a"}}, grid("udp", "udp", [2]int{0, 3}, [2]int{0, 3}), -1},
		{"forced shm", Config{Provider: "shm"}, grid("shm", "shm", [2]int{0, 3}, [2]int{0, 3}), 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const n, size = 4, 64 << 10
			comms := newWorld(t, n, &tc.cfg)
			each(t, comms, func(ctx context.Context, c *Comm) error {
				w, err := c.Allocate(ctx, n*size+8, nil)
				if err != nil {
					return err
				}
				if err := w.Fence(ctx, 0); err != nil {
					return err
				}
				for p := range n {
					data := bytes.Repeat([]byte{byte(10*c.Rank() + p + 1)}, size)
					if err := w.Put(ctx, data, p, c.Rank()*size); err != nil {
						return err
					}
					one := binary.LittleEndian.AppendUint64(nil, 1)
					if err := w.Accumulate(ctx, one, Int64, Sum, p, n*size); err != nil {
						return err
					}
				}
				if err := w.Fence(ctx, 0); err != nil {
					return err
				}
				for p := range n {
					want := bytes.Repeat([]byte{byte(10*p + c.Rank() + 1)}, size)
					if !bytes.Equal(want, w.Bytes()[p*size:(p+1)*size]) {
						return fmt.Errorf("rank %d: rank %d's put is wrong", c.Rank(), p)
					}
					got := make([]byte, size)
					if err := w.Get(ctx, got, p, c.Rank()*size); err != nil {
						return err
					}
					if err := w.Fence(ctx, 0); err != nil {
						return err
					}
					if !bytes.Equal(bytes.Repeat([]byte{byte(10*c.Rank() + p + 1)}, size), got) {
						return fmt.Errorf("rank %d: get from %d is wrong", c.Rank(), p)
					}
				}
				if got := binary.LittleEndian.Uint64(w.Bytes()[n*size:]); got != n {
					return fmt.Errorf("rank %d: %d accumulates arrived, want %d", c.Rank(), got, n)
				}
				for p := range n {
					if p != c.Rank() {
						if got := c.Transport(p); got != tc.want[c.Rank()][p] {
							return fmt.Errorf("rank %d to %d over %q, want %q", c.Rank(), p, got, tc.want[c.Rank()][p])
						}
					}
				}
				return w.Free(ctx)
			})
			if tc.directTo >= 0 {
				require.NotZero(t, comms[0].Device().Stats().Direct, "puts and gets to a rank of the host are one copy")
			} else {
				require.Zero(t, comms[0].Device().Stats().Direct)
			}
		})
	}
}

// grid is the provider of each pair: same for ranks within the two
// groups [lo, hi], other across them.
func grid(same, other string, g1, g2 [2]int) (w [4][4]string) {
	in := func(r int, g [2]int) bool { return r >= g[0] && r <= g[1] }
	for r := range 4 {
		for p := range 4 {
			if in(r, g1) && in(p, g1) || in(r, g2) && in(p, g2) {
				w[r][p] = same
			} else {
				w[r][p] = other
			}
		}
	}
	return w
}
