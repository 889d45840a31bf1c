package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/internal/kvs"
	"github.com/rvma/rvma/internal/launch"
	"github.com/rvma/rvma/rma"

	"github.com/rvma/rvma/internal/testutil"
)

// bins holds the example programs, built once for the launcher tests.
var bins string

// envRole makes the test binary play a rank instead: "rank" dials the
// rendezvous and says "ready PID PPID", "watch" does the same and also
// runs rma.Init's launcher watch.
const envRole = "RVMARUN_TEST_ROLE"

func TestMain(m *testing.M) {
	if role := os.Getenv(envRole); role == "transport" {
		os.Exit(reportTransports())
	} else if role == "incarnation" {
		os.Exit(playIncarnation())
	} else if role == "env" {
		fmt.Printf("%s=%s\n", rma.EnvRCTimeout, os.Getenv(rma.EnvRCTimeout))
		os.Exit(0)
	} else if role != "" {
		playRank(role)
		return
	}
	dir, err := os.MkdirTemp("", "rvmarun-test")
	if err != nil {
		panic(err)
	}
	bins = dir
	if out, err := exec.Command("go", "build", "-o", filepath.Join(dir, "rvmarun"), ".").CombinedOutput(); err != nil {
		panic(string(out))
	}
	for _, ex := range []string{"putwin", "halo3d", "rewind"} {
		out, err := exec.Command("go", "build", "-o", filepath.Join(dir, ex), "../../examples/"+ex).CombinedOutput()
		if err != nil {
			panic(string(out))
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// playRank is a rank that waits to be stopped (it gives up after two
// minutes, so that a failed test leaves nothing behind for long).
func playRank(role string) {
	ctx := context.Background()
	addr := os.Getenv(rma.EnvKVS)
	key, err := launch.KeyFromEnv()
	if err != nil {
		panic(err)
	}
	cl, err := kvs.Dial(ctx, addr, key)
	if err != nil {
		panic(err)
	}
	defer cl.Close()
	if role == "watch" {
		launch.Watch(ctx, addr, &launch.WatchConfig{Key: key})
	}
	fmt.Printf("ready %d %d\n", os.Getpid(), os.Getppid())
	time.Sleep(2 * time.Minute)
}

func runJob(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	done := make(chan int)
	go func() { done <- run(args, &out, &errb) }()
	select {
	case code := <-done:
		return out.String(), errb.String(), code
	case <-time.After(3 * time.Minute):
		t.Fatalf("rvmarun %v did not finish", args)
	}
	return "", "", -1
}

func TestPutwinTaggedOutput(t *testing.T) {
	out, stderr, code := runJob(t, "-n", "3", filepath.Join(bins, "putwin"))
	require.Equal(t, 0, code, stderr)
	for r, want := range []string{`"hello from rank 02"`, `"hello from rank 00"`, `"hello from rank 01"`} {
		prefix := "[" + string(rune('0'+r)) + "] rank " + string(rune('0'+r)) + " of 3 got " + want
		require.Contains(t, out, prefix)
	}
}

func TestFirstFailureStopsTheRest(t *testing.T) {
	start := time.Now()
	_, stderr, code := runJob(t, "-n", "3", "--grace", "200ms", "sh", "-c",
		`if [ "$RVMA_RANK" = 1 ]; then echo bye >&2; exit 3; fi; sleep 60`)
	require.Equal(t, 3, code)
	require.Contains(t, stderr, "[1] bye")
	require.Contains(t, stderr, "rank 1 failed")
	require.Less(t, time.Since(start), 30*time.Second, "the sleeping ranks were not stopped")
}

func TestUsageErrors(t *testing.T) {
	_, _, code := runJob(t, "-n", "2")
	require.Equal(t, 2, code)
	_, stderr, code := runJob(t, "-n", "2", "--provider", "loop", "true")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "one process only")
	_, _, code = runJob(t, "-n", "1", "/nonexistent/program")
	require.Equal(t, 1, code)
}

func TestHalo3DVariantsAgree(t *testing.T) {
	for _, n := range []string{"1", "2", "4"} {
		out, stderr, code := runJob(t, "-n", n, "--tag-output=false", filepath.Join(bins, "halo3d"),
			"-n", "12", "--iters", "6", "--warmup", "2", "--json")
		require.Equal(t, 0, code, stderr)
		var sums []float64
		variants := 0
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			var r struct {
				Sync     string
				Checksum float64
				OK       bool
				Ranks    int
			}
			require.NoError(t, json.Unmarshal([]byte(line), &r), line)
			require.True(t, r.OK, line)
			sums = append(sums, r.Checksum)
			if r.Sync != "serial-ref" {
				variants++
			}
		}
		require.Equal(t, 5, variants, out)
		for _, s := range sums[1:] {
			require.InEpsilon(t, sums[0], s, 1e-9)
		}
	}
}

// Over shared memory, every variant agrees with the serial solution.
func TestHalo3DOverSHM(t *testing.T) {
	requireHaloOK(t, "-n", "4", "--provider", "shm", "--tag-output=false", filepath.Join(bins, "halo3d"),
		"-n", "24", "--iters", "3", "--warmup", "1", "--json")
}

// requireHaloOK launches halo3d with --json and checks that its five
// variants and the serial reference all report ok.
func requireHaloOK(t *testing.T, args ...string) {
	t.Helper()
	out, stderr, code := runJob(t, args...)
	require.Equal(t, 0, code, stderr)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 6, out)
	for _, line := range lines {
		var r struct{ OK bool }
		require.NoError(t, json.Unmarshal([]byte(line), &r), line)
		require.True(t, r.OK, line)
	}
}

// With --paths 2 the x faces (75 KiB, contiguous) are split over two
// paths; every variant still agrees with the serial solution.
func TestHalo3DOverPaths(t *testing.T) {
	requireHaloOK(t, "-n", "2", "--paths", "2", "--tag-output=false", filepath.Join(bins, "halo3d"),
		"-n", "96", "--iters", "3", "--warmup", "1", "--json")
	_, stderr, code := runJob(t, "-n", "2", "--paths", "0", "true")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "want 1..64")
}

// A rank killed with SIGKILL in the middle of a step is respawned, every
// rank recovers, and the final state equals the fault-free answer byte for
// byte, over shared memory and over UDP.
func TestRewindRecovers(t *testing.T) {
	for _, tc := range []struct{ provider, rank, step, checkpoint string }{
		{"shm", "2", "5", "1"}, {"udp", "0", "9", "3"}, {"udp", "1", "1", "2"},
	} {
		t.Run(tc.provider+"/rank"+tc.rank, func(t *testing.T) {
			out, stderr, code := runJob(t, "-n", "4", "--provider", tc.provider, "--restart", "1", "--tag-output=false", filepath.Join(bins, "rewind"),
				"--steps", "30", "--fail-step", tc.step, "--fail-rank", tc.rank, "--checkpoint", tc.checkpoint, "--cells", "64", "--pace", "0", "--json")
			require.Equal(t, 0, code, stderr)
			var r struct {
				OK         bool
				Recoveries int
				Checksum   string
			}
			require.NoError(t, json.Unmarshal([]byte(strings.TrimSpace(out)), &r), out)
			require.True(t, r.OK, out)
			require.Equal(t, 1, r.Recoveries, stderr)
			require.Contains(t, stderr, "rank "+tc.rank+" (incarnation 0) killed by signal 9")
			require.Contains(t, stderr, "restored its window at step")
		})
	}
	// Without --restart a death ends the job, as before.
	_, stderr, code := runJob(t, "-n", "3", "--tag-output=false", filepath.Join(bins, "rewind"),
		"--steps", "30", "--fail-step", "5", "--fail-rank", "1", "--cells", "64", "--pace", "0")
	require.NotEqual(t, 0, code)
	require.Contains(t, stderr, "rank 1 failed")
}

// Hydra's mpiexec (Debian's mpich package) starts rvma programs through
// PMI: PMI-2 by default (Hydra accepts it), PMI-1 or PMI-2 when RVMA_PMI
// forces it. Hydra's -verbose trace shows which the ranks spoke.
func TestMPIExecHydra(t *testing.T) {
	hydra, err := exec.LookPath("mpiexec.hydra")
	if err != nil {
		t.Skip("mpiexec.hydra not installed (apt-get install mpich); skipping the Hydra launch test")
	}
	for _, tc := range []struct{ pmi, spoken, not string }{
		{"", "fullinit", "get_my_kvsname"}, {"1", "get_my_kvsname", "fullinit"}, {"2", "fullinit", "get_my_kvsname"},
	} {
		t.Run("RVMA_PMI="+tc.pmi, func(t *testing.T) {
			cmd := exec.Command(hydra, "-verbose", "-n", "4", filepath.Join(bins, "putwin"))
			cmd.Env = append(os.Environ(), "HYDRA_LAUNCHER=fork", rma.EnvPMI+"="+tc.pmi)
			out, err := cmd.CombinedOutput()
			require.NoError(t, err, string(out))
			for r := range 4 {
				require.Contains(t, string(out), "rank "+string(rune('0'+r))+" of 4 got")
			}
			require.Contains(t, string(out), "got pmi command (from", "Hydra's trace")
			require.Contains(t, string(out), tc.spoken)
			require.NotContains(t, string(out), tc.not)
		})
	}
}

// A Slurm job: ranks from SLURM_PROCID and SLURM_NTASKS, rank 0 serving
// the rendezvous at RVMA_RENDEZVOUS, the job's key in the file
// RVMA_KEY_FILE names (made by rvmarun --make-key). Without a key the
// ranks refuse to start, saying how to make one.
func TestSlurmBootstrap(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	keyFile := filepath.Join(t.TempDir(), "key")
	_, _, code := runJob(t, "--make-key", keyFile)
	require.Zero(t, code)
	_, _, code = runJob(t, "--make-key", keyFile)
	require.NotZero(t, code, "an existing key file is not overwritten")

	noKey := exec.Command(filepath.Join(bins, "putwin"))
	noKey.Env = append(os.Environ(), "SLURM_PROCID=0", "SLURM_NTASKS=2", "RVMA_RENDEZVOUS="+addr)
	out, err := noKey.CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), "rvmarun --make-key")

	cmds := make([]*exec.Cmd, 3)
	outs := make([]bytes.Buffer, 3)
	for r := range cmds {
		cmds[r] = exec.Command(filepath.Join(bins, "putwin"))
		cmds[r].Env = append(os.Environ(), "SLURM_PROCID="+strconv.Itoa(r), "SLURM_NTASKS=3", "RVMA_RENDEZVOUS="+addr, "RVMA_KEY_FILE="+keyFile)
		cmds[r].Stdout, cmds[r].Stderr = &outs[r], &outs[r]
		require.NoError(t, cmds[r].Start())
	}
	for r, c := range cmds {
		done := make(chan error, 1)
		go func() { done <- c.Wait() }()
		select {
		case err := <-done:
			require.NoError(t, err, outs[r].String())
		case <-time.After(time.Minute):
			c.Process.Kill()
			t.Fatalf("rank %d did not finish: %s", r, outs[r].String())
		}
		require.Contains(t, outs[r].String(), "rank "+strconv.Itoa(r)+" of 3 got")
	}
}

// SIGINT to the launcher reaches every rank.
func TestSignalForwarded(t *testing.T) {
	// The ranks ignore SIGTERM, so the first one to exit does not stop the
	// other before it has handled the forwarded SIGINT.
	cmd := exec.Command(filepath.Join(bins, "rvmarun"), "-n", "2", "sh", "-c",
		`trap 'echo got-int; exit 5' INT; trap '' TERM; echo ready; while :; do sleep 0.05; done`)
	out := testutil.Start(t, cmd)
	require.Eventually(t, func() bool { return strings.Count(out.String(), "ready") == 2 }, 20*time.Second, 10*time.Millisecond)
	require.NoError(t, cmd.Process.Signal(os.Interrupt))
	ee := testutil.ExitError(t, cmd, 20*time.Second, out.String)
	require.Equal(t, 5, ee.ExitCode(), out.String())
	require.Contains(t, out.String(), "[0] got-int")
	require.Contains(t, out.String(), "[1] got-int")
}

// Bad flags are refused with what is wrong, before any rank starts.
func TestFlagErrors(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "started")
	prog := []string{"sh", "-c", "touch " + marker}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"zero ranks", []string{"-n", "0"}, "rvmarun: -n 0: want 1 rank or more"},
		{"zero ranks with a program", append([]string{"-n", "0"}, prog...), "rvmarun: -n 0: want 1 rank or more"},
		{"negative ranks", append([]string{"-n", "-3"}, prog...), "rvmarun: -n -3: want 1 rank or more"},
		{"not a number", append([]string{"-n", "two"}, prog...), `invalid value "two" for flag -n`},
		{"no program", []string{"-n", "2"}, "usage: rvmarun -n N"},
		{"more ranks than the host holds", append([]string{"-n", "100000000"}, prog...), "rvmarun: -n 100000000 needs about"},
		{"more memory than the host has", append([]string{"-n", "2", "--mem-per-rank", "1000000000000"}, prog...), "MiB of memory (1000000000000 MiB a rank), but the"},
		{"negative memory", append([]string{"-n", "2", "--mem-per-rank", "-1"}, prog...), "--mem-per-rank -1: want 0"},
		{"loop provider", append([]string{"-n", "2", "--provider", "loop"}, prog...), "one process only"},
		{"paths", append([]string{"-n", "2", "--paths", "65"}, prog...), "--paths 65: want 1..64"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, stderr, code := runJob(t, tc.args...)
			require.Equal(t, 2, code, stderr)
			require.Contains(t, stderr, tc.want)
		})
	}
	require.NoFileExists(t, marker, "a rank started")
}

func TestFitFDs(t *testing.T) {
	for _, tc := range []struct {
		n          int
		soft, hard uint64
		ok         bool
	}{
		{1, 1024, 1024, true},
		{(1024 - fdsBase) / fdsPerRank, 1024, 4096, true},
		{(1024-fdsBase)/fdsPerRank + 1, 1024, 4096, false},
		{1 << 62, 1 << 40, 1 << 40, false}, // no overflow
	} {
		err := fitFDs(tc.n, tc.soft, tc.hard)
		if tc.ok {
			require.NoError(t, err, "n=%d soft=%d", tc.n, tc.soft)
			continue
		}
		require.Error(t, err, "n=%d soft=%d", tc.n, tc.soft)
		require.Contains(t, err.Error(), fmt.Sprintf("-n %d needs about", tc.n))
		require.Contains(t, err.Error(), fmt.Sprintf("limit of %d (RLIMIT_NOFILE, hard limit %d)", tc.soft, tc.hard))
		require.Contains(t, err.Error(), "ulimit -n")
	}
}

func TestFitMem(t *testing.T) {
	const mib = 1 << 20
	require.Equal(t, uint64(16*mib), rankMem(1, 0))
	require.Equal(t, uint64(16*mib+31*64<<10), rankMem(32, 0))
	require.Equal(t, uint64(100*mib), rankMem(32, 100))
	for _, tc := range []struct {
		n       int
		perRank uint64
		avail   uint64
		ok      bool
	}{
		{4, 100 * mib, 400 * mib, true},
		{5, 100 * mib, 400 * mib, false},
		{1 << 62, rankMem(1<<62, 0), 1 << 40, false}, // no overflow
	} {
		err := fitMem(tc.n, tc.perRank, tc.avail, "the host (MemAvailable in /proc/meminfo)")
		if tc.ok {
			require.NoError(t, err)
			continue
		}
		require.Error(t, err)
		require.Contains(t, err.Error(), fmt.Sprintf("-n %d needs about", tc.n))
		require.Contains(t, err.Error(), "MemAvailable in /proc/meminfo")
		require.Contains(t, err.Error(), "--mem-per-rank")
	}
}

// rvmarunCmd starts the built rvmarun with the test binary as the rank
// program, playing role, and returns it with its output.
func rvmarunCmd(t *testing.T, role string, args ...string) (*exec.Cmd, *testutil.SyncBuffer) {
	t.Helper()
	cmd := exec.Command(filepath.Join(bins, "rvmarun"), args...)
	cmd.Env = append(os.Environ(), envRole+"="+role)
	return cmd, testutil.Start(t, cmd)
}

// readyLine is a rank's "ready PID PPID", tagged with its rank (and host).
var readyLine = regexp.MustCompile(`(?m)^\[\d+(?:@\S+)?\] ready (\d+) (\d+)$`)

// readyRanks waits for n "ready PID PPID" lines and returns the pids.
func readyRanks(t *testing.T, out *testutil.SyncBuffer, n int) (pids, ppids []int) {
	t.Helper()
	require.Eventually(t, func() bool { return strings.Count(out.String(), "ready ") == n }, 60*time.Second, 10*time.Millisecond, out.String())
	for _, m := range readyLine.FindAllStringSubmatch(out.String(), -1) {
		pid, _ := strconv.Atoi(m[1])
		ppid, _ := strconv.Atoi(m[2])
		pids, ppids = append(pids, pid), append(ppids, ppid)
	}
	require.Len(t, pids, n, out.String())
	return pids, ppids
}

// killLauncher kills rvmarun with SIGKILL and requires every process of
// pids to be gone within 30 s (seconds normally: a watch notices the
// rendezvous gone at once; the bound is for a machine under load, where
// the race detector's ranks were seen taking over 10 s).
func killLauncher(t *testing.T, cmd *exec.Cmd, pids []int) {
	t.Helper()
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	cmd.Wait()
	for _, p := range pids {
		require.Eventually(t, func() bool { return testutil.Exited(p) }, 30*time.Second, 10*time.Millisecond, "pid %d outlived rvmarun", p)
	}
}

// kill -9 of rvmarun ends every rank: directly started ones by their
// parent-death signal, ones started through a wrapper (which that signal
// ends, but not its child) by their launcher watch.
func TestRanksDieWithLauncher(t *testing.T) {
	t.Run("direct", func(t *testing.T) {
		// No watch: the parent-death signal alone.
		cmd, out := rvmarunCmd(t, "rank", "-n", "3", os.Args[0])
		pids, ppids := readyRanks(t, out, 3)
		for _, p := range pids {
			t.Cleanup(func() { syscall.Kill(p, syscall.SIGKILL) })
		}
		for _, pp := range ppids {
			require.Equal(t, cmd.Process.Pid, pp, "a rank's parent is rvmarun")
		}
		killLauncher(t, cmd, pids)
	})
	t.Run("wrapped", func(t *testing.T) {
		// sh does not exec the rank (a command follows), so the rank's
		// parent is sh; its stderr goes to a file, as rvmarun's pipe
		// dies with rvmarun.
		dir := t.TempDir()
		cmd, out := rvmarunCmd(t, "watch", "-n", "3", "sh", "-c", `"$0" 2>"$1/rank-$RVMA_RANK.err"; echo unreachable`, os.Args[0], dir)
		pids, ppids := readyRanks(t, out, 3)
		all := append(pids, ppids...)
		for _, p := range all {
			t.Cleanup(func() { syscall.Kill(p, syscall.SIGKILL) })
		}
		for _, pp := range ppids {
			require.NotEqual(t, cmd.Process.Pid, pp, "a rank's parent is its wrapper")
		}
		killLauncher(t, cmd, all)
		for r := range 3 {
			msg, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("rank-%d.err", r)))
			require.NoError(t, err)
			require.Contains(t, string(msg), "the launcher is gone: its rendezvous at")
		}
	})
}

// underIgnored runs rvmarun through a shell that ignores sigs first, as
// "rvmarun &" in a script does for SIGINT, and returns its output.
func underIgnored(t *testing.T, sigs string, args ...string) (*exec.Cmd, *testutil.SyncBuffer) {
	t.Helper()
	cmd := exec.Command("sh", append([]string{"-c", `trap '' ` + sigs + `; exec "$@"`, "sh", filepath.Join(bins, "rvmarun")}, args...)...)
	return cmd, testutil.Start(t, cmd)
}

// Ranks start with the default action for SIGINT, SIGTERM, SIGQUIT and
// SIGHUP even when rvmarun was started with them ignored.
func TestRanksGetDefaultSignals(t *testing.T) {
	cmd, out := underIgnored(t, "INT TERM QUIT HUP", "-n", "2", "grep", "SigIgn", "/proc/self/status")
	require.NoError(t, cmd.Wait(), out.String())
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 2, out.String())
	for _, l := range lines {
		_, hex, ok := strings.Cut(l, "SigIgn:")
		require.True(t, ok, l)
		mask, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 64)
		require.NoError(t, err, l)
		for _, s := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGQUIT, syscall.SIGHUP} {
			require.Zero(t, mask&(1<<(s-1)), "%v ignored in a rank: %s", s, l)
		}
	}
}

// rvmarun started with SIGINT ignored still stops its job on SIGINT.
func TestSIGINTWhenStartedIgnored(t *testing.T) {
	cmd, out := underIgnored(t, "INT", "-n", "2", "sh", "-c", "echo ready; exec sleep 60")
	require.Eventually(t, func() bool { return strings.Count(out.String(), "ready") == 2 }, 20*time.Second, 10*time.Millisecond)
	require.NoError(t, cmd.Process.Signal(os.Interrupt))
	ee := testutil.ExitError(t, cmd, 20*time.Second, out.String)
	require.Equal(t, 128+int(syscall.SIGINT), ee.ExitCode(), out.String())
}

// Under nohup (SIGHUP ignored at start) rvmarun does not forward SIGHUP:
// the ranks see the SIGINT that follows it, not the SIGHUP. (They ignore
// SIGTERM, so that the first to exit does not stop the other before it
// has handled the SIGINT.)
func TestNohupKeepsHangupsAway(t *testing.T) {
	cmd, out := underIgnored(t, "HUP", "-n", "2", "sh", "-c",
		`trap 'echo got-hup' HUP; trap 'echo got-int; exit 5' INT; trap '' TERM; echo ready; while :; do sleep 0.05; done`)
	require.Eventually(t, func() bool { return strings.Count(out.String(), "ready") == 2 }, 20*time.Second, 10*time.Millisecond)
	require.NoError(t, cmd.Process.Signal(syscall.SIGHUP))
	require.NoError(t, cmd.Process.Signal(os.Interrupt))
	ee := testutil.ExitError(t, cmd, 20*time.Second, out.String)
	require.Equal(t, 5, ee.ExitCode(), out.String())
	require.Equal(t, 2, strings.Count(out.String(), "got-int"), out.String())
	require.NotContains(t, out.String(), "got-hup")
}

// Jobs past the sizes that failed before (every job of 40 ranks or more:
// rank 0's connections to all, a fixed retransmission timeout, 32 shm
// rings a host, putwin's 101st rank) finish, on each provider, with every
// rank's line.
func TestManyRankJob(t *testing.T) {
	n := 104
	if testing.Short() {
		n = 40
	}
	for _, prov := range []string{"udp", "shm", "auto"} {
		t.Run(prov, func(t *testing.T) {
			out, stderr, code := runJob(t, "-n", fmt.Sprint(n), "--provider", prov, filepath.Join(bins, "putwin"))
			require.Zero(t, code, stderr)
			for r := range n {
				require.Contains(t, out, fmt.Sprintf("[%d] rank %d of %d got \"hello from rank %02d\"", r, r, n, (r+n-1)%n))
			}
		})
	}
}

// The job's key reaches the ranks where only their user and root can read
// it: a second user finds it in no command line, and cannot read the
// ranks' or rvmarun's environment (root only: runuser).
func TestKeyHiddenFromOtherUsers(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, to act as a second user with runuser")
	}
	if _, err := exec.LookPath("runuser"); err != nil {
		t.Skip("needs runuser")
	}
	cmd, out := rvmarunCmd(t, "rank", "-n", "2", os.Args[0])
	pids, _ := readyRanks(t, out, 2)
	for _, p := range pids {
		t.Cleanup(func() { syscall.Kill(p, syscall.SIGKILL) })
	}
	hexKey := regexp.MustCompile(`[0-9a-f]{64}`)
	for _, p := range append([]int{cmd.Process.Pid}, pids...) {
		as := func(file string) (string, error) {
			b, err := exec.Command("runuser", "-u", "nobody", "--", "cat", fmt.Sprintf("/proc/%d/%s", p, file)).CombinedOutput()
			return string(b), err
		}
		cmdline, err := as("cmdline")
		require.NoError(t, err, "another user can read a command line")
		require.False(t, hexKey.MatchString(cmdline), "pid %d: a key on the command line: %q", p, cmdline)
		env, err := as("environ")
		require.Error(t, err, "pid %d: another user read the environment", p)
		require.NotContains(t, env, launch.EnvKey)
	}
	// The check above could see a key: root reads a rank's environment.
	env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pids[0]))
	require.NoError(t, err)
	require.Contains(t, string(env), launch.EnvKey+"=")
	killLauncher(t, cmd, pids)
}

// --rc-timeout reaches every rank's environment (rma.Init reads it).
func TestRCTimeoutFlag(t *testing.T) {
	self, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(filepath.Join(bins, "rvmarun"), "-n", "2", "--rc-timeout", "150ms", self)
	cmd.Env = append(os.Environ(), envRole+"=env")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Equal(t, 2, strings.Count(string(out), rma.EnvRCTimeout+"=150ms"), "%s", out)
}
