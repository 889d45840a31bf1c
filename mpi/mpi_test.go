// Package mpi_test checks libmpi, rvma's MPI compatibility library (C over
// librvma; mpi/ has no Go code but this test): it builds librvma and
// libmpi into a temporary directory, compiles the repository's MPI
// programs (bench/mpi) unmodified with rvmacc and the C tests (test/*.c),
// and runs them under rvmarun.
package mpi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/internal/testutil"
)

// builds is what the tests build once (removed by TestMain).
var builds testutil.Built

func TestMain(m *testing.M) { builds.Main(m) }

// built builds librvma, libmpi, rvmarun, the Go halo3d and the C programs
// once, and returns where.
func built(t *testing.T) string {
	t.Helper()
	return builds.Dir(t, "the MPI library's tests", buildAll)
}

func buildAll() (string, error) {
	dir, err := os.MkdirTemp("", "mpi-test")
	if err != nil {
		return "", err
	}
	run := func(env []string, name string, args ...string) error {
		cmd := exec.Command(name, args...)
		cmd.Env = append(os.Environ(), env...)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
		return nil
	}
	lib := filepath.Join(dir, "lib")
	steps := [][]string{
		{"go", "build", "-buildmode=c-shared", "-o", filepath.Join(lib, "librvma.so"), "../capi"},
		{"go", "build", "-o", filepath.Join(dir, "rvmarun"), "../cmd/rvmarun"},
		{"go", "build", "-o", filepath.Join(dir, "halo3d_go"), "../examples/halo3d"},
	}
	for _, s := range steps {
		if err := run(nil, s[0], s[1:]...); err != nil {
			return dir, err
		}
	}
	// libmpi as the Makefile builds it.
	srcs, _ := filepath.Glob("src/*.c")
	args := []string{"-shared", "-fPIC", "-O2", "-g", "-std=c11", "-Wall", "-Wextra", "-Werror", "-pthread",
		"-Iinclude", "-Isrc", "-I../capi/include", "-o", filepath.Join(lib, "libmpi.so")}
	args = append(append(args, srcs...), "-L"+lib, "-lrvma", "-Wl,-rpath,$ORIGIN")
	if err := run(nil, testutil.CC(), args...); err != nil {
		return dir, err
	}
	// Headers where rvmacc looks for them.
	env := []string{"RVMA_LIBDIR=" + lib, "RVMA_INCDIR=" + filepath.Join(dir, "include"), "RVMA_CC=" + testutil.CC()}
	if err := os.MkdirAll(filepath.Join(dir, "include"), 0o755); err != nil {
		return dir, err
	}
	for _, h := range []string{"include/mpi.h", "include/mpix_rvma.h", "../capi/include/rvma.h"} {
		b, err := os.ReadFile(h)
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, "include", filepath.Base(h)), b, 0o644)
		}
		if err != nil {
			return dir, err
		}
	}
	// The repository's MPI programs, unmodified, as their comments build
	// them; our tests with warnings as errors.
	for _, p := range []string{"halo3d", "rma_bench", "hello"} {
		if err := run(env, "./rvmacc", "-O2", "-o", filepath.Join(dir, p), "../bench/mpi/"+p+".c"); err != nil {
			return dir, err
		}
	}
	tests, _ := filepath.Glob("test/*.c")
	for _, f := range tests {
		p := strings.TrimSuffix(filepath.Base(f), ".c")
		if err := run(env, "./rvmacc", "-std=c11", "-O1", "-g", "-Wall", "-Wextra", "-Werror", "-o", filepath.Join(dir, p), f); err != nil {
			return dir, err
		}
	}
	return dir, nil
}

// job runs prog under rvmarun with n ranks and returns its stdout (ranks'
// lines untagged); it fails the test if the job fails.
func job(t *testing.T, dir string, n int, prog string, args ...string) string {
	t.Helper()
	out, errb, err := jobErr(dir, n, prog, args...)
	if err != nil {
		t.Fatalf("rvmarun -n %d %s %s: %v\nstdout:\n%s\nstderr:\n%s", n, prog, strings.Join(args, " "), err, out, errb)
	}
	return out
}

func jobErr(dir string, n int, prog string, args ...string) (string, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	a := append([]string{"-n", fmt.Sprint(n), "--tag-output=false", filepath.Join(dir, prog)}, args...)
	cmd := exec.CommandContext(ctx, filepath.Join(dir, "rvmarun"), a...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	return out.String(), errb.String(), err
}

type halo struct {
	Sync     string
	Ranks    int
	Dims     string
	Checksum float64
	OK       bool
}

func parseHalo(t *testing.T, out string) map[string]halo {
	t.Helper()
	rs := map[string]halo{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var r halo
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("%v: %q", err, line)
		}
		if !r.OK {
			t.Fatalf("not ok: %s", line)
		}
		rs[r.Sync] = r
	}
	return rs
}

// TestHalo3d runs bench/mpi/halo3d.c built with rvmacc and checks that
// every variant's checksum equals examples/halo3d's (the Go program on
// rvma) for the same arguments, bit for bit: both add the ranks' sums in
// rank order. examples/halo3d's own test ties the Go program to MPICH.
func TestHalo3d(t *testing.T) {
	dir := built(t)
	for _, c := range []struct {
		ranks int
		args  []string
	}{
		{2, []string{"-n", "6", "--iters", "4", "--warmup", "1"}},
		{4, []string{"-n", "8", "--iters", "5", "--warmup", "1"}},
		{4, []string{"-l", "7,4,5", "--iters", "4", "--warmup", "2"}},
	} {
		args := append(c.args, "--json")
		got := parseHalo(t, job(t, dir, c.ranks, "halo3d", args...))
		want := parseHalo(t, job(t, dir, c.ranks, "halo3d_go", args...))
		if len(got) != 5 {
			t.Fatalf("%d ranks %v: %d results, want the 4 variants and serial-ref: %v", c.ranks, c.args, len(got), got)
		}
		for sync, g := range got {
			if w, ok := want[sync]; !ok || w != g {
				t.Errorf("%d ranks %v, %s: rvmacc's %+v, Go's %+v", c.ranks, c.args, sync, g, w)
			}
		}
		t.Logf("%d ranks %v: checksum %v in both", c.ranks, c.args, got["sendrecv"].Checksum)
	}
}

// TestRMABench runs every test of bench/mpi/rma_bench.c on 2 ranks, briefly,
// and checks that each reports a result (the atomics' tests check the
// target word themselves and abort if it is wrong).
func TestRMABench(t *testing.T) {
	dir := built(t)
	tests := []string{"rma_put_flush_lat", "rma_get_lat", "rma_acc_lat", "rma_fop_lat", "rma_cas_lat",
		"rma_put_notify_lat", "rma_put_rate"}
	out := job(t, dir, 2, "rma_bench", strings.Join(tests, ","), "--iters", "200", "--size", "8,4096", "--json")
	seen := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var r struct {
			Test    string
			Size    int
			Iters   int
			Seconds float64
		}
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("%v: %q", err, line)
		}
		if r.Iters <= 0 || r.Seconds <= 0 {
			t.Errorf("no result: %s", line)
		}
		seen[r.Test]++
	}
	for _, tt := range tests {
		// one per size (the atomics' tests move 8 bytes whatever it is)
		if seen[tt] != 2 {
			t.Errorf("%s: %d results, want 2\n%s", tt, seen[tt], out)
		}
	}
}

func TestHello(t *testing.T) {
	dir := built(t)
	for _, n := range []int{2, 4} {
		if out := job(t, dir, n, "hello"); !strings.Contains(out, fmt.Sprintf("hello from %d ranks", n)) {
			t.Fatalf("%d ranks: %q", n, out)
		}
	}
}

// TestErrors runs test/errors.c (error classes under MPI_ERRORS_RETURN,
// then values) on 2 and 4 ranks, and its fatal mode: a window's default
// handler aborts the job with the class's message.
func TestErrors(t *testing.T) {
	dir := built(t)
	for _, n := range []int{2, 4} {
		if out := job(t, dir, n, "errors"); !strings.Contains(out, fmt.Sprintf("errors: ok on %d ranks", n)) {
			t.Fatalf("%d ranks: %q", n, out)
		}
	}
	// Under MPI_ERRORS_ARE_FATAL each bad call aborts the job, naming
	// the call and the class.
	for _, c := range []struct{ name, call, class string }{
		{"rank", "MPI_Put", "MPI_ERR_RANK"},
		{"type", "MPI_Get", "MPI_ERR_TYPE"},
		{"disp", "MPI_Accumulate", "MPI_ERR_DISP"},
		{"range", "MPI_Get", "MPI_ERR_RMA_RANGE"},
		{"sync", "MPI_Put", "MPI_ERR_RMA_SYNC"},
		{"win", "MPI_Win_flush", "MPI_ERR_WIN"},
		{"size", "MPI_Win_allocate", "MPI_ERR_SIZE"},
	} {
		out, errb, err := jobErr(dir, 2, "errors", "fatal", c.name)
		require.Error(t, err, "fatal %s: the job did not fail\nstdout:\n%s\nstderr:\n%s", c.name, out, errb)
		require.NotContains(t, out, "not reached", c.name)
		require.Contains(t, errb, c.call+": ", c.name)
		require.Contains(t, errb, c.class+": ", c.name)
	}
}

// TestHeaderCompiles checks that mpi.h stands alone in strict C99 and C++.
func TestHeaderCompiles(t *testing.T) {
	testutil.HeaderCompiles(t, "include", "#include \"mpi.h\"\n#include \"mpix_rvma.h\"\nint main(void) { return MPI_SUCCESS + MPIX_RVMA - 1; }\n")
}

// TestP2P runs test/p2p.c (wildcard receives, testable requests, MPI's
// matching order) on 2, 3 and 4 ranks.
func TestP2P(t *testing.T) {
	dir := built(t)
	for _, n := range []int{2, 3, 4} {
		require.Contains(t, job(t, dir, n, "p2p"), fmt.Sprintf("p2p: ok on %d ranks", n))
	}
}

// cTest runs the C test prog on 2 and 4 ranks over shm and on 3 over udp
// (told the provider it must see, with withProvider), which must print
// "PROG: ok on N ranks".
func cTest(t *testing.T, prog string, withProvider bool) {
	t.Helper()
	dir := built(t)
	for _, c := range []struct {
		n        int
		provider string
	}{{2, "shm"}, {4, "shm"}, {3, "udp"}} {
		args := []string{filepath.Join(dir, "rvmarun"), "-n", fmt.Sprint(c.n), "--provider", c.provider, "--tag-output=false",
			filepath.Join(dir, prog)}
		if withProvider {
			args = append(args, c.provider)
		}
		out := run(t, args...)
		require.Contains(t, out, fmt.Sprintf("%s: ok on %d ranks", prog, c.n), c.provider)
	}
}

// TestManyOps runs test/manyops.c: more accumulates in one epoch than a
// queue holds, both ways between neighbours, and a transpose made of
// 90000 one-element READs before a fence, on windows over the program's
// memory; values checked.
func TestManyOps(t *testing.T) {
	cTest(t, "manyops", false)
}

// TestNarrow runs test/narrow.c: accumulates and atomics on 1- and 2-byte
// integers (what osu_acc_latency uses), values checked byte by byte.
func TestNarrow(t *testing.T) {
	cTest(t, "narrow", false)
}

// TestMPIX runs test/mpix.c (mpix_rvma.h: notified windows, rewind, the
// transport report) on 2 and 4 ranks over shm, and on 3 over udp, each
// told the provider it must see.
func TestMPIX(t *testing.T) {
	cTest(t, "mpix", true)
}

// TestSubarray runs test/subarray.c (subarray faces of a 3-D array put,
// rput and got across ranks, values checked; Cartesian grids) on 2 and 4
// ranks over shm and 3 over udp.
func TestSubarray(t *testing.T) {
	cTest(t, "subarray", false)
}

// TestProbe runs test/probe.c (MPI_Probe and MPI_Iprobe with wildcards
// sizing receives from their status, MPI_Cancel of receives, also one
// another thread waits for, and of a send, MPI_Test_cancelled).
func TestProbe(t *testing.T) {
	cTest(t, "probe", false)
}

// TestShared runs test/shared.c (MPI_Win_allocate_shared's contiguous
// parts through MPI_Win_shared_query, stores under fence and passive
// epochs, puts; MPI_ERR_RMA_SHARED over udp).
func TestShared(t *testing.T) {
	cTest(t, "shared", true)
}

// TestDynamic runs test/dynamic.c (MPI_Win_create_dynamic, attach and
// detach, data movement and atomics at addresses under every kind of
// epoch, and the errors).
func TestDynamic(t *testing.T) {
	cTest(t, "dynamic", false)
}

// TestDtypes runs test/dtypes.c: indexed, hindexed, indexed_block, struct
// and resized datatypes and their bounds in puts, gets, accumulates,
// get_accumulates (all three sides non-contiguous) and messages, with
// blocks that go backwards and copies that interleave; MPI_BOTTOM
// buffers; accumulates and atomics on MPI_BYTE; accumulates of no data.
func TestDtypes(t *testing.T) {
	cTest(t, "dtypes", false)
}

// TestAccops runs test/accops.c: accumulates rvma has no single atomic
// for (long double, the pairs with a gap, MINLOC and MAXLOC, the logical
// operations) from every rank at once, with sums that show a lost update;
// get_accumulate and fetch_and_op return what was there; the gaps of
// pairs untouched; the reductions of the same operations; the errors.
func TestAccops(t *testing.T) {
	cTest(t, "accops", false)
}

// TestSelfWin runs test/selfwin.c: windows over MPI_COMM_SELF in a world
// of several ranks, made and freed by each rank alone, with every kind of
// synchronisation, emulated accumulates and a shared window; values
// checked; then a window of the world.
func TestSelfWin(t *testing.T) {
	cTest(t, "selfwin", false)
}

// TestSplit runs test/split.c: MPI_Comm_split where every rank keeps the
// world's ranks or none, MPI_ERR_UNSUPPORTED_OPERATION for other splits,
// MPI_Alloc_mem, and on one rank a window over MPI_COMM_SELF.
func TestSplit(t *testing.T) {
	cTest(t, "split", false)
	// one rank: MPI_COMM_SELF is a communicator with windows
	dir := built(t)
	require.Contains(t, job(t, dir, 1, "split"), "split: ok on 1 ranks")
}

// TestWinattr runs test/winattr.c: window names; attributes of the
// program's keyvals set, replaced, deleted and deleted with the window;
// the program's window error handlers, called with the window and class.
func TestWinattr(t *testing.T) {
	cTest(t, "winattr", false)
}
