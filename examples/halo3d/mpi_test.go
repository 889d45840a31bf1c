package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestSameChecksumsAsMPI builds bench/mpi/halo3d.c, the same problem
// written against MPI, with MPICH and checks that every variant's checksum
// equals this program's bit for bit (both add the ranks' sums in rank
// order), for one rank and for four (a 2x2x1 grid, a cubic and a
// non-cubic block), as --json reports them and as the summary lines print
// them. scripts/halo3d-vs-mpi.sh does the same at any size, under Open MPI
// too, and times both.
func TestSameChecksumsAsMPI(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the programs")
	}
	mpicc, err1 := exec.LookPath("mpicc.mpich")
	hydra, err2 := exec.LookPath("mpiexec.hydra")
	if err1 != nil || err2 != nil {
		t.Skip("mpicc.mpich and mpiexec.hydra are not on PATH (Debian: apt-get install mpich libmpich-dev): " +
			"skipping the comparison with bench/mpi/halo3d.c")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	bin := func(name string) string { return filepath.Join(dir, name) }
	build := func(args ...string) {
		out, err := exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput()
		require.NoError(t, err, "%v: %s", args, out)
	}
	build(mpicc, "-O2", "-o", bin("halo3d_mpich"), "../../bench/mpi/halo3d.c")
	build("go", "build", "-o", bin("rvmarun"), "../../cmd/rvmarun")
	build("go", "build", "-o", bin("halo3d"), ".")

	run := func(name string, args ...string) string {
		cmd := exec.CommandContext(ctx, args[0], args[1:]...)
		// MPICH: ranks started here, by fork, its UCX on loopback.
		cmd.Env = append(os.Environ(), "HYDRA_LAUNCHER=fork", "UCX_NET_DEVICES=lo")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		require.NoError(t, err, "%s: %s%s", name, out, stderr.String())
		return string(out)
	}
	rvma := func(ranks string, args ...string) string {
		return run("rvma", append([]string{bin("rvmarun"), "-n", ranks, "--tag-output=false", bin("halo3d")}, args...)...)
	}
	mpi := func(ranks string, args ...string) string {
		return run("MPICH", append([]string{hydra, "-iface", "lo", "-bind-to", "none", "-n", ranks, bin("halo3d_mpich")}, args...)...)
	}

	type result struct {
		Example   string
		Sync      string
		Ranks     int
		Dims      string
		N         int
		Iters     int
		Warmup    int
		Compute   bool
		USPerIter float64 `json:"us_per_iter"`
		Checksum  float64
		OK        bool
	}
	parse := func(out string) map[string]result {
		rs := map[string]result{}
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			var r result
			require.NoError(t, json.Unmarshal([]byte(line), &r), line)
			require.True(t, r.OK, line)
			rs[r.Sync] = r
		}
		return rs
	}
	for _, c := range []struct {
		ranks string
		args  []string
	}{
		{"1", []string{"-n", "8", "--iters", "5", "--warmup", "1"}},
		{"4", []string{"-n", "8", "--iters", "5", "--warmup", "1"}},
		{"4", []string{"-l", "7,4,5", "--iters", "4", "--warmup", "2"}},
	} {
		name := c.ranks + " ranks " + strings.Join(c.args, " ")
		args := append(c.args, "--json")
		got, want := parse(mpi(c.ranks, args...)), parse(rvma(c.ranks, args...))
		require.Len(t, want, 6, "%s: rvma's five variants and serial-ref", name)
		require.Len(t, got, 5, "%s: MPI's four variants and serial-ref", name)
		for sync, g := range got {
			w, ok := want[sync]
			require.True(t, ok, "%s: MPI ran %q", name, sync)
			g.USPerIter, w.USPerIter = 0, 0
			require.Equal(t, w, g, "%s, %s: MPI's result against rvma's", name, sync)
		}
		t.Logf("%s: checksum %v, serial %v, in both", name, want["sendrecv"].Checksum, want["serial-ref"].Checksum)
	}

	// The summary lines print the same checksums with the same digits.
	line := regexp.MustCompile(`(?m)^  (\S+) +[0-9.]+ us/iter.*  checksum (\S+)  ok=(\S+)`)
	sums := func(out string) map[string]string {
		m := map[string]string{}
		for _, l := range line.FindAllStringSubmatch(out, -1) {
			m[l[1]] = l[2] + " ok=" + l[3]
		}
		return m
	}
	args := []string{"-l", "6,5,4", "--iters", "3", "--warmup", "1"}
	got := sums(mpi("1", args...))
	want := sums(rvma("1", args...))
	require.Len(t, got, 5)
	for sync, g := range got {
		require.Equal(t, want[sync], g, sync)
	}

	// notify is rvma's: the MPI program refuses it.
	cmd := exec.CommandContext(ctx, bin("halo3d_mpich"), "--sync", "notify")
	out, err := cmd.CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), "notify is rvma's notified window")
}
