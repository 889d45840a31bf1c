package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/internal/linkem"

	"github.com/rvma/rvma/internal/testutil"
)

// silentPeer is the receiver's --peer-timeout where a test waits for it
// to find the sender gone: long enough that a loaded machine (the race
// detector, shared cores) does not make a live sender look gone.
const silentPeer = "2s"

// proc is a run of haul in the test process.
type proc struct {
	stdout, stderr testutil.SyncBuffer
	done           chan error
}

func start(ctx context.Context, args ...string) *proc {
	return startRecvHook(ctx, nil, args...)
}

// startRecvHook runs haul; a recv gets hook as its state file hook.
func startRecvHook(ctx context.Context, hook func(writeAt) writeAt, args ...string) *proc {
	p := &proc{done: make(chan error, 1)}
	go func() {
		if hook == nil {
			p.done <- run(ctx, args, &p.stdout, &p.stderr)
			return
		}
		o, err := parseRecv(args[1:], &p.stderr)
		if err == nil {
			o.stateHook = hook
			err = receive(ctx, o, &p.stdout, &p.stderr)
		}
		p.done <- err
	}()
	return p
}

// wait returns how haul ended. Its bound only catches a haul that never
// ends: these transfers take 1-20 s alone, and a minute was outlasted by
// ones still moving under -race on a loaded machine (8 MiB through the
// emulated link at 0.5 Mbit/s once, beside two other race-mode test
// binaries; at 12 Mbit/s the comparison run of TestSlowReceiver).
func (p *proc) wait(t *testing.T) error {
	t.Helper()
	select {
	case err := <-p.done:
		return err
	case <-time.After(3 * time.Minute):
		t.Fatalf("haul did not end; its stderr:\n%s", p.stderr.String())
		return nil
	}
}

// haveRegions is how many regions the state file beside out marks as in
// place (-1 if it does not decode).
func haveRegions(t *testing.T, out string) int {
	b, err := os.ReadFile(statePath(out))
	if err != nil {
		return -1
	}
	st, err := decodeState(b)
	if err != nil {
		return -1
	}
	return countRegions(st.Have, regions(st.Size, st.Region))
}

// waitRegions waits until the state file marks n regions; ps are the
// runs whose stderr to show if it does not happen.
func waitRegions(t *testing.T, out string, n int, ps ...*proc) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for haveRegions(t, out) < n {
		if time.Now().After(deadline) {
			var logs []string
			for _, p := range ps {
				logs = append(logs, p.stderr.String())
			}
			t.Fatalf("%d regions never arrived; the runs said:\n%s", n, strings.Join(logs, "\n---\n"))
		}
		time.Sleep(2 * time.Millisecond)
	}
}

type fixture struct {
	dir, in, out string
	want         []byte
	addr         string
	l            *linkem.Link
}

// newFixture makes an 8 MiB file and a 10 MB/s link (8 regions of 1 MiB,
// about 0.1 s each).
func newFixture(t *testing.T) *fixture {
	f := &fixture{dir: t.TempDir()}
	f.in, f.out = filepath.Join(f.dir, "in"), filepath.Join(f.dir, "out")
	f.want = writeRandom(t, f.in, 8<<20)
	var err error
	f.l, err = linkem.Start(linkem.Config{Rate: 10e6})
	require.NoError(t, err)
	t.Cleanup(func() { f.l.Close() })
	f.addr = fmt.Sprintf("127.0.0.1:%d", freePort(t))
	return f
}

func (f *fixture) recvArgs(extra ...string) []string {
	return append([]string{"recv", "--listen", f.addr, "--out", f.out, "--via", f.l.AddrB().String()}, extra...)
}

func (f *fixture) sender(ctx context.Context, extra ...string) *proc {
	args := append([]string{"send", "--to", f.addr, "--via", f.l.AddrA().String(), "--rate", "80mbit", "--region", "1MiB", "--json"}, extra...)
	return start(ctx, append(args, f.in)...)
}

// requireDone checks a successful pair of runs: the output is the input,
// nothing else is left, and the sender's report.
func (f *fixture) requireDone(t *testing.T, s, r *proc) report {
	t.Helper()
	serr, rerr := s.wait(t), r.wait(t)
	require.NoError(t, serr, s.stderr.String())
	require.NoError(t, rerr, r.stderr.String())
	got, err := os.ReadFile(f.out)
	require.NoError(t, err)
	require.Equal(t, sha256.Sum256(f.want), sha256.Sum256(got))
	for _, p := range []string{statePath(f.out), partPath(f.out)} {
		_, err := os.Stat(p)
		require.ErrorIs(t, err, os.ErrNotExist)
	}
	var rep report
	require.NoError(t, json.Unmarshal([]byte(s.stdout.String()), &rep), s.stdout.String())
	require.True(t, rep.OK)
	return rep
}

// rerun runs both sides again and checks the file arrives.
func (f *fixture) rerun(t *testing.T) report {
	ctx := context.Background()
	r := start(ctx, f.recvArgs()...)
	waitListening(t, f.addr)
	return f.requireDone(t, f.sender(ctx), r)
}

// Every way the receiver can stop mid-transfer keeps the partial output
// under its temporary name with a state file that resumes it, says so,
// and tells a live sender why; the next run completes the file.
func TestStopKeepsState(t *testing.T) {
	enospc := &os.PathError{Op: "write", Path: "state", Err: syscall.ENOSPC}
	for _, tc := range []struct {
		name     string
		recvArgs []string
		hook     func(writeAt) writeAt
		stop     func(killSender, stopRecv func())
		recvErr  []string
		sendErr  string
	}{
		{name: "sender gone", recvArgs: []string{"--peer-timeout", silentPeer, "--wait", "0"},
			stop:    func(killSender, _ func()) { killSender() },
			recvErr: []string{"the sender is gone", "nothing heard for", "no sender came back within 0s"}},
		{name: "interrupted", stop: func(_, stopRecv func()) { stopRecv() },
			recvErr: []string{"receiver interrupted: context canceled"}, sendErr: "the receiver stopped: receiver interrupted"},
		{name: "disk full", hook: failAfter(4, enospc), stop: func(_, _ func()) {},
			recvErr: []string{"save progress to", "no space left on device"}, sendErr: "the receiver stopped: save progress"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			rctx, stopRecv := context.WithCancel(context.Background())
			defer stopRecv()
			r := startRecvHook(rctx, tc.hook, f.recvArgs(tc.recvArgs...)...)
			waitListening(t, f.addr)
			sctx, killSender := context.WithCancel(context.Background())
			defer killSender()
			s := f.sender(sctx)
			waitRegions(t, f.out, 2, r, s)
			tc.stop(killSender, stopRecv)
			rerr := r.wait(t)
			for _, want := range tc.recvErr {
				require.ErrorContains(t, rerr, want)
			}
			require.ErrorContains(t, rerr, "regions are kept in "+partPath(f.out)+" (run again to resume)")
			serr := s.wait(t)
			if tc.sendErr != "" {
				require.ErrorContains(t, serr, tc.sendErr)
			}
			_, err := os.Stat(f.out)
			require.ErrorIs(t, err, os.ErrNotExist, "the output appears only when complete")
			require.GreaterOrEqual(t, haveRegions(t, f.out), 2)
			require.Contains(t, rerr.Error(), fmt.Sprintf("%d of 8 regions", haveRegions(t, f.out)), "the count kept is the count on disk")

			rep := f.rerun(t)
			require.Greater(t, rep.Resumed, int64(0))
		})
	}
}

// failAfter lets n state writes through, then fails every write with err.
func failAfter(n int, err error) func(writeAt) writeAt {
	var count atomic.Int32
	return func(w writeAt) writeAt {
		return func(b []byte, off int64) (int, error) {
			if count.Add(1) > int32(n) {
				return 0, err
			}
			return w(b, off)
		}
	}
}

// --out is checked before the receiver waits for a sender.
func TestCheckOut(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	require.NoError(t, os.Mkdir(filepath.Join(dir, "sub"), 0o755))
	require.NoError(t, os.Mkdir(filepath.Join(dir, "x.haul.part"), 0o755))
	// A directory this process cannot write: by its mode for a user, a
	// read-only mount for root (whom modes do not stop).
	ro := filepath.Join(dir, "ro")
	require.NoError(t, os.Mkdir(ro, 0o555))
	roOK := os.Geteuid() != 0
	if !roOK {
		if err := syscall.Mount("tmpfs", ro, "tmpfs", syscall.MS_RDONLY, "size=1m"); err == nil {
			roOK = true
			defer syscall.Unmount(ro, 0)
		}
	}
	for _, tc := range []struct {
		name, out, want string
		ro              bool
	}{
		{"no such directory", filepath.Join(dir, "nope", "out"), "no such file or directory", false},
		{"parent is a file", filepath.Join(file, "out"), "not a directory", false},
		{"out is a directory", filepath.Join(dir, "sub"), "is a directory", false},
		{"partial is a directory", filepath.Join(dir, "x"), "x.haul.part is a directory", false},
		{"out is special", "/dev/null", "is not a regular file", false},
		{"directory not writable", filepath.Join(ro, "out"), "cannot create files in", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.ro && !roOK {
				t.Skip("root, and no read-only tmpfs could be mounted: no directory it cannot write")
			}
			// Nothing connects: the error comes before any wait.
			err := run(context.Background(), []string{"recv", "--listen", fmt.Sprintf("127.0.0.1:%d", freePort(t)), "--out", tc.out}, io.Discard, io.Discard)
			require.ErrorContains(t, err, "--out")
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// A state file that is not what it should be (older versions', a bitmap
// of the wrong length, garbage, cut short) is discarded with a warning and
// the transfer starts over.
func TestBadStateFile(t *testing.T) {
	good := stateFileFor(8<<20, 1<<20)
	for _, tc := range []struct {
		name  string
		state []byte
	}{
		{"empty bitmap, old format", []byte(`{"size":8388608,"sha256":"x","region":1048576,"have":""}`)},
		{"garbage", []byte("\x00\x01garbage")},
		{"cut short", good[:len(good)-1]},
		{"both slots spoiled", bytes.ReplaceAll(good, []byte(`"version":2`), []byte(`"version":3`))},
		{"wrong transfer", stateFileFor(8<<20, 2<<20)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			require.NoError(t, os.WriteFile(statePath(f.out), tc.state, 0o644))
			require.NoError(t, os.WriteFile(partPath(f.out), make([]byte, 8<<20), 0o644))
			ctx := context.Background()
			r := start(ctx, f.recvArgs()...)
			waitListening(t, f.addr)
			rep := f.requireDone(t, f.sender(ctx), r)
			require.Zero(t, rep.Resumed)
			require.Regexp(t, "discarding the state file|belongs to another transfer", r.stderr.String())
		})
	}
}

// stateFileFor is a valid state file of a transfer of size bytes, with
// its hashes in and nothing in place.
func stateFileFor(size, region int64) []byte {
	st := sampleState(size, region, 0)
	st.Seq = 1
	return encodeState(st)
}

// sampleState is a valid state with made-up region hashes and the first
// have regions in place.
func sampleState(size, region int64, have int) *state {
	n := regions(size, region)
	hashes := make([]byte, n*hashLen)
	for i := range hashes {
		hashes[i] = byte(i * 7)
	}
	st := &state{Version: stateVersion, Size: size, Digest: blake3List{}.digest(size, region, hashes), Hashing: hashBlake3, Region: region,
		Manifest: sha256Hex(hashes), Hashed: true, Hashes: hashes, Have: make([]byte, (n+7)/8)}
	for i := range have {
		setRegion(st.Have, i)
	}
	return st
}

// A state file of the release before the digest became a choice (version
// 2, no "hashing": a SHA-256 chain) resumes, as version 3 of that scheme.
func TestStateVersion2Resumes(t *testing.T) {
	const size, region = 3<<20 + 5, 1 << 20
	data := bytes.Repeat([]byte("v2"), size/2+1)[:size]
	sum, hashes := sha256Chain{}.file(data, region)
	j := fmt.Sprintf(`{"version":2,"seq":1,"size":%d,"sha256":%q,"region":%d,"manifest":%q,"hashed":true,"have":"Aw=="}`,
		size, sum, region, sha256Hex(hashes))
	slot := fmt.Appendf(nil, "%s\n%s\n", j, sha256Hex([]byte(j)))
	file := append(bytes.Repeat([]byte{' '}, hashesAt), hashes...)
	copy(file[slotSize:], slot)
	st, err := decodeState(file)
	require.NoError(t, err)
	require.Equal(t, stateVersion, st.Version)
	require.Equal(t, hashChain, st.Hashing)
	require.Equal(t, sum, st.Digest)
	require.Equal(t, 2, countRegions(st.Have, regions(size, region)))
	// Without the hashing it would have: not a SHA-256 chain.
	j = strings.Replace(j, `"version":2`, `"version":3`, 1)
	slot = fmt.Appendf(nil, "%s\n%s\n", j, sha256Hex([]byte(j)))
	copy(file[slotSize:], append(slot, bytes.Repeat([]byte{' '}, slotSize-len(slot))...))
	_, err = decodeState(file)
	require.ErrorContains(t, err, `unknown scheme ""`)
}

// decodeState checks every field, and falls back to the other slot when
// the newer is spoiled.
func TestDecodeState(t *testing.T) {
	const size, region = 10<<20 + 5, 1 << 20 // 11 regions: the bitmap's last byte is partial
	for _, tc := range []struct {
		name string
		mod  func(*state)
		edit func([]byte) []byte // the encoded file
		want string
	}{
		{name: "valid"},
		{name: "empty bitmap", mod: func(s *state) { s.Have = nil }, want: "bitmap of 0 bytes for 11 regions"},
		{name: "long bitmap", mod: func(s *state) { s.Have = make([]byte, 3) }, want: "bitmap of 3 bytes"},
		{name: "bits past the end", mod: func(s *state) { s.Have[1] |= 0x80 }, want: "past the end"},
		{name: "negative size", mod: func(s *state) { s.Size = -1 }, want: "size -1"},
		{name: "tiny region", mod: func(s *state) { s.Region = 1 }, want: "region 1"},
		{name: "too many regions", mod: func(s *state) { s.Region = 4096; s.Size = 4096 * (maxRegions + 1) }, want: "regions of 4096 bytes"},
		{name: "bad digest", mod: func(s *state) { s.Digest = "zz" }, want: "malformed digest"},
		{name: "digest of other hashes", mod: func(s *state) { s.Digest = strings.Repeat("ab", hashLen) }, want: "do not make the digest"},
		{name: "unknown scheme", mod: func(s *state) { s.Hashing = "md5-list" }, want: `unknown scheme "md5-list"`},
		{name: "regions without hashes", mod: func(s *state) { s.Hashed = false }, want: "no region hashes"},
		{name: "version", mod: func(s *state) { s.Version = 1 }, want: "version 1"},
		{name: "hashes of another file", edit: func(b []byte) []byte { b[hashesAt]++; return b }, want: "do not match their manifest"},
		{name: "hashes cut short", edit: func(b []byte) []byte { return b[:len(b)-hashLen] }, want: "want 4448 for 11 regions"},
		{name: "file cut short", edit: func(b []byte) []byte { return b[:slotSize] }, want: "shorter than its two slots"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := sampleState(size, region, 3)
			st.Seq = 1
			b := encodeState(st)
			if tc.mod != nil {
				tc.mod(st)
				copy(b[slotSize:], encodeSlot(st)) // seq 1's slot
			}
			if tc.edit != nil {
				b = tc.edit(b)
			}
			got, err := decodeState(b)
			if tc.want != "" {
				require.ErrorIs(t, err, errState)
				require.ErrorContains(t, err, tc.want)
				return
			}
			require.NoError(t, err)
			require.Equal(t, st, got)
			require.Equal(t, 3, countRegions(got.Have, 11))
		})
	}
	t.Run("torn newer slot", func(t *testing.T) {
		st := sampleState(size, region, 3)
		st.Seq = 4
		b := encodeState(st)
		st.Seq = 5
		setRegion(st.Have, 3)
		copy(b[slotSize:], encodeSlot(st))
		got, err := decodeState(b)
		require.NoError(t, err)
		require.Equal(t, uint64(5), got.Seq)
		require.Equal(t, 4, countRegions(got.Have, 11))
		b[slotSize+10] ^= 1 // spoils the newer slot's checksum
		got, err = decodeState(b)
		require.NoError(t, err)
		require.Equal(t, uint64(4), got.Seq)
		require.Equal(t, 3, countRegions(got.Have, 11))
	})
	t.Run("slot of the wrong parity", func(t *testing.T) {
		st := sampleState(size, region, 3)
		st.Seq = 2
		b := encodeState(st)
		copy(b[slotSize:], b[:slotSize])
		copy(b, bytes.Repeat([]byte{' '}, slotSize))
		_, err := decodeState(b)
		require.ErrorContains(t, err, "sequence number 2 in slot 1")
	})
	t.Run("the largest state fits a slot", func(t *testing.T) {
		st := &state{Version: stateVersion, Seq: math.MaxUint64, Size: math.MaxInt64, Region: math.MaxInt64, Hashed: true,
			Digest: strings.Repeat("f", 2*hashLen), Hashing: hashChain, Manifest: strings.Repeat("f", 2*hashLen), Have: bytes.Repeat([]byte{0xff}, maxRegions/8)}
		require.NotPanics(t, func() { encodeSlot(st) })
	})
	for _, b := range [][]byte{nil, make([]byte, hashesAt), bytes.Repeat([]byte{' '}, hashesAt+hashLen)} {
		_, err := decodeState(b)
		require.ErrorIs(t, err, errState)
	}
}

// The state decoder never panics, and what it accepts is consistent: the
// bitmap covers exactly the regions, the hashes match the manifest, and
// it encodes back to itself. An input is the JSON of a slot (mutations
// would rarely keep a checksum, and a whole file is over 4 KiB, slow to
// minimize): it is tried as it is, as a slot with its checksum, and as
// the two slots of a file with the region hashes after them.
func FuzzState(f *testing.F) {
	for _, c := range []struct {
		size, region int64
		have         int
	}{{0, 4096, 0}, {1, 4096, 1}, {10<<20 + 5, 1 << 20, 3}, {8 << 20, 1 << 20, 8}} {
		st := sampleState(c.size, c.region, c.have)
		st.Seq = 2
		f.Add(mustJSON(st))
	}
	f.Add([]byte(`{"size":8388608,"have":""}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		check := func(st *state, err error) { checkDecoded(t, st, err) }
		check(decodeState(b))
		check(decodeSlot(b))
		j := fmt.Appendf(bytes.Clone(b), "\n%s\n", sha256Hex(b))
		st, err := decodeSlot(j)
		check(st, err)
		if len(j) > slotSize {
			return
		}
		// Both slots the same (one has the wrong parity), then the hashes
		// of the layout the slot says, if it says one.
		slot := append(j, bytes.Repeat([]byte{' '}, slotSize-len(j))...)
		file := append(bytes.Clone(slot), slot...)
		if err == nil {
			h := sampleState(st.Size, st.Region, 0).Hashes
			file = append(file, h...)
		}
		check(decodeState(file))
	})
}

// checkDecoded checks what the decoder returned: an errState, or a
// consistent state that encodes back to itself.
func checkDecoded(t *testing.T, st *state, err error) {
	if err != nil {
		require.ErrorIs(t, err, errState)
		return
	}
	n := regions(st.Size, st.Region)
	require.Len(t, st.Have, (n+7)/8)
	require.LessOrEqual(t, countRegions(st.Have, n+8), n)
	if !st.Hashed {
		require.Zero(t, countRegions(st.Have, n))
	}
	if st.Hashes != nil {
		require.True(t, st.Hashed)
		require.Len(t, st.Hashes, n*hashLen)
		require.Equal(t, st.Manifest, sha256Hex(st.Hashes))
	}
	again, err := decodeSlot(encodeSlot(st))
	require.NoError(t, err)
	again.Hashes = st.Hashes // not in a slot
	require.Equal(t, st, again)
	if st.Hashes != nil || !st.Hashed {
		again, err = decodeState(encodeState(st))
		require.NoError(t, err)
		require.Equal(t, st, again)
	}
}

// Bytes of the partial output changed between runs (a bad disk, a stray
// write): the rerun finds the regions that no longer match the sender's
// hashes, fetches them again, and the file arrives intact.
func TestRepairCorruptPartial(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	rctx, stopRecv := context.WithCancel(ctx)
	defer stopRecv()
	r := start(rctx, f.recvArgs()...)
	waitListening(t, f.addr)
	s := f.sender(ctx)
	waitRegions(t, f.out, 3, r, s)
	stopRecv()
	require.ErrorContains(t, r.wait(t), "run again to resume")
	require.Error(t, s.wait(t))
	have := haveRegions(t, f.out)

	p, err := os.OpenFile(partPath(f.out), os.O_RDWR, 0)
	require.NoError(t, err)
	_, err = p.WriteAt([]byte("corrupted"), 1<<20+12345) // region 1, in place
	require.NoError(t, err)
	require.NoError(t, p.Close())

	r = start(ctx, f.recvArgs()...)
	waitListening(t, f.addr)
	rep := f.requireDone(t, f.sender(ctx), r)
	require.Equal(t, int64(have-1)<<20, rep.Resumed, "all but the corrupted region were kept")
	require.Contains(t, r.stderr.String(), "do not match their hashes")
}

// The file's digest is its region hashes': a file whose regions all
// checked out as they arrived is verified without hashing it again, one
// with a region that did not is not (that region stays unmarked, for the
// next run to fetch), and hashes that do not make the offer's digest are
// refused before anything is checked against them. Both schemes.
func TestVerifyByHashes(t *testing.T) {
	const size, region = 3<<20 + 7, 1 << 20
	data := bytes.Repeat([]byte("haul"), size/4+1)[:size]
	for _, h := range hashings {
		for _, tc := range []struct {
			name    string
			corrupt int // region to change before it is checked; -1 none
			want    string
			left    int // regions marked after
		}{
			{"all regions good", -1, "", 4},
			{"one region bad", 2, "1 regions are missing or did not match", 3},
		} {
			t.Run(h.label()+"/"+tc.name, func(t *testing.T) {
				out := filepath.Join(t.TempDir(), "out")
				sum, hashes := h.file(data, region)
				off := &offer{Size: size, Digest: sum, Hashing: h.name(), Region: region, Manifest: sha256Hex(hashes), K: 32}
				o, err := createOutput(out, off, newLogger(io.Discard))
				require.NoError(t, err)
				defer o.close()
				require.NoError(t, o.mapFile())
				require.NoError(t, o.setHashes(hashes))
				copy(o.mm, data)
				if tc.corrupt >= 0 {
					o.mm[tc.corrupt*region+5] ^= 0xff
				}
				for i := range o.regions() {
					ok, err := o.complete(i)
					require.NoError(t, err)
					require.Equal(t, i != tc.corrupt, ok, "region %d", i)
				}
				got, err := o.verify()
				if tc.want == "" {
					require.NoError(t, err)
					require.Equal(t, sum, got)
				} else {
					require.ErrorContains(t, err, tc.want)
				}
				require.Equal(t, tc.left, haveRegions(t, out))
			})
		}
		t.Run(h.label()+"/hashes make another digest", func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "out")
			_, hashes := h.file(data, region)
			off := &offer{Size: size, Digest: strings.Repeat("0", 2*hashLen), Hashing: h.name(), Region: region, Manifest: sha256Hex(hashes), K: 32}
			o, err := createOutput(out, off, newLogger(io.Discard))
			require.NoError(t, err)
			defer o.close()
			require.ErrorContains(t, o.setHashes(hashes), "do not match its offer")
		})
	}
}

// A region that arrives not matching its hash is not marked, and the run
// says the next one fetches it again.
func TestCorruptRegionNotKept(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out")
	data := bytes.Repeat([]byte{7}, 2<<20)
	sum, hashes := blake3List{}.file(data, 1<<20)
	o, err := createOutput(out, &offer{Size: 2 << 20, Digest: sum, Hashing: hashBlake3, Region: 1 << 20, Manifest: sha256Hex(hashes), K: 32}, newLogger(io.Discard))
	require.NoError(t, err)
	defer o.close()
	require.NoError(t, o.mapFile())
	require.ErrorContains(t, o.setHashes(hashes[1:]), "do not match its offer")
	require.NoError(t, o.setHashes(hashes))
	copy(o.mm, data)
	o.mm[100] = 8
	ok, err := o.complete(0)
	require.NoError(t, err)
	require.False(t, ok)
	ok, err = o.complete(1)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, 1, haveRegions(t, out))
}

// A sender killed mid-transfer and restarted through the same running
// linkem finishes the same receiver's transfer: after the receiver found
// it gone (it waits --wait for it), or before (the new one takes over).
func TestResumeSameReceiver(t *testing.T) {
	for _, tc := range []struct {
		name      string
		recvArgs  []string
		afterKill func(t *testing.T, r *proc)
		says      string
	}{
		{"after the timeout", []string{"--peer-timeout", silentPeer, "--wait", "1m"}, func(t *testing.T, r *proc) {
			require.Eventually(t, func() bool { return strings.Contains(r.stderr.String(), "waiting for the sender to resume") },
				30*time.Second, 5*time.Millisecond)
		}, "waiting for the sender to resume"},
		{"takeover", nil, func(*testing.T, *proc) {}, "a sender connected again"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			ctx := context.Background()
			r := start(ctx, f.recvArgs(tc.recvArgs...)...)
			waitListening(t, f.addr)
			sctx, kill := context.WithCancel(ctx)
			s := f.sender(sctx)
			waitRegions(t, f.out, 3, r, s)
			kill()
			require.Error(t, s.wait(t))
			tc.afterKill(t, r)
			// A new sender, on a new port, through the same linkem.
			rep := f.requireDone(t, f.sender(ctx), r)
			require.GreaterOrEqual(t, rep.Resumed, int64(3<<20))
			require.Contains(t, r.stderr.String(), tc.says)
			_, ba := f.l.Stats()
			require.GreaterOrEqual(t, ba.NewPeers, uint64(1), "linkem learned the receiver")
			ab, _ := f.l.Stats()
			require.Equal(t, uint64(2), ab.NewPeers, "linkem learned the new sender")
		})
	}
}

// A receiver whose sender does not come back within --wait gives up and
// says what it kept.
func TestWaitExpires(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	r := start(ctx, f.recvArgs("--peer-timeout", silentPeer, "--wait", "200ms")...)
	waitListening(t, f.addr)
	sctx, kill := context.WithCancel(ctx)
	s := f.sender(sctx)
	waitRegions(t, f.out, 1, r, s)
	kill()
	require.Error(t, s.wait(t))
	err := r.wait(t)
	require.ErrorIs(t, err, errSenderGone)
	require.ErrorIs(t, err, errNoSender)
	require.ErrorContains(t, err, "within 200ms")
	require.ErrorContains(t, err, "run again to resume")
}

// A disk that fills during the transfer (another writer takes the rest
// of a small tmpfs) does not stop it: its space was reserved.
func TestDiskFillsMidTransfer(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a small tmpfs")
	}
	f := newFixture(t)
	mnt := filepath.Join(f.dir, "tiny")
	require.NoError(t, os.Mkdir(mnt, 0o755))
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size=12m"); err != nil {
		t.Skipf("cannot mount tmpfs: %v", err)
	}
	defer syscall.Unmount(mnt, 0)
	f.out = filepath.Join(mnt, "out")
	ctx := context.Background()
	r := start(ctx, f.recvArgs()...)
	waitListening(t, f.addr)
	s := f.sender(ctx)
	waitRegions(t, f.out, 2, r, s)
	filler, err := os.Create(filepath.Join(mnt, "filler"))
	require.NoError(t, err)
	chunk := make([]byte, 64<<10)
	for {
		if _, err := filler.Write(chunk); err != nil {
			require.ErrorIs(t, err, syscall.ENOSPC)
			break
		}
	}
	require.NoError(t, filler.Close())
	f.requireDone(t, s, r)
}

// The sender picks a region size that keeps a large file within
// maxRegions, and refuses an explicit one that does not.
func TestPickRegion(t *testing.T) {
	for _, tc := range []struct {
		flag, size, want int64
		err              string
	}{
		{0, 100, 16 << 20, ""},
		{0, 64 << 30, 16 << 20, ""},
		{0, 64<<30 + 1, 17 << 20, ""},
		{1 << 20, 4 << 30, 1 << 20, ""},
		{1 << 20, 4<<30 + 1, 0, "4097 regions, at most 4096: use a larger --region"},
		{0, 1 << 50, 0, "too large"},
	} {
		got, err := pickRegion(tc.flag, tc.size)
		if tc.err != "" {
			require.ErrorContains(t, err, tc.err)
			continue
		}
		require.NoError(t, err)
		require.Equal(t, tc.want, got, "flag %d size %d", tc.flag, tc.size)
		require.LessOrEqual(t, regions(tc.size, got), maxRegions)
	}
}

// An empty file crosses too: no regions, no hashes to send.
func TestEmptyFile(t *testing.T) {
	dir := t.TempDir()
	in, out := filepath.Join(dir, "in"), filepath.Join(dir, "out")
	require.NoError(t, os.WriteFile(in, nil, 0o644))
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	ctx := context.Background()
	r := start(ctx, "recv", "--listen", addr, "--out", out)
	waitListening(t, addr)
	s := start(ctx, "send", "--to", addr, in)
	require.NoError(t, s.wait(t), s.stderr.String())
	require.NoError(t, r.wait(t), r.stderr.String())
	fi, err := os.Stat(out)
	require.NoError(t, err)
	require.Zero(t, fi.Size())
	_, err = os.Stat(statePath(out))
	require.ErrorIs(t, err, os.ErrNotExist)
}
