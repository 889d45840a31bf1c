package verbs

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// Regions registered and deregistered in any order resolve by their keys
// while registered, from whichever shard holds them, and not after.
func TestKeyShards(t *testing.T) {
	dev, err := Open(context.Background(), "loop://key-shards", nil)
	require.NoError(t, err)
	defer dev.Close()
	pd, err := dev.AllocPD()
	require.NoError(t, err)
	const n = 4 * keyShardN
	mrs := make([]*MR, n)
	for i := range mrs {
		mrs[i], err = pd.RegisterMR(make([]byte, 64), AccessLocalWrite|AccessRemoteWrite|AccessRemoteRead)
		require.NoError(t, err)
	}
	for i, mr := range mrs {
		if i%3 == 0 {
			require.NoError(t, mr.Deregister())
		}
	}
	for i, mr := range mrs {
		b, st := pd.resolveLocal(mr.SGE(8, 8), AccessLocalWrite)
		got, _, ok := pd.resolveRemote(mr.RKey(), mr.Addr()+8, 8, AccessRemoteWrite)
		if i%3 == 0 {
			require.Equal(t, StatusLocalProtectionError, st, "region %d, deregistered", i)
			require.False(t, ok, "region %d, deregistered", i)
			continue
		}
		require.Equal(t, StatusSuccess, st, "region %d", i)
		require.Len(t, b, 8)
		require.True(t, ok, "region %d", i)
		require.Same(t, mr, got)
	}
}

// BenchmarkRegisterChurn registers and deregisters a region while a
// thousand others stay registered: what a registration cache that
// evicts one region for each new one costs.
func BenchmarkRegisterChurn(b *testing.B) {
	dev, err := Open(context.Background(), "loop://key-churn", nil)
	require.NoError(b, err)
	defer dev.Close()
	pd, err := dev.AllocPD()
	require.NoError(b, err)
	for range 1024 {
		_, err := pd.RegisterMR(make([]byte, 64), AccessLocalWrite)
		require.NoError(b, err)
	}
	buf := make([]byte, 64)
	b.ReportAllocs()
	for b.Loop() {
		mr, err := pd.RegisterMR(buf, AccessLocalWrite)
		if err != nil {
			b.Fatal(err)
		}
		mr.Deregister()
	}
}
