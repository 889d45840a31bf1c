package main

import (
	"context"
	"encoding/json"
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

	"github.com/rvma/rvma/internal/testbed"
	"github.com/rvma/rvma/internal/testutil"
	"github.com/rvma/rvma/rma"
)

// reportTransports is a rank that puts to every other rank and prints
// how it reached each: "transport ME PEER PROVIDER".
func reportTransports() int {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	comm, err := rma.Init(ctx, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer comm.Close(ctx)
	me, n := comm.Rank(), comm.Size()
	win, err := comm.Allocate(ctx, 8*n, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := win.Fence(ctx, 0); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	for p := range n {
		if err := win.Put(ctx, []byte(fmt.Sprintf("%08d", me)), p, 8*me); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	if err := win.Fence(ctx, 0); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	for p := range n {
		if got := string(win.Bytes()[8*p : 8*p+8]); got != fmt.Sprintf("%08d", p) {
			fmt.Fprintf(os.Stderr, "from rank %d: %q\n", p, got)
			return 1
		}
		if p != me {
			fmt.Printf("transport %d %d %s\n", me, p, comm.Transport(p))
		}
	}
	if err := win.Free(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// hostsJob runs rvmarun in the first host of tb over every host, with
// the netns launch agent.
func hostsJob(tb *testbed.Hosts, slots int, extra ...string) *exec.Cmd {
	var hl []string
	for _, ns := range tb.Names {
		hl = append(hl, fmt.Sprintf("%s:%d", ns, slots))
	}
	args := append([]string{"netns", "exec", tb.Names[0], filepath.Join(bins, "rvmarun"),
		"-H", strings.Join(hl, ","), "--launch-agent", "ip netns exec", "--rendezvous-addr", tb.Addrs[0].String()}, extra...)
	return exec.Command("ip", args...)
}

// Ranks on three namespace hosts: every pair of one host meets over shared
// memory and every other pair over UDP, output is tagged with rank and
// host, and the puts arrive.
func TestHostsAutoTransports(t *testing.T) {
	tb := testbed.NewHosts(t, testbed.HostsConfig{Hosts: 3})
	self, err := os.Executable()
	require.NoError(t, err)
	cmd := hostsJob(tb, 2, "-x", envRole+"=transport", self)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	host := map[int]string{}
	re := regexp.MustCompile(`(?m)^\[(\d+)@(\S+)\] transport (\d+) (\d+) (\S+)$`)
	lines := re.FindAllStringSubmatch(string(out), -1)
	require.Len(t, lines, 6*5, "%s", out)
	for _, l := range lines {
		r, _ := strconv.Atoi(l[1])
		require.Equal(t, l[1], l[3], "the tag names the rank that printed")
		host[r] = l[2]
	}
	for r := range 6 {
		require.Equal(t, tb.Names[r/2], host[r], "--map-by slot fills each host's slots in turn")
	}
	for _, l := range lines {
		me, _ := strconv.Atoi(l[3])
		p, _ := strconv.Atoi(l[4])
		want := "udp"
		if host[me] == host[p] {
			want = "shm"
		}
		require.Equal(t, want, l[5], "rank %d to rank %d", me, p)
	}
}

// Killing the launcher (kill -9) ends every rank on every host within
// seconds.
func TestHostsDieWithLauncher(t *testing.T) {
	tb := testbed.NewHosts(t, testbed.HostsConfig{Hosts: 2})
	self, err := os.Executable()
	require.NoError(t, err)
	cmd := hostsJob(tb, 2, "-x", envRole+"=rank", self)
	var out testutil.SyncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	pids, _ := readyRanks(t, &out, 4)
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL)) // ip netns exec execs rvmarun: this is the launcher
	cmd.Wait()
	requireGone(t, pids, 10*time.Second)
}

// A rank killed on another host fails the job (its status, a message
// naming rank and host) and no rank is left anywhere.
func TestHostsRankKilled(t *testing.T) {
	tb := testbed.NewHosts(t, testbed.HostsConfig{Hosts: 2})
	self, err := os.Executable()
	require.NoError(t, err)
	cmd := hostsJob(tb, 2, "-x", envRole+"=rank", "--grace", "1s", self)
	var out testutil.SyncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	pids, _ := readyRanks(t, &out, 4)
	// A rank of the second host, which rvmarun reaches through the agent.
	m := regexp.MustCompile(`(?m)^\[\d+@` + tb.Names[1] + `\] ready (\d+) `).FindStringSubmatch(out.String())
	require.NotNil(t, m, out.String())
	victim, _ := strconv.Atoi(m[1])
	require.NoError(t, syscall.Kill(victim, syscall.SIGKILL))
	err = cmd.Wait()
	require.Error(t, err)
	require.Equal(t, 128+int(syscall.SIGKILL), cmd.ProcessState.ExitCode(), "%s", out.String())
	require.Regexp(t, `rvmarun: rank \d on `+tb.Names[1]+` failed \(signal: killed\); stopping the others`, out.String())
	require.Contains(t, out.String(), "stopping the other hosts")
	requireGone(t, pids, 10*time.Second)
}

// A host the agent cannot reach fails the job at once with the agent's
// word and rvmarun's, and the hosts that did start are stopped.
func TestHostsUnreachable(t *testing.T) {
	tb := testbed.NewHosts(t, testbed.HostsConfig{Hosts: 1})
	self, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command("ip", "netns", "exec", tb.Names[0], filepath.Join(bins, "rvmarun"),
		"-H", tb.Names[0]+":2,no-such-host-ns:2", "--launch-agent", "ip netns exec",
		"--rendezvous-addr", tb.Addrs[0].String(), "-x", envRole+"=rank", self)
	var out testutil.SyncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err = cmd.Run()
	require.Error(t, err)
	require.Less(t, time.Since(start), 30*time.Second)
	require.Contains(t, out.String(), "rvmarun: host no-such-host-ns failed", out.String())
	pids := regexp.MustCompile(`ready (\d+) `).FindAllStringSubmatch(out.String(), -1)
	var ps []int
	for _, p := range pids {
		n, _ := strconv.Atoi(p[1])
		ps = append(ps, n)
	}
	requireGone(t, ps, 10*time.Second)
}

func requireGone(t *testing.T, pids []int, within time.Duration) {
	t.Helper()
	for _, p := range pids {
		require.Eventually(t, func() bool { return testutil.Exited(p) }, within, 10*time.Millisecond, "pid %d outlived the job", p)
	}
}

// With hosts, a daemon restarts its ranks too, and records their deaths
// and incarnations in the launcher's rendezvous (the died and respawned
// requests); --kill reaches the rank's daemon as an order. A rank that
// dies once too often fails its host and the job.
func TestHostsRestart(t *testing.T) {
	tb := testbed.NewHosts(t, testbed.HostsConfig{Hosts: 2})
	self, err := os.Executable()
	require.NoError(t, err)
	victim := tb.Names[1]
	cmd := hostsJob(tb, 2, "-x", envRole+"=incarnation", "-x", envDie+"=3:1:hold", "-x", envWait+"=1", "--restart", "1", "--kill", "3@300ms", self)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "rvmarun: killing rank 3 on "+victim+" (incarnation 0) with SIGKILL at 300ms as --kill asked\n")
	require.Contains(t, string(out), "rvmarun: rank 3 on "+victim+" (incarnation 0) killed by signal 9 (SIGKILL); restarting it as incarnation 1 (restart 1 of 1)\n")
	require.Contains(t, string(out), "[3@"+victim+"] incarnation 1 pid ")
	require.Contains(t, string(out), "[3@"+victim+"] faults 1 0 0 0 1\n", "the launcher's rendezvous saw the death and the new incarnation")
	pids := incPIDs(t, string(out))
	require.NotContains(t, pids, "2/1", string(out))
	requireAllGone(t, pids)

	cmd = hostsJob(tb, 2, "-x", envRole+"=incarnation", "-x", envDie+"=3:9:kill", "-x", envHold+"=1", "--grace", "500ms", "--restart", "1", self)
	out, err = cmd.CombinedOutput()
	require.Error(t, err, "%s", out)
	require.Equal(t, 128+int(syscall.SIGKILL), cmd.ProcessState.ExitCode(), "%s", out)
	require.Contains(t, string(out), "rvmarun: rank 3 on "+victim+" (incarnation 1) killed by signal 9 (SIGKILL); it died 2 times, more than --restart 1 allows; stopping the others\n")
	require.Contains(t, string(out), "rvmarun: host "+victim+" failed (exit status 137); stopping the other hosts\n")
	requireAllGone(t, incPIDs(t, string(out)))
}

// ompiAgent is a launch agent for Open MPI's rsh launcher: it runs the
// command in the namespace host it names, under that name as hostname,
// so that Open MPI sees several nodes (as scripts/hostbed's does).
const ompiAgent = `#!/bin/sh
while [ "${1#-}" != "$1" ]; do shift; done
host=$1; shift
exec ip netns exec "$host" unshare --uts sh -c "hostname $host; $*"
`

// Open MPI's mpirun across two namespace hosts, with no RVMA_RENDEZVOUS
// and no key file: rank 0 publishes the rendezvous through the hosts'
// PMIx servers, and halo3d's 8 ranks (4 per host) agree with the serial
// solution and with the same job under rvmarun.
func TestHostsOpenMPI(t *testing.T) {
	mpirun, err := exec.LookPath("mpirun.openmpi")
	if err != nil {
		t.Skip("mpirun.openmpi not installed (apt-get install openmpi-bin); skipping the Open MPI test across hosts")
	}
	tb := testbed.NewHosts(t, testbed.HostsConfig{Hosts: 2})
	agent := filepath.Join(t.TempDir(), "agent")
	require.NoError(t, os.WriteFile(agent, []byte(ompiAgent), 0o755))
	halo := []string{filepath.Join(bins, "halo3d"), "-n", "16", "--iters", "10", "--warmup", "2", "--sync", "sendrecv,fence,notify", "--json"}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	args := append([]string{"netns", "exec", tb.Names[0], mpirun, "--allow-run-as-root", "-n", "8",
		"--host", tb.Names[0] + ":4," + tb.Names[1] + ":4", "--mca", "plm_rsh_agent", agent, "--mca", "routed", "direct",
		"--mca", "oob_tcp_if_include", "10.78.0.0/16", "--bind-to", "none"}, halo...)
	cmd := exec.CommandContext(ctx, "ip", args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "%s%s", out, stderr.String())
	sums := haloChecksums(t, string(out))
	require.Len(t, sums, 4, "three variants and the serial reference: %s", out)

	ref, rstderr, code := runJob(t, append([]string{"-n", "8", "--tag-output=false"}, halo...)...)
	require.Equal(t, 0, code, rstderr)
	require.Equal(t, haloChecksums(t, ref), sums, "the same checksums as under rvmarun")

	// Ranks of one host meet over shared memory, the others over UDP,
	// although the hosts share a kernel: Open MPI's node names tell them
	// apart, as rvmarun's host names do.
	self, err := os.Executable()
	require.NoError(t, err)
	args = append(args[:len(args)-len(halo)], "-x", envRole+"=transport", self)
	cmd = exec.CommandContext(ctx, "ip", args...)
	stderr.Reset()
	cmd.Stderr = &stderr
	out, err = cmd.Output()
	require.NoError(t, err, "%s%s", out, stderr.String())
	lines := regexp.MustCompile(`(?m)^transport (\d+) (\d+) (\S+)$`).FindAllStringSubmatch(string(out), -1)
	require.Len(t, lines, 8*7, "%s", out)
	for _, l := range lines {
		me, _ := strconv.Atoi(l[1])
		p, _ := strconv.Atoi(l[2])
		want := "udp"
		if me/4 == p/4 {
			want = "shm"
		}
		require.Equal(t, want, l[3], "rank %d to rank %d", me, p)
	}
}

// haloChecksums reads halo3d's --json lines (rank 0's), checks that each
// is ok, and returns their checksums by variant.
func haloChecksums(t *testing.T, out string) map[string]float64 {
	t.Helper()
	sums := map[string]float64{}
	for _, line := range strings.Split(out, "\n") {
		if !strings.HasPrefix(line, "{") {
			continue
		}
		var r struct {
			Sync     string
			Checksum float64
			OK       bool
		}
		require.NoError(t, json.Unmarshal([]byte(line), &r), line)
		require.True(t, r.OK, line)
		sums[r.Sync] = r.Checksum
	}
	return sums
}
