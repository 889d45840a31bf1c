package main

import (
	"encoding/json"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// haloResult is one --json line of halo3d.
type haloResult struct {
	Sync       string
	Checksum   float64
	OK         bool
	Checkpoint int
	Recoveries int
}

// haloRun runs halo3d --sync notify --json under rvmarun and returns its
// notify and serial-ref lines (the latter zero with --serial=false) and
// rvmarun's stderr, requiring exit 0.
func haloRun(t *testing.T, rvmarun []string, halo ...string) (notify, serial haloResult, stderr string) {
	t.Helper()
	args := append(append(rvmarun, "--tag-output=false", filepath.Join(bins, "halo3d")), append([]string{"--sync", "notify", "--json"}, halo...)...)
	out, stderr, code := runJob(t, args...)
	require.Equal(t, 0, code, "%s%s", out, stderr)
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var r haloResult
		require.NoError(t, json.Unmarshal([]byte(line), &r), line)
		switch r.Sync {
		case "notify":
			notify = r
		case "serial-ref":
			serial = r
		}
	}
	require.Equal(t, "notify", notify.Sync, out)
	return notify, serial, stderr
}

// halo3d --sync notify --checkpoint N under rvmarun --restart 1: a rank
// killed with SIGKILL (by itself in a given iteration, or by rvmarun
// --kill at a time) is respawned, every rank recovers once, and the
// checksum equals the fault-free run's bit for bit (and the serial
// solution's), over shared memory and over UDP, at 4 and 8 ranks.
func TestHalo3DRecovers(t *testing.T) {
	// Small blocks, so that a run takes well under a second.
	small := []string{"-n", "8", "--iters", "40", "--warmup", "4"}
	// Fault-free checksums, without --checkpoint (today's program) and
	// with it.
	want := map[int]float64{}
	for _, ranks := range []int{4, 8} {
		plain, serial, _ := haloRun(t, []string{"-n", strconv.Itoa(ranks)}, small...)
		require.True(t, plain.OK && serial.OK, "%+v %+v", plain, serial)
		require.Zero(t, plain.Recoveries)
		ck, _, _ := haloRun(t, []string{"-n", strconv.Itoa(ranks)}, append(small, "--checkpoint", "2")...)
		require.Equal(t, plain.Checksum, ck.Checksum, "--checkpoint without a failure changes the result")
		require.Zero(t, ck.Recoveries)
		want[ranks] = plain.Checksum
	}
	for _, tc := range []struct {
		provider         string
		ranks            int
		failRank, failAt string // --fail-rank, --fail-step
		checkpoint       string
	}{
		{"shm", 4, "1", "9", "2"},  // mid-run, between checkpoints
		{"udp", 4, "2", "9", "2"},  //
		{"shm", 4, "0", "1", "2"},  // before the first checkpoint: back to epoch 0
		{"udp", 4, "3", "44", "2"}, // the last iteration
		{"shm", 8, "5", "12", "2"}, // a 2x2x2 grid
		{"udp", 4, "1", "17", "3"}, // an odd interval: both arrays in the window
	} {
		t.Run(tc.provider+"/"+strconv.Itoa(tc.ranks)+"ranks/rank"+tc.failRank+"@"+tc.failAt+"/checkpoint"+tc.checkpoint, func(t *testing.T) {
			notify, serial, stderr := haloRun(t, []string{"-n", strconv.Itoa(tc.ranks), "--provider", tc.provider, "--restart", "1"},
				append(small, "--checkpoint", tc.checkpoint, "--fail-rank", tc.failRank, "--fail-step", tc.failAt)...)
			require.Equal(t, 1, notify.Recoveries, stderr)
			require.Equal(t, want[tc.ranks], notify.Checksum, stderr)
			require.True(t, notify.OK, stderr)
			require.True(t, serial.OK, "%+v %s", serial, stderr)
			require.Contains(t, stderr, "rank "+tc.failRank+" (incarnation 0) killed by signal 9")
			require.Contains(t, stderr, "halo3d: rank "+tc.failRank+" (incarnation 1) restored its window at iteration")
		})
	}
	// rvmarun --kill, from outside, at a time: the run lasts well over a
	// second (about half of it the reference, half the notify variant,
	// both recover), the kill comes after the windows are made.
	t.Run("udp/4ranks/--kill", func(t *testing.T) {
		long := []string{"-n", "8", "--iters", "3000", "--warmup", "10", "--serial=false"}
		plain, _, _ := haloRun(t, []string{"-n", "4", "--provider", "udp"}, long...)
		notify, _, stderr := haloRun(t, []string{"-n", "4", "--provider", "udp", "--restart", "1", "--kill", "2@400ms"},
			append(long, "--checkpoint", "2")...)
		require.Contains(t, stderr, "rvmarun: killing rank 2 (incarnation 0) with SIGKILL at 400ms")
		require.Equal(t, 1, notify.Recoveries, stderr)
		require.Equal(t, plain.Checksum, notify.Checksum, stderr)
		require.True(t, notify.OK, stderr)
	})
	// Without --restart a death ends the job, as before.
	out, stderr, code := runJob(t, append([]string{"-n", "4", "--tag-output=false", filepath.Join(bins, "halo3d"), "--sync", "notify"},
		append(small, "--checkpoint", "2", "--fail-rank", "1", "--fail-step", "5")...)...)
	require.NotEqual(t, 0, code, out)
	require.Contains(t, stderr, "rank 1 failed")
}

// --checkpoint is for the notify variant alone.
func TestHalo3DCheckpointFlags(t *testing.T) {
	for _, tc := range []struct{ args, want string }{
		{"--sync fence,notify --checkpoint 2", "--checkpoint applies to --sync notify alone"},
		{"--sync notify --checkpoint -1", "--checkpoint -1: want 0 (off) or more"},
	} {
		_, stderr, code := runJob(t, append([]string{"-n", "1", "--tag-output=false", filepath.Join(bins, "halo3d")}, strings.Fields(tc.args)...)...)
		require.NotEqual(t, 0, code, tc.args)
		require.Contains(t, stderr, tc.want, tc.args)
	}
}
