package units

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParse(t *testing.T) {
	for in, want := range map[string]float64{"500mbit": 500e6, "1gbit": 1e9, "1.5Gbit": 1.5e9, "800kbit": 8e5, "100bit": 100} {
		got, err := ParseRate(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, bad := range []string{"", "fast", "-1mbit", "0gbit", "10mb"} {
		_, err := ParseRate(bad)
		require.Error(t, err, bad)
	}
	for in, want := range map[string]int64{"4096": 4096, "64K": 64 << 10, "4MiB": 4 << 20, "1g": 1 << 30, "2KB": 2048} {
		got, err := ParseSize(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, bad := range []string{"", "x", "-5", "1T"} {
		_, err := ParseSize(bad)
		require.Error(t, err, bad)
	}
}
