package reliability

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/verbs"
)

// pairPaths connects two Conns over n paths (GIDs 0..n-1 of loop devices,
// path i to path i); faults[i] apply to the sender's path i.
func pairPaths(t testing.TB, n int, faults []verbs.Faults, ca, cb Config) (a, b *end) {
	name := fmt.Sprintf("relp-%d", fabricSeq.Add(1))
	mk := func(cfg Config) (*end, []*verbs.QP) {
		e := &end{}
		var err error
		e.dev, err = verbs.Open(context.Background(), fmt.Sprintf("loop://%s?mtu=4096&gids=%d", name, n), nil)
		require.NoError(t, err)
		e.pd, err = e.dev.AllocPD()
		require.NoError(t, err)
		e.cq, err = e.dev.CreateCQ(verbs.CQConfig{Capacity: 4 * n * DefaultRecvDepth})
		require.NoError(t, err)
		var qps []*verbs.QP
		for i := range n {
			qc := QPConfig(e.cq, cfg)
			qc.GID = i
			qp, err := e.pd.CreateQP(qc)
			require.NoError(t, err)
			qps = append(qps, qp)
		}
		return e, qps
	}
	a, qa := mk(ca)
	b, qb := mk(cb)
	for i := range n {
		require.NoError(t, qa[i].Connect(qb[i].Endpoint(), nil))
		require.NoError(t, qb[i].Connect(qa[i].Endpoint(), nil))
	}
	for i, f := range faults {
		require.NoError(t, a.dev.SetFaults(i, f))
	}
	var err error
	a.conn, err = NewPaths(a.pd, qa, a.cq, ca)
	require.NoError(t, err)
	b.conn, err = NewPaths(b.pd, qb, b.cq, cb)
	require.NoError(t, err)
	t.Cleanup(func() {
		a.conn.Close()
		b.conn.Close()
		a.dev.Close()
		b.dev.Close()
	})
	return a, b
}

// Messages spread over three paths, one of them lossy, arrive byte-exact
// by either scheme; each path carries chunks, the fastest the most.
func TestTransferOverPaths(t *testing.T) {
	for _, scheme := range []Scheme{SR, EC} {
		t.Run(scheme.String(), func(t *testing.T) {
			rates := []float64{50e6, 50e6, 200e6}
			a, b := pairPaths(t, 3, []verbs.Faults{{}, {Drop: 0.05, Seed: 5}, {}},
				Config{Scheme: scheme, M: 4, PathRates: rates}, Config{})
			transfer(t, a, b, []int{4097, 1 << 20, 3<<20 + 5}, nil)
			pb := a.conn.PathBytes()
			require.Len(t, pb, 3)
			for i, n := range pb {
				require.Positive(t, n, "path %d carried nothing", i)
			}
			require.Greater(t, pb[2], pb[0], "the 4x faster path carried less: %v", pb)
			require.Zero(t, b.conn.PathBytes()[1], "the receiver sent chunks")
		})
	}
}

func TestPathsConfigErrors(t *testing.T) {
	_, err := NewPaths(nil, nil, nil, Config{})
	require.ErrorIs(t, err, ErrConfig)
	c := Config{Rate: 3, PathRates: []float64{1, 2}}
	require.ErrorIs(t, c.setPathRates(3), ErrConfig)
	c = Config{PathRates: []float64{1, 0}}
	require.ErrorIs(t, c.setPathRates(2), ErrConfig)
	c = Config{PathRates: []float64{1, 2}}
	require.NoError(t, c.setPathRates(2))
	require.Equal(t, 3.0, c.Rate)
	c = Config{Rate: 4}
	require.NoError(t, c.setPathRates(2))
	require.Equal(t, []float64{2, 2}, c.PathRates)
}
