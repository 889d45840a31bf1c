package verbs_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/verbs"
)

// Endpoint reads what Reset chooses anew (the first PSN, the secret, the
// MAC key), so it takes the QP's lock: the race detector catches a read
// without it.
func TestEndpointDuringReset(t *testing.T) {
	d, err := verbs.Open(context.Background(), "loop://"+t.Name(), nil)
	require.NoError(t, err)
	defer d.Close()
	pd, err := d.AllocPD()
	require.NoError(t, err)
	cq, err := d.CreateCQ(verbs.CQConfig{})
	require.NoError(t, err)
	qp, err := pd.CreateQP(verbs.QPConfig{SendCQ: cq})
	require.NoError(t, err)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range 100 {
			qp.Reset()
		}
	}()
	for range 100 {
		require.NotZero(t, qp.Endpoint().Secret)
	}
	wg.Wait()
}
