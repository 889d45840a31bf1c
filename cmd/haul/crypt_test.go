package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/internal/fabric"
	"github.com/rvma/rvma/internal/linkem"
)

var testPSK = []byte("the pre-shared key of the tests.")

func testPayload(t *testing.T, l layout, recvNonce byte) *payload {
	pl, err := newPayload(testPSK, bytes.Repeat([]byte{1}, sessionNonce), bytes.Repeat([]byte{recvNonce}, sessionNonce), strings.Repeat("ab", hashLen), l)
	require.NoError(t, err)
	return pl
}

func randomBytes(t *testing.T, n int) []byte {
	b := make([]byte, n)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return b
}

// filled is n bytes of a pattern that no decryption produces by chance.
func filled(n int) []byte { return bytes.Repeat([]byte{0xAA}, n) }

// A region sealed and opened is the region; a chunk whose ciphertext or
// tag was changed, or that was sealed for another place or session, fails
// and leaves its place in the output untouched.
func TestSealOpenRegion(t *testing.T) {
	l := layout{size: 3*8192 + 100, region: 8192, wire: 512} // 17 chunks a region (the last short), and a short last region
	data := randomBytes(t, int(l.size))
	plainOf := func(i int) []byte { return data[int64(i)*l.region:][:l.regionLen(i)] }
	sealAll := func(pl *payload) [][]byte {
		var s [][]byte
		for i := range l.regions() {
			b := make([]byte, l.sealedLen(i))
			pl.sealRegion(b, plainOf(i), i)
			s = append(s, b)
		}
		return s
	}
	pl := testPayload(t, l, 2)
	sealed := sealAll(pl)
	require.Equal(t, 8192+17*tagSize, len(sealed[0]))
	require.Equal(t, 100+tagSize, len(sealed[3]))
	for i, s := range sealed {
		require.False(t, bytes.Contains(s, plainOf(i)[:64]), "the plaintext does not travel")
		out := filled(l.regionLen(i))
		require.Empty(t, pl.openRegion(bytes.Clone(s), out, i))
		require.Equal(t, plainOf(i), out)
	}
	require.Zero(t, pl.failed.Load())
	require.Positive(t, pl.CPU())

	t.Run("tampered chunks", func(t *testing.T) {
		s := bytes.Clone(sealed[0])
		s[2*l.wire+10] ^= 1        // chunk 2's ciphertext
		s[5*l.wire+l.plain()] ^= 1 // chunk 5's tag
		s[len(s)-1] ^= 0x80        // the last chunk's tag
		out := filled(l.regionLen(0))
		before := pl.failed.Load()
		require.Equal(t, []uint32{2, 5, 16}, pl.openRegion(s, out, 0))
		require.EqualValues(t, 3, pl.failed.Load()-before)
		for j := range l.chunks(0) {
			got := out[j*l.plain():][:l.chunkLen(0, j)]
			if j == 2 || j == 5 || j == 16 {
				require.Equal(t, filled(len(got)), got, "chunk %d is never written", j)
			} else {
				require.Equal(t, plainOf(0)[j*l.plain():][:len(got)], got)
			}
		}
	})
	t.Run("another region's chunks", func(t *testing.T) {
		out := filled(l.regionLen(0))
		require.Len(t, pl.openRegion(bytes.Clone(sealed[1]), out, 0), l.chunks(0))
		require.Equal(t, filled(len(out)), out)
	})
	t.Run("another session's key", func(t *testing.T) {
		other := testPayload(t, l, 3)
		out := filled(l.regionLen(1))
		require.Len(t, other.openRegion(bytes.Clone(sealed[1]), out, 1), l.chunks(1))
		require.Equal(t, filled(len(out)), out)
		require.NotEqual(t, sealAll(other)[1], sealed[1])
	})
}

// Repair rounds seal chunks anew under the round's nonces, one per slot,
// the short last one padded; they open only for that round.
func TestSealOpenRepair(t *testing.T) {
	l := layout{size: 2*4096 + 7, region: 4096, wire: 256}
	data := randomBytes(t, int(l.size))
	plainOf := func(i int) []byte { return data[int64(i)*l.region:][:l.regionLen(i)] }
	pl := testPayload(t, l, 2)
	ids := []chunkID{{0, 0}, {0, 17}, {1, 3}, {2, 0}} // region 0's last chunk (16 bytes), region 2's only one (7 bytes)
	require.NoError(t, l.check(ids))
	buf := make([]byte, len(ids)*l.wire)
	pl.sealRepair(buf, ids, 1, plainOf)
	outs := [][]byte{filled(4096), filled(4096), filled(7)}
	outOf := func(i int) []byte { return outs[i] }

	wrong := bytes.Clone(buf)
	require.Equal(t, []bool{false, false, false, false}, pl.openRepair(wrong, ids, 2, outOf), "sealed for round 1")
	require.Equal(t, [][]byte{filled(4096), filled(4096), filled(7)}, outs)

	buf[l.wire+3] ^= 1 // the second slot
	require.Equal(t, []bool{true, false, true, true}, pl.openRepair(buf, ids, 1, outOf))
	for _, id := range []chunkID{{0, 0}, {1, 3}, {2, 0}} {
		i, j := int(id.region), int(id.chunk)
		require.Equal(t, plainOf(i)[j*l.plain():][:l.chunkLen(i, j)], outs[i][j*l.plain():][:l.chunkLen(i, j)])
	}
	require.Equal(t, filled(l.chunkLen(0, 17)), outs[0][17*l.plain():])
	require.EqualValues(t, 5, pl.failed.Load())
}

// Every input of the session key changes it; the same inputs give the
// same key on both sides.
func TestSessionKey(t *testing.T) {
	l := layout{size: 1, region: 4096, wire: 4096}
	ns, nr := newNonce(), newNonce()
	sha := strings.Repeat("cd", hashLen)
	key := func(psk, ns, nr []byte, sha string) []byte {
		pl, err := newPayload(psk, ns, nr, sha, l)
		require.NoError(t, err)
		return pl.key
	}
	k := key(testPSK, ns, nr, sha)
	require.Len(t, k, 32)
	require.Equal(t, k, key(testPSK, ns, nr, sha))
	for name, other := range map[string][]byte{
		"sender's nonce":   key(testPSK, newNonce(), nr, sha),
		"receiver's nonce": key(testPSK, ns, newNonce(), sha),
		"nonces swapped":   key(testPSK, nr, ns, sha),
		"pre-shared key":   key([]byte("another pre-shared key, 32 bytes"), ns, nr, sha),
		"transfer":         key(testPSK, ns, nr, strings.Repeat("ce", hashLen)),
	} {
		require.NotEqual(t, k, other, name)
	}
	_, err := newPayload(testPSK, ns[:16], nr, sha, l)
	require.ErrorContains(t, err, "nonces of 16 and 32 bytes")
	_, err = newPayload(testPSK, ns, nr, sha, layout{size: 1, region: 4096, wire: tagSize})
	require.ErrorContains(t, err, "cannot carry a sealed chunk")
}

func repairMsg(round uint32, ids []chunkID) []byte {
	b := appendRepair(make([]byte, 0, fbSize), round, ids)
	return b[:fbSize]
}

func TestParseRepair(t *testing.T) {
	ids := []chunkID{{0, 1}, {0, 7}, {3, 0}, {1 << 20, 5}}
	round, got, err := parseRepair(repairMsg(2, ids))
	require.NoError(t, err)
	require.EqualValues(t, 2, round)
	require.Equal(t, ids, got)
	round, got, err = parseRepair(appendRepair(nil, 1, ids[:1])) // unpadded
	require.NoError(t, err)
	require.EqualValues(t, 1, round)
	require.Equal(t, ids[:1], got)
	require.False(t, isRepair(mustJSON(verdict{OK: true})))

	most := make([]chunkID, maxRepairChunks)
	for k := range most {
		most[k] = chunkID{uint32(k / 100), uint32(k % 100)}
	}
	_, got, err = parseRepair(repairMsg(1, most))
	require.NoError(t, err)
	require.Len(t, got, maxRepairChunks)

	for name, b := range map[string][]byte{
		"empty":          nil,
		"verdict":        mustJSON(verdict{OK: true}),
		"short header":   []byte("HRPR\x00\x00\x00\x01"),
		"round 0":        repairMsg(0, ids),
		"round too late": repairMsg(maxRepairRounds+1, ids),
		"no chunks":      repairMsg(1, nil),
		"too many":       appendRepair(nil, 1, append(most, chunkID{9999, 0})),
		"cut short":      appendRepair(nil, 1, ids)[:repairHdr+8*len(ids)-1],
		"out of order":   repairMsg(1, []chunkID{{1, 0}, {0, 5}}),
		"listed twice":   repairMsg(1, []chunkID{{1, 0}, {1, 0}}),
		"trailing bytes": func() []byte { b := repairMsg(1, ids); b[len(b)-1] = 1; return b }(),
	} {
		_, _, err := parseRepair(b)
		require.ErrorIs(t, err, errRepair, name)
	}

	l := layout{size: 2*4096 + 7, region: 4096, wire: 256} // 18, 18 and 1 chunks
	require.NoError(t, l.check([]chunkID{{0, 17}, {2, 0}}))
	for _, id := range []chunkID{{0, 18}, {2, 1}, {3, 0}, {1 << 31, 0}} {
		require.ErrorIs(t, l.check([]chunkID{id}), errRepair, "%v", id)
	}
}

// The repair request decoder never panics on what a peer sends, and what
// it accepts is canonical: it encodes back to the same bytes, its chunks
// strictly increasing.
func FuzzRepairRequest(f *testing.F) {
	f.Add(appendRepair(nil, 1, []chunkID{{0, 1}, {2, 3}}))
	f.Add(repairMsg(3, []chunkID{{7, 0}})[:100])
	f.Add(appendRepair(nil, maxRepairRounds, []chunkID{{0, 0}, {0, 1}, {1, 0}}))
	f.Add([]byte("HRPR\x00\x00\x00\x01\xff\xff\xff\xff"))
	f.Add(mustJSON(verdict{OK: true}))
	l := layout{size: 10<<20 + 5, region: 1 << 20, wire: 4096}
	pl := testPayload(&testing.T{}, l, 2)
	zero := make([]byte, l.region)
	f.Fuzz(func(t *testing.T, b []byte) {
		round, ids, err := parseRepair(b)
		if err != nil {
			require.ErrorIs(t, err, errRepair)
			return
		}
		require.GreaterOrEqual(t, round, uint32(1))
		require.LessOrEqual(t, round, uint32(maxRepairRounds))
		require.NotEmpty(t, ids)
		require.LessOrEqual(t, len(ids), maxRepairChunks)
		enc := appendRepair(nil, round, ids)
		require.Equal(t, enc, b[:len(enc)])
		require.Equal(t, make([]byte, len(b)-len(enc)), b[len(enc):])
		for k := 1; k < len(ids); k++ {
			require.True(t, ids[k-1].less(ids[k]))
		}
		if l.check(ids) == nil {
			// Sealing what passed the check stays within the file.
			pl.sealRepair(make([]byte, len(ids)*l.wire), ids, round, func(int) []byte { return zero })
		}
	})
}

// An encrypted transfer through a lossy, reordering, duplicating link
// arrives byte-identical, by selective repeat and by erasure coding (its
// parity over the sealed chunks); both reports say it was encrypted.
func TestEncryptedUnderLoss(t *testing.T) {
	for _, scheme := range []string{"sr", "ec"} {
		t.Run(scheme, func(t *testing.T) {
			dir := t.TempDir()
			in, out := filepath.Join(dir, "in"), filepath.Join(dir, "out")
			key := keyFile(t, dir, "key")
			want := writeRandom(t, in, 3<<20+123)
			l, err := linkem.Start(linkem.Config{Rate: 50e6, Faults: fabric.Faults{Delay: 2 * time.Millisecond, Drop: 0.02, Reorder: 0.01, Duplicate: 0.01, Seed: 5}})
			require.NoError(t, err)
			defer l.Close()
			addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			r := start(ctx, "recv", "--listen", addr, "--out", out, "--via", l.AddrB().String(), "--key-file", key, "--encrypt", "--json")
			waitListening(t, addr)
			args := []string{"send", "--to", addr, "--via", l.AddrA().String(), "--rate", "400mbit", "--scheme", scheme, "--region", "1MiB", "--key-file", key, "--json"}
			if scheme == "sr" {
				// A receiver that insists on encryption refuses a plain
				// sender, and waits on.
				err := start(ctx, append(args, in)...).wait(t)
				require.ErrorContains(t, err, "accepts encrypted payloads only")
			}
			s := start(ctx, append(args, "--encrypt", in)...)
			require.NoError(t, s.wait(t), s.stderr.String())
			require.NoError(t, r.wait(t), r.stderr.String())
			got, err := os.ReadFile(out)
			require.NoError(t, err)
			require.True(t, bytes.Equal(want, got))

			var rep report
			require.NoError(t, json.Unmarshal([]byte(s.stdout.String()), &rep), s.stdout.String())
			require.True(t, rep.OK)
			require.True(t, rep.Encrypted)
			require.Positive(t, rep.CryptoCPU)
			require.Zero(t, rep.AuthFailed)
			require.True(t, strings.HasPrefix(rep.Scheme, scheme), rep.Scheme)
			var rrep map[string]any
			require.NoError(t, json.Unmarshal([]byte(r.stdout.String()), &rrep), r.stdout.String())
			require.Equal(t, true, rrep["encrypted"])
			require.Positive(t, rrep["crypto_cpu_seconds"])
			ab, _ := l.Stats()
			require.NotZero(t, ab.Lost)
		})
	}
}

// Chunks tampered with on the way (after the reliability layer took them)
// fail their tag: they are never written to the output, and are fetched
// again in repair rounds, one of which is tampered with too; the file
// arrives intact and both reports count them.
func TestTamperedChunksRefetched(t *testing.T) {
	f := newFixture(t) // 8 regions of 1 MiB
	key := keyFile(t, f.dir, "key")
	const wire = 4096
	plain := wire - tagSize
	last := (1<<20+plain-1)/plain - 1 // a region's last chunk (16 bytes)
	var rounds [3]atomic.Int32
	var neverWritten atomic.Bool
	hook := func(round uint32, region int, sealed []byte) {
		rounds[min(round, 2)].Add(1)
		switch {
		case round == 0 && region == 1:
			sealed[7] ^= 1 // chunk 0
			sealed[3*wire+100] ^= 1
		case round == 0 && region == 7:
			sealed[last*wire+3] ^= 1
		case round == 1:
			// Region 1's chunk 0 failed and has not arrived yet: its
			// place in the output is as it was created, zeros.
			part, err := os.ReadFile(partPath(f.out))
			neverWritten.Store(err == nil && bytes.Equal(part[1<<20:1<<20+plain], make([]byte, plain)) &&
				!bytes.Equal(f.want[1<<20:1<<20+plain], make([]byte, plain)))
			sealed[7] ^= 1 // its first slot, region 1's chunk 0, again
		}
	}
	ctx := context.Background()
	r := &proc{done: make(chan error, 1)}
	go func() {
		o, err := parseRecv(f.recvArgs("--key-file", key, "--chunk", fmt.Sprint(wire), "--json")[1:], &r.stderr)
		if err == nil {
			o.sealedHook = hook
			err = receive(ctx, o, &r.stdout, &r.stderr)
		}
		r.done <- err
	}()
	waitListening(t, f.addr)
	rep := f.requireDone(t, f.sender(ctx, "--key-file", key, "--encrypt"), r)
	require.True(t, rep.Encrypted)
	require.Equal(t, 4, rep.AuthFailed, "3 chunks in round 1, one again in round 2")
	require.EqualValues(t, 8, rounds[0].Load())
	require.EqualValues(t, 1, rounds[1].Load())
	require.EqualValues(t, 1, rounds[2].Load())
	require.True(t, neverWritten.Load(), "a chunk that failed its tag was written to the output")
	var rrep map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.stdout.String()), &rrep), r.stdout.String())
	require.EqualValues(t, 4, rrep["auth_failed_chunks"])
}
