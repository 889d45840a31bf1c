package main

import (
	"context"
	"fmt"
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
	"github.com/rvma/rvma/internal/testutil"
	"github.com/rvma/rvma/rma"
)

// The "incarnation" role's settings: envDie is "RANK:BELOW:HOW", the rank
// that dies while its incarnation is below BELOW, and how: "kill"
// (SIGKILL to itself), "exit" (status 3), "rm" (removes its program, then
// SIGKILL) or "hold" (it waits, two minutes at most, for --kill). With
// envHold set the other ranks' first incarnations wait as well.
const (
	envDie  = "RVMARUN_TEST_DIE"
	envHold = "RVMARUN_TEST_HOLD"
	// envWait makes the ranks that live on wait, at the end, for a rank
	// that "hold"s to come back (rvmarun respawns nobody once a rank has
	// finished).
	envWait = "RVMARUN_TEST_WAIT"
)

// playIncarnation is a rank that prints "incarnation INC pid PID" (INC
// "unset" without RVMA_INCARNATION), then dies as envDie says, or, as a
// later incarnation, prints the rendezvous's faults as it sees them
// ("faults N STATE..."), then exits 0.
func playIncarnation() int {
	inc, ok := os.LookupEnv(rma.EnvIncarnation)
	if !ok {
		inc = "unset"
	}
	fmt.Printf("incarnation %s pid %d\n", inc, os.Getpid())
	rank := os.Getenv(rma.EnvRank)
	var dieRank, how string
	var below int
	if f := strings.Split(os.Getenv(envDie), ":"); len(f) == 3 {
		dieRank, how = f[0], f[2]
		below, _ = strconv.Atoi(f[1])
	}
	n, _ := strconv.Atoi(inc) // 0 when unset
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	key, err := launch.KeyFromEnv()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	c, err := kvs.Dial(ctx, os.Getenv(rma.EnvKVS), key)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer c.Close()
	// As a real job: every first incarnation joins the rendezvous (rvmarun
	// respawns a rank only after that), and ranks that live on wait at the
	// end for the rank that dies to have come back for good, since
	// rvmarun respawns nobody once a rank has finished.
	if n == 0 {
		if err := c.Barrier(ctx); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	switch {
	case rank == dieRank && n < below && how == "kill":
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		time.Sleep(time.Minute)
	case rank == dieRank && n < below && how == "exit":
		return 3
	case rank == dieRank && n < below && how == "rm":
		os.Remove(os.Args[0])
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		time.Sleep(time.Minute)
	case rank == dieRank && n < below && how == "hold", rank != dieRank && n == 0 && os.Getenv(envHold) != "":
		time.Sleep(2 * time.Minute)
		return 0
	}
	if (below > 0 && (how != "hold" || os.Getenv(envWait) != "")) || (n > 0 && os.Getenv(envHold) != "") {
		if err := c.Barrier(ctx); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	if n == 0 {
		return 0
	}
	f, err := c.Faults(ctx, 0)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	states := []string{fmt.Sprint(f.N)}
	for i, inc := range f.Inc {
		d := ""
		if f.Dead[i] {
			d = "d"
		}
		states = append(states, fmt.Sprintf("%s%d", d, inc))
	}
	fmt.Printf("faults %s\n", strings.Join(states, " "))
	return 0
}

// incarnationJob runs rvmarun in process over n ranks of the test binary
// in the "incarnation" role, die its envDie ("RANK:BELOW:HOW").
func incarnationJob(t *testing.T, n int, die string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	self, err := os.Executable()
	require.NoError(t, err)
	a := append([]string{"-n", strconv.Itoa(n), "--grace", "500ms", "-x", envRole + "=incarnation", "-x", envDie + "=" + die}, args...)
	return runJob(t, append(a, self)...)
}

// incPIDs returns the pid each incarnation of each rank printed, as
// "[RANK] incarnation INC pid PID" lines.
func incPIDs(t *testing.T, out string) map[string]int {
	t.Helper()
	pids := map[string]int{}
	for _, m := range regexp.MustCompile(`(?m)^\[(\d+)(?:@\S+)?\] incarnation (\S+) pid (\d+)$`).FindAllStringSubmatch(out, -1) {
		pid, _ := strconv.Atoi(m[3])
		pids[m[1]+"/"+m[2]] = pid
	}
	return pids
}

func requireAllGone(t *testing.T, pids map[string]int) {
	t.Helper()
	for what, p := range pids {
		require.Eventually(t, func() bool { return testutil.Exited(p) }, 10*time.Second, 10*time.Millisecond,
			"rank/incarnation %s (pid %d) outlived the job", what, p)
	}
}

// A rank that dies is started again as its next incarnation, as often as
// --restart allows, with its output tagged as before; the job succeeds
// once every rank has exited 0, and the rendezvous had the death and the
// new incarnation before that incarnation started.
func TestRestartRank(t *testing.T) {
	for _, tc := range []struct {
		name, how   string
		restart     int
		death       string
		incarnation []string
	}{
		{"killed once, restart 1", "kill", 1, "killed by signal 9 (SIGKILL)", []string{"0", "1"}},
		{"killed twice, restart 2", "kill", 2, "killed by signal 9 (SIGKILL)", []string{"0", "1", "2"}},
		{"failed once, restart 2", "exit", 2, "exited with status 3", []string{"0", "1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			below := len(tc.incarnation) - 1
			out, stderr, code := incarnationJob(t, 3, fmt.Sprintf("1:%d:%s", below, tc.how), "--restart", strconv.Itoa(tc.restart))
			require.Equal(t, 0, code, "%s%s", out, stderr)
			pids := incPIDs(t, out)
			require.Len(t, pids, 2+len(tc.incarnation), out)
			for _, r := range []string{"0", "2"} {
				require.Contains(t, pids, r+"/0", out)
			}
			for i, inc := range tc.incarnation {
				require.Contains(t, pids, "1/"+inc, out)
				if i > 0 {
					require.Contains(t, stderr, fmt.Sprintf("rvmarun: rank 1 (incarnation %d) %s; restarting it as incarnation %s (restart %s of %d)\n",
						i-1, tc.death, inc, inc, tc.restart))
				}
			}
			// The last incarnation saw every death and every incarnation
			// before its own start: no fault but the launcher's.
			require.Contains(t, out, fmt.Sprintf("[1] faults %d 0 %d 0\n", below, below))
			require.NotContains(t, stderr, "stopping the others")
			requireAllGone(t, pids)
		})
	}
}

// A rank's K+1st death ends the job as the first failure does without
// --restart: its status, a message naming the rank and its deaths, and
// the other ranks, which still ran, stopped.
func TestRestartsExhausted(t *testing.T) {
	for _, restart := range []int{1, 2} {
		t.Run(fmt.Sprint("restart ", restart), func(t *testing.T) {
			out, stderr, code := incarnationJob(t, 3, "1:99:kill", "-x", envHold+"=1", "--restart", strconv.Itoa(restart))
			require.Equal(t, 128+int(syscall.SIGKILL), code, "%s%s", out, stderr)
			require.Contains(t, stderr, fmt.Sprintf("rvmarun: rank 1 (incarnation %d) killed by signal 9 (SIGKILL); it died %d times, more than --restart %d allows; stopping the others\n",
				restart, restart+1, restart))
			pids := incPIDs(t, out)
			for inc := range restart + 1 {
				require.Contains(t, pids, fmt.Sprintf("1/%d", inc), out)
			}
			requireAllGone(t, pids)
		})
	}
}

// Without --restart (or with 0) the first failure ends the job as it
// always did, and the ranks are not told an incarnation.
func TestRestartZeroFailsFast(t *testing.T) {
	for _, args := range [][]string{nil, {"--restart", "0"}} {
		out, stderr, code := incarnationJob(t, 3, "1:99:exit", append(args, "-x", envHold+"=1")...)
		require.Equal(t, 3, code, "%s%s", out, stderr)
		require.Equal(t, "rvmarun: rank 1 failed (exit status 3); stopping the others\n", stderr)
		// The others may be stopped before they print.
		pids := incPIDs(t, out)
		require.Contains(t, pids, "1/unset", out)
		for what := range pids {
			require.True(t, strings.HasSuffix(what, "/unset"), out)
		}
		requireAllGone(t, pids)
	}
	_, stderr, code := runJob(t, "-n", "2", "--restart", "-1", "true")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "rvmarun: --restart -1: want 0 (no restarts) or more")
}

// --kill RANK@T kills that rank's current incarnation once, and with
// --restart it comes back; without, the job fails as when a rank is
// killed from outside.
func TestKillRank(t *testing.T) {
	out, stderr, code := incarnationJob(t, 3, "2:1:hold", "--restart", "1", "--kill", "2@300ms", "-x", envWait+"=1")
	require.Equal(t, 0, code, "%s%s", out, stderr)
	require.Contains(t, stderr, "rvmarun: killing rank 2 (incarnation 0) with SIGKILL at 300ms as --kill asked\n")
	require.Contains(t, stderr, "rvmarun: rank 2 (incarnation 0) killed by signal 9 (SIGKILL); restarting it as incarnation 1 (restart 1 of 1)\n")
	pids := incPIDs(t, out)
	require.Contains(t, pids, "2/1", out)
	require.NotContains(t, pids, "0/1", out)
	require.NotContains(t, pids, "1/1", out)
	require.Contains(t, out, "[2] faults 1 0 0 1\n")
	requireAllGone(t, pids)

	out, stderr, code = incarnationJob(t, 2, "1:1:hold", "--kill", "1@200ms", "-x", envHold+"=1")
	require.Equal(t, 128+int(syscall.SIGKILL), code, "%s%s", out, stderr)
	require.Equal(t, "rvmarun: killing rank 1 (incarnation 0) with SIGKILL at 200ms as --kill asked\n"+
		"rvmarun: rank 1 failed (signal: killed); stopping the others\n", stderr)
	requireAllGone(t, incPIDs(t, out))
}

// A seeded --kill picks the same rank and time for the same seed and job
// size, within its bounds.
func TestKillRandom(t *testing.T) {
	ranks := map[int]bool{}
	for seed := range 50 {
		k, err := parseKill(fmt.Sprintf("random@%d", seed), 4)
		require.NoError(t, err)
		again, err := parseKill(fmt.Sprintf("random@%d", seed), 4)
		require.NoError(t, err)
		require.Equal(t, k, again)
		require.GreaterOrEqual(t, k.at, killMinDefault)
		require.LessOrEqual(t, k.at, killMaxDefault)
		require.Equal(t, k.at, k.at.Truncate(time.Millisecond))
		ranks[k.rank] = true
		k, err = parseKill(fmt.Sprintf("random@%d:1s-1.2s", seed), 4)
		require.NoError(t, err)
		require.GreaterOrEqual(t, k.at, time.Second)
		require.LessOrEqual(t, k.at, 1200*time.Millisecond)
	}
	require.Len(t, ranks, 4, "every rank is drawn")
	k, err := parseKill("random@3:2s-2s", 4)
	require.NoError(t, err)
	require.Equal(t, 2*time.Second, k.at)

	// In a job, the rank drawn is killed at the time drawn (and the other
	// one later, so that the job ends).
	k, err = parseKill("random@5:100ms-200ms", 2)
	require.NoError(t, err)
	out, stderr, code := incarnationJob(t, 2, "9:0:none", "--restart", "1", "-x", envHold+"=1",
		"--kill", "random@5:100ms-200ms", "--kill", fmt.Sprintf("%d@300ms", 1-k.rank))
	require.Equal(t, 0, code, "%s%s", out, stderr)
	require.Contains(t, stderr, fmt.Sprintf("rvmarun: killing rank %d (incarnation 0) with SIGKILL at %v as --kill asked\n", k.rank, k.at))
	require.Contains(t, stderr, fmt.Sprintf("rvmarun: killing rank %d (incarnation 0) with SIGKILL at 300ms as --kill asked\n", 1-k.rank))
	requireAllGone(t, incPIDs(t, out))
}

// Bad --kill specs fail at start, before any rank starts, with what is
// wrong.
func TestKillSpecErrors(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "started")
	prog := []string{"sh", "-c", "touch " + marker}
	for _, tc := range []struct{ spec, want string }{
		{"3@1s", `--kill "3@1s": rank 3: the job's ranks are 0 to 2`},
		{"-1@1s", `--kill "-1@1s": rank -1: the job's ranks are 0 to 2`},
		{"x@1s", `--kill "x@1s": want RANK@DURATION`},
		{"1", `--kill "1": want RANK@DURATION`},
		{"", `--kill "": want RANK@DURATION`},
		{"1@", `--kill "1@": "": want a duration`},
		{"1@2", `--kill "1@2": "2": want a duration`},
		{"1@-1s", `--kill "1@-1s": "-1s": want a duration of 0 or more`},
		{"random@", `--kill "random@": SEED "": want an integer`},
		{"random@x", `--kill "random@x": SEED "x": want an integer`},
		{"random@1:2s", `--kill "random@1:2s": "2s": want MIN-MAX`},
		{"random@1:1s-x", `--kill "random@1:1s-x": "1s-x": want MIN-MAX`},
		{"random@1:2s-1s", `--kill "random@1:2s-1s": "2s-1s": want 0 <= MIN <= MAX`},
	} {
		t.Run(tc.spec, func(t *testing.T) {
			_, stderr, code := runJob(t, append([]string{"-n", "3", "--kill", "0@1s", "--kill", tc.spec}, prog...)...)
			require.Equal(t, 2, code, stderr)
			require.Contains(t, stderr, "rvmarun: "+tc.want)
		})
	}
	require.NoFileExists(t, marker, "a rank started")
}

// What a dead incarnation started dies with it: a wrapper's child does
// not go on beside the next incarnation (nor hold the output open).
// (Rank 0 lives on until rank 1 has come back: rvmarun respawns nobody
// once a rank has finished.)
func TestRestartKillsDeadIncarnationsGroup(t *testing.T) {
	out, stderr, code := runJob(t, "-n", "2", "--restart", "1", "sh", "-c",
		`if [ "$RVMA_RANK$RVMA_INCARNATION" = 10 ]; then sleep 120 & echo "child $!"; kill -9 $$; fi; echo "incarnation $RVMA_INCARNATION"; [ "$RVMA_RANK" = 1 ] || sleep 3`)
	require.Equal(t, 0, code, "%s%s", out, stderr)
	require.Contains(t, out, "[1] incarnation 1\n")
	m := regexp.MustCompile(`(?m)^\[1\] child (\d+)$`).FindStringSubmatch(out)
	require.NotNil(t, m, out)
	child, _ := strconv.Atoi(m[1])
	require.Eventually(t, func() bool { return testutil.Exited(child) }, 10*time.Second, 10*time.Millisecond, "the dead incarnation's child outlived it")
}

// A restart that cannot start ends the job with why, and stops the
// others.
func TestRestartFailsToStart(t *testing.T) {
	// Rank 1 removes its program (a link to the test binary), then dies.
	self, err := os.Executable()
	require.NoError(t, err)
	prog := filepath.Join(t.TempDir(), "rank")
	if os.Link(self, prog) != nil {
		b, err := os.ReadFile(self)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(prog, b, 0o755))
	}
	out, stderr, code := runJob(t, "-n", "2", "--restart", "2", "--grace", "500ms", "-x", envRole+"=incarnation",
		"-x", envDie+"=1:1:rm", "-x", envHold+"=1", prog)
	require.Equal(t, 1, code, "%s%s", out, stderr)
	require.Contains(t, stderr, "rvmarun: rank 1 (incarnation 0) killed by signal 9 (SIGKILL); restarting it as incarnation 1 (restart 1 of 2)\n")
	require.Contains(t, stderr, "rvmarun: rank 1: restarting it as incarnation 1: fork/exec "+prog+": no such file or directory; stopping the others\n")
	pids := incPIDs(t, out)
	require.Contains(t, pids, "1/0", out)
	require.NotContains(t, pids, "1/1", out)
	requireAllGone(t, pids)
}

// A rank that exits 0 is done: it is not started again, and --kill finds
// nothing to kill. (Rank 1 exits at once, and has 2 s to do it; rank 0
// waits for its --kill.)
func TestKillEndedRank(t *testing.T) {
	out, stderr, code := incarnationJob(t, 2, "0:1:hold", "--restart", "1", "--kill", "1@2s", "--kill", "0@2.5s")
	require.Equal(t, 137, code, "%s%s", out, stderr)
	require.Contains(t, stderr, "rvmarun: not killing rank 1 at 2s as --kill asked: it has ended\n")
	require.Contains(t, stderr, "rvmarun: killing rank 0 (incarnation 0) with SIGKILL at 2.5s as --kill asked\n")
	// Once a rank has finished there is no job to recover into: a death
	// then ends the job.
	require.Contains(t, stderr, "rvmarun: rank 0 (incarnation 0) killed by signal 9 (SIGKILL) after rank 1 had finished: not restarting it; stopping the others\n")
	pids := incPIDs(t, out)
	require.Contains(t, pids, "1/0", out)
	require.NotContains(t, pids, "0/1", out)
	requireAllGone(t, pids)
}

// A signal forwarded to the ranks ends the job: the ranks it ends are not
// started again.
func TestRestartNotAfterSignal(t *testing.T) {
	cmd := exec.Command(filepath.Join(bins, "rvmarun"), "-n", "2", "--restart", "2", "sh", "-c",
		`trap 'echo got-int; exit 5' INT; trap '' TERM; echo "ready $RVMA_INCARNATION"; while :; do sleep 0.05; done`)
	out := testutil.Start(t, cmd)
	require.Eventually(t, func() bool { return strings.Count(out.String(), "ready 0") == 2 }, 20*time.Second, 10*time.Millisecond)
	require.NoError(t, cmd.Process.Signal(os.Interrupt))
	ee := testutil.ExitError(t, cmd, 20*time.Second, out.String)
	require.Equal(t, 5, ee.ExitCode(), out.String())
	require.Equal(t, 2, strings.Count(out.String(), "got-int"), out.String())
	require.NotContains(t, out.String(), "restarting")
	require.NotContains(t, out.String(), "ready 1")
}
