package main

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/zeebo/blake3"

	"github.com/rvma/rvma/internal/sdrwire"
)

// Each scheme's region hashes check each region on its own against the
// list; any change to a region, or a region checked in another's place,
// fails; and the hashes make the file's digest, which for sha256 is the
// file's SHA-256 (as sha256sum prints it) and for blake3 the BLAKE3 of
// the header and the region hashes.
func TestRegionHashes(t *testing.T) {
	const region = 64 << 10
	for _, h := range hashings {
		for _, size := range []int{0, 1, 63, 64, region - 1, region, region + 1, 5*region + 100, 7 * region} {
			b := make([]byte, size)
			_, err := rand.Read(b)
			require.NoError(t, err)
			sum, hashes := h.file(b, region)
			n := regions(int64(size), region)
			require.Len(t, hashes, n*hashLen)
			require.Equal(t, sum, h.digest(int64(size), region, hashes), "%s size %d", h.label(), size)
			switch h.label() {
			case "sha256":
				want := sha256.Sum256(b)
				require.Equal(t, hex.EncodeToString(want[:]), sum, "size %d", size)
			case "blake3":
				list := []byte{}
				for i := range n {
					s := blake3.Sum256(b[i*region : min((i+1)*region, size)])
					list = append(list, s[:]...)
				}
				require.Equal(t, list, hashes)
			}
			span := func(i int) []byte { return b[i*region : min((i+1)*region, size)] }
			for i := range n {
				require.True(t, regionOK(h, span(i), i, n, region, hashes), "%s size %d region %d", h.label(), size, i)
				c := append([]byte(nil), span(i)...)
				c[len(c)/2] ^= 1
				require.False(t, regionOK(h, c, i, n, region, hashes), "%s size %d: region %d changed", h.label(), size, i)
				if i > 0 && len(span(i)) == region {
					require.False(t, regionOK(h, span(i-1), i, n, region, hashes), "%s size %d: region %d in %d's place", h.label(), size, i-1, i)
				}
			}
		}
	}
}

// The blake3 digest binds the size and the region size, not only the
// hashes: the same regions cut otherwise, or a file cut short at a
// region boundary, have another digest.
func TestBlake3DigestBinds(t *testing.T) {
	h := blake3List{}
	b := make([]byte, 4<<20)
	_, err := rand.Read(b)
	require.NoError(t, err)
	d1, hashes := h.file(b, 1<<20)
	d2, _ := h.file(b, 2<<20)
	require.NotEqual(t, d1, d2)
	d3, _ := h.file(b[:3<<20], 1<<20)
	require.NotEqual(t, d1, d3)
	require.Equal(t, d3, h.digest(3<<20, 1<<20, hashes[:3*hashLen]))
	require.NotEqual(t, d1, h.digest(4<<20, 1<<20, append(hashes[hashLen:], hashes[:hashLen]...)), "hashes reordered")
}

// A receiver takes either scheme and refuses an unknown one by name, and
// a region that is not a whole number of SHA-256's blocks.
func TestOfferHashing(t *testing.T) {
	for _, h := range hashings {
		sum, hashes := h.file(make([]byte, 3<<20), 1<<20)
		off := offer{Name: "x", Size: 3 << 20, Digest: sum, Region: 1 << 20, Manifest: sha256Hex(hashes), K: 32, Wire: sdrwire.Version, Hashing: h.name()}
		_, err := parseOffer(mustJSON(off))
		require.NoError(t, err)
		off.Hashing = ""
		_, err = parseOffer(mustJSON(off))
		require.ErrorContains(t, err, "run the same haul release at both ends")
		off.Hashing = "md5-list"
		_, err = parseOffer(mustJSON(off))
		require.ErrorContains(t, err, `"md5-list"`)
		off.Hashing, off.Region = h.name(), 1<<20+1
		_, err = parseOffer(mustJSON(off))
		require.ErrorContains(t, err, "a multiple of 64")
	}
	_, err := parseSend([]string{"--to", "127.0.0.1:1", "--region", "100000", "f"}, io.Discard)
	require.ErrorContains(t, err, "a multiple of 64")
	_, err = parseSend([]string{"--to", "127.0.0.1:1", "--digest", "md5", "f"}, io.Discard)
	require.ErrorContains(t, err, "want blake3 or sha256")
}

// haul digest prints what send computes, with send's default region.
func TestDigestCommand(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	b := make([]byte, 20<<20+3)
	_, err := rand.Read(b)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(p, b, 0o644))
	for _, tc := range []struct {
		args   []string
		h      hashing
		region int64
	}{
		{nil, blake3List{}, 16 << 20},
		{[]string{"--region", "1MiB"}, blake3List{}, 1 << 20},
		{[]string{"--digest", "sha256"}, sha256Chain{}, 16 << 20},
	} {
		var out strings.Builder
		require.NoError(t, run(t.Context(), append(append([]string{"digest"}, tc.args...), p), &out, io.Discard))
		want, _ := tc.h.file(b, tc.region)
		require.True(t, strings.HasPrefix(out.String(), want+"  "+p), out.String())
	}
	sum := sha256.Sum256(b)
	var out strings.Builder
	require.NoError(t, run(t.Context(), []string{"digest", "--digest", "sha256", p}, &out, io.Discard))
	require.Contains(t, out.String(), hex.EncodeToString(sum[:]))
	require.Error(t, run(t.Context(), []string{"digest", filepath.Join(t.TempDir(), "none")}, io.Discard, io.Discard))
	require.ErrorContains(t, run(t.Context(), []string{"digest", "--digest", "crc", p}, io.Discard, io.Discard), "want blake3 or sha256")
}

// An offer is untrusted input: parseOffer refuses it with an error or
// returns one whose layout, hashes' scheme and digests are usable.
func FuzzOffer(f *testing.F) {
	for _, h := range hashings {
		sum, hashes := h.file(make([]byte, 3<<20), 1<<20)
		f.Add(mustJSON(offer{Name: "x", Size: 3 << 20, Digest: sum, Region: 1 << 20, Manifest: sha256Hex(hashes), K: 32, Wire: sdrwire.Version, Hashing: h.name()}))
	}
	f.Add([]byte(`{"size":-1,"region":0,"hashing":"blake3-list"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		off, err := parseOffer(b)
		if err != nil {
			require.Nil(t, off)
			return
		}
		require.NoError(t, checkLayout(off.Size, off.Region))
		require.True(t, knownHashing(off.Hashing), off.Hashing)
		require.True(t, isHexHash(off.Digest) && isHexHash(off.Manifest))
		require.LessOrEqual(t, off.K+max(off.M, 8), 256)
	})
}

// An offer, a path's hello and a verdict of the releases before BLAKE3
// (their digest the file's SHA-256, under the key "sha256") are this
// release's with --digest sha256: the two interoperate, and an older end
// meets a blake3-list offer's hashing by its name.
func TestOlderRelease(t *testing.T) {
	sum, hashes := sha256Chain{}.file(make([]byte, 3<<20), 1<<20)
	old := fmt.Sprintf(`{"name":"x","size":%d,"sha256":%q,"region":%d,"manifest":%q,"hashing":"sha256-chain","k":32,"m":8,"wire":%d}`,
		3<<20, sum, 1<<20, sha256Hex(hashes), sdrwire.Version)
	off, err := parseOffer([]byte(old))
	require.NoError(t, err)
	require.Equal(t, sum, off.Digest)
	require.Equal(t, hashChain, off.Hashing)
	var v verdict
	require.NoError(t, json.Unmarshal([]byte(`{"ok":true,"sha256":"`+sum+`"}`), &v))
	require.Equal(t, sum, v.Digest)
	var h pathHello
	require.NoError(t, json.Unmarshal([]byte(`{"path":1,"sha256":"`+sum+`"}`), &h))
	require.Equal(t, sum, h.Digest)
	// This release's offer, as an older receiver reads it: the digest
	// where it looks, and the scheme it does not know by name.
	var seen map[string]any
	require.NoError(t, json.Unmarshal(mustJSON(offer{Digest: sum, Hashing: hashBlake3}), &seen))
	require.Equal(t, sum, seen["sha256"])
	require.Equal(t, hashBlake3, seen["hashing"])
}

// BenchmarkRegionHash: one core hashing a 16 MiB region (haul's default)
// in each scheme, as the receiver checks a region that landed.
func BenchmarkRegionHash(b *testing.B) {
	const region = 16 << 20
	span := make([]byte, region)
	for _, h := range hashings {
		_, hashes := h.file(span, region)
		b.Run(h.label(), func(b *testing.B) {
			b.SetBytes(region)
			b.ReportAllocs()
			for b.Loop() {
				if !regionOK(h, span, 0, 1, region, hashes) {
					b.Fatal("the region does not match its own hash")
				}
			}
		})
	}
}
