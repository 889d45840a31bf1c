package main

import (
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestParse(t *testing.T) {
	cfg, ro, err := parse([]string{"--delay", "12.5ms", "--rate", "500mbit", "--loss", "1e-3", "--burst", "0.01,0.3", "--dup", "0.01", "--reorder", "0.02", "--seed", "9", "--stats", "1s", "--peer-b", "127.0.0.1:9", "--blackout", "3s,5s"}, io.Discard)
	require.NoError(t, err)
	require.Equal(t, 12500*time.Microsecond, cfg.Faults.Delay)
	require.Equal(t, 500e6/8, cfg.Rate)
	require.Equal(t, 1e-3, cfg.Faults.Drop)
	require.Equal(t, 0.01, cfg.Faults.BurstEnter)
	require.Equal(t, 0.3, cfg.Faults.BurstExit)
	require.Equal(t, uint64(9), cfg.Faults.Seed)
	require.Equal(t, time.Second, ro.every)
	require.Equal(t, 3*time.Second, ro.downAt)
	require.Equal(t, 5*time.Second, ro.downFor)
	require.Equal(t, "127.0.0.1:9", cfg.PeerB.String())
	for _, bad := range [][]string{{"--rate", "fast"}, {"--loss", "2"}, {"--burst", "0.1"}, {"--peer-a", "nowhere"}, {"--delay", "-1s"}, {"extra"}, {"--blackout", "3s"}, {"--blackout", "3s,0s"}} {
		_, _, err := parse(bad, io.Discard)
		require.Error(t, err, bad)
	}
}
