package main

import (
	"crypto/rand"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// writeRegion puts every byte in place whatever the alignment: the
// aligned head directly (where the file system allows), a short tail, an
// unaligned offset or buffer, and no direct file at all, through the
// page cache.
func TestWriteRegion(t *testing.T) {
	path := filepath.Join(t.TempDir(), "part")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	require.NoError(t, err)
	defer f.Close()
	const size = 1 << 20
	require.NoError(t, f.Truncate(size))
	direct := openDirect(path)
	if direct != nil {
		defer direct.Close()
	}
	want := make([]byte, size)
	for _, tc := range []struct {
		name   string
		off, n int
		shift  int // the buffer's offset from an aligned start
		direct bool
	}{
		{"aligned", 0, 64 << 10, 0, true},
		{"short tail", 64 << 10, 64<<10 + 1000, 0, true},
		{"unaligned offset", 200<<10 + 64, 4096, 0, true},
		{"unaligned buffer", 300 << 10, 8192, 64, true},
		{"no direct file", 400 << 10, 12288, 0, false},
	} {
		buf := alignedBuf(tc.n + tc.shift)[tc.shift:]
		rand.Read(buf)
		copy(want[tc.off:], buf)
		d := direct
		if !tc.direct {
			d = nil
		}
		ok, err := writeRegion(f, d, buf, int64(tc.off))
		require.NoError(t, err, tc.name)
		require.Equal(t, d != nil, ok, tc.name)
	}
	got, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, want, got)
}
