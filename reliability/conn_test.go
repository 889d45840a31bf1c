package reliability

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/verbs"
)

var fabricSeq atomic.Uint64

type end struct {
	dev  *verbs.Device
	pd   *verbs.PD
	cq   *verbs.CQ
	qp   *verbs.QP
	conn *Conn
}

// pair connects two Conns over loop devices with a 4 KiB MTU; faults
// apply to both directions.
func pair(t testing.TB, faults verbs.Faults, ca, cb Config) (a, b *end) {
	name := fmt.Sprintf("rel-%d", fabricSeq.Add(1))
	mk := func(cfg Config) *end {
		e := &end{}
		var err error
		e.dev, err = verbs.Open(context.Background(), "loop://"+name+"?mtu=4096", nil)
		require.NoError(t, err)
		e.pd, err = e.dev.AllocPD()
		require.NoError(t, err)
		e.cq, err = e.dev.CreateCQ(verbs.CQConfig{Capacity: 16384})
		require.NoError(t, err)
		e.qp, err = e.pd.CreateQP(QPConfig(e.cq, cfg))
		require.NoError(t, err)
		return e
	}
	a, b = mk(ca), mk(cb)
	require.NoError(t, a.qp.Connect(b.qp.Endpoint(), nil))
	require.NoError(t, b.qp.Connect(a.qp.Endpoint(), nil))
	if faults.Active() {
		fa, fb := faults, faults
		fb.Seed = faults.Seed + 1000
		require.NoError(t, a.dev.SetFaults(-1, fa))
		require.NoError(t, b.dev.SetFaults(-1, fb))
	}
	var err error
	a.conn, err = New(a.pd, a.qp, a.cq, ca)
	require.NoError(t, err)
	b.conn, err = New(b.pd, b.qp, b.cq, cb)
	require.NoError(t, err)
	t.Cleanup(func() {
		a.conn.Close()
		b.conn.Close()
		a.dev.Close()
		b.dev.Close()
	})
	return a, b
}

func payload(n int, seed uint64) []byte {
	b := make([]byte, n)
	rng := rand.New(rand.NewPCG(seed, 7))
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// transfer sends msgs from a to b, with receives posted as the slots
// allow, and checks every byte.
func transfer(t *testing.T, a, b *end, sizes []int, opt *SendOptions) []SendResult {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	bufs := make([][]byte, len(sizes))
	errc := make(chan error, 1)
	recvs := make(chan *Recv, len(sizes))
	go func() {
		for i, n := range sizes {
			bufs[i] = make([]byte, n)
			r, err := b.conn.Post(ctx, bufs[i])
			if err != nil {
				errc <- err
				return
			}
			recvs <- r
		}
		errc <- nil
	}()
	var sends []*Send
	var want [][]byte
	for i, n := range sizes {
		data := payload(n, uint64(i+1))
		want = append(want, data)
		s, err := a.conn.Send(ctx, data, opt)
		require.NoError(t, err)
		sends = append(sends, s)
	}
	var res []SendResult
	for _, s := range sends {
		r, err := s.Wait(ctx)
		require.NoError(t, err)
		res = append(res, r)
	}
	require.NoError(t, <-errc)
	for i := range sizes {
		r := <-recvs
		require.NoError(t, r.Wait(ctx))
		require.True(t, r.Bitmap().Full())
		require.True(t, bytes.Equal(want[i], bufs[i]), "message %d differs", i)
	}
	return res
}

func TestTransferClean(t *testing.T) {
	for _, scheme := range []Scheme{SR, EC} {
		t.Run(scheme.String(), func(t *testing.T) {
			a, b := pair(t, verbs.Faults{}, Config{Scheme: scheme, M: 4}, Config{})
			res := transfer(t, a, b, []int{1, 4096, 4097, 100000, 1 << 20, 3<<20 + 5}, nil)
			for _, r := range res {
				require.Equal(t, scheme, r.Scheme)
				require.Zero(t, r.Decoded) // nothing was lost
			}
		})
	}
}

// Seeded loss, bursts, reordering and duplication: every byte arrives,
// whatever the scheme.
func TestTransferFaults(t *testing.T) {
	cases := []struct {
		name   string
		faults verbs.Faults
	}{
		{"loss 1%", verbs.Faults{Drop: 0.01, Seed: 1}},
		{"loss 5%", verbs.Faults{Drop: 0.05, Seed: 2}},
		{"loss 20%", verbs.Faults{Drop: 0.2, Seed: 3}},
		{"bursts", verbs.Faults{BurstEnter: 0.005, BurstExit: 0.2, Seed: 4}},
		{"reorder", verbs.Faults{Reorder: 0.05, Seed: 5}},
		{"duplicate", verbs.Faults{Duplicate: 0.05, Seed: 6}},
		{"all", verbs.Faults{Drop: 0.02, Reorder: 0.02, Duplicate: 0.02, Jitter: 200 * time.Microsecond, Seed: 7}},
	}
	for _, tc := range cases {
		for _, scheme := range []Scheme{SR, EC, Auto} {
			t.Run(tc.name+"/"+scheme.String(), func(t *testing.T) {
				a, b := pair(t, tc.faults, Config{Scheme: scheme, RTT: 2 * time.Millisecond}, Config{})
				sizes := []int{1 << 20, 300000, 2<<20 + 3, 5000, 1 << 20}
				if raceEnabled {
					sizes = []int{256 << 10, 100000, 5000}
				}
				transfer(t, a, b, sizes, nil)
			})
		}
	}
}
