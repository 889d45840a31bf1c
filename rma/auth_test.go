package rma

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/verbs"
	"github.com/rvma/rvma/verbs/cm"
)

// An outsider on the host (a process without the job's key) dials a
// rank's connection manager claiming to be rank 0, with no key and with
// a guessed one, and holds silent connections to every rank's listener.
// Each dial is refused, and the job runs to the right result meanwhile.
func TestOutsiderCannotJoin(t *testing.T) {
	for _, prov := range []string{"loop", "udp"} {
		t.Run(prov, func(t *testing.T) {
			comms := newWorld(t, 3, &Config{Provider: prov})
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			dev, err := verbs.Open(ctx, "loop://outsider-"+t.Name(), nil)
			require.NoError(t, err)
			defer dev.Close()
			pd, err := dev.AllocPD()
			require.NoError(t, err)
			cq, err := dev.CreateCQ(verbs.CQConfig{})
			require.NoError(t, err)
			for r, c := range comms {
				addr, err := c.store.Get(ctx, fmt.Sprintf("rvma-cm-%d", r))
				require.NoError(t, err)
				for range 20 {
					s, err := net.Dial("tcp", addr)
					require.NoError(t, err)
					defer s.Close()
				}
				var me [4]byte
				binary.BigEndian.PutUint32(me[:], 0) // "I am rank 0"
				for _, key := range [][]byte{nil, []byte("a guessed key, 32 bytes long....")} {
					qp, err := pd.CreateQP(verbs.QPConfig{Type: verbs.RC, SendCQ: cq})
					require.NoError(t, err)
					_, err = cm.Dial(ctx, addr, qp, &cm.Config{PrivateData: me[:], Key: key})
					require.ErrorIs(t, err, cm.ErrRejected, "rank %d accepted an outsider (key %q)", r, key)
					require.ErrorContains(t, err, "authentication failed")
					require.NotEqual(t, verbs.StateReadyToSend, qp.State())
				}
			}
			each(t, comms, func(ctx context.Context, c *Comm) error {
				w, err := c.Allocate(ctx, 64, nil)
				if err != nil {
					return err
				}
				if err := w.Fence(ctx, 0); err != nil {
					return err
				}
				n := c.Size()
				if err := w.Put(ctx, u64(uint64(100+c.Rank())), (c.Rank()+1)%n, 0); err != nil {
					return err
				}
				if err := w.Fence(ctx, 0); err != nil {
					return err
				}
				if got, want := binary.LittleEndian.Uint64(w.Bytes()), uint64(100+(c.Rank()+n-1)%n); got != want {
					return fmt.Errorf("window holds %d, want %d", got, want)
				}
				return w.Free(ctx)
			})
		})
	}
}
