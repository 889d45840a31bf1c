package main

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/internal/sdrwire"
)

// The region hashes are the file's SHA-256 cut at region boundaries:
// the last is the file's SHA-256 (as sha256sum prints it), each region
// checks on its own against them, and any change to a region, or a
// region checked in another's place, fails.
func TestHashChain(t *testing.T) {
	const region = 64 << 10
	for _, size := range []int{1, 63, 64, region - 1, region, region + 1, 5*region + 100, 7 * region} {
		b := make([]byte, size)
		_, err := rand.Read(b)
		require.NoError(t, err)
		sum, hashes := hashFile(b, region)
		want := sha256.Sum256(b)
		require.Equal(t, hex.EncodeToString(want[:]), sum, "size %d", size)
		n := regions(int64(size), region)
		require.Len(t, hashes, n*hashLen)
		require.Equal(t, want[:], hashes[(n-1)*hashLen:])
		span := func(i int) []byte { return b[i*region : min((i+1)*region, size)] }
		for i := range n {
			require.True(t, regionOK(span(i), i, n, region, hashes), "size %d region %d", size, i)
			c := append([]byte(nil), span(i)...)
			c[len(c)/2] ^= 1
			require.False(t, regionOK(c, i, n, region, hashes), "size %d: region %d changed", size, i)
			if i > 0 && len(span(i)) == region {
				require.False(t, regionOK(span(i-1), i, n, region, hashes), "size %d: region %d in %d's place", size, i-1, i)
			}
		}
	}
	_, hashes := hashFile(nil, region)
	require.Empty(t, hashes)
}

// A receiver refuses an offer whose region hashes are of another scheme
// (a haul from before the chain), by name, and a region that is not a
// whole number of the hash's blocks.
func TestOfferHashing(t *testing.T) {
	sum, hashes := hashFile(make([]byte, 3<<20), 1<<20)
	off := offer{Name: "x", Size: 3 << 20, SHA256: sum, Region: 1 << 20, Manifest: sha256Hex(hashes), K: 32, Wire: sdrwire.Version, Hashing: hashChain}
	_, err := parseOffer(mustJSON(off))
	require.NoError(t, err)
	off.Hashing = ""
	_, err = parseOffer(mustJSON(off))
	require.ErrorContains(t, err, "run the same haul release at both ends")
	off.Hashing, off.Region = hashChain, 1<<20+1
	_, err = parseOffer(mustJSON(off))
	require.ErrorContains(t, err, "a multiple of 64")
	_, err = parseSend([]string{"--to", "127.0.0.1:1", "--region", "100000", "f"}, io.Discard)
	require.ErrorContains(t, err, "a multiple of 64")
}
