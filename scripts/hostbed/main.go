// Command hostbed runs a command on a testbed of network-namespace hosts:
// it builds H hosts on one switch (internal/testbed.Hosts), runs the
// command inside the first host with the testbed in its environment, and
// removes the testbed when the command ends (or on SIGINT/SIGTERM).
//
//	go run ./scripts/hostbed [-hosts 4] [-slots 16] [-rate 1gbit] -- CMD [ARGS...]
//
// The command sees HOSTBED_HOSTS ("ns0:SLOTS,ns1:SLOTS,..." for rvmarun's
// -H or mpirun's --host), HOSTBED_NAMES (space-separated), HOSTBED_ADDRS
// (the hosts' addresses, in order), HOSTBED_ADDR0 (the first host's,
// where a launcher started there listens) and HOSTBED_AGENT, a launch
// agent in ssh's manner ("AGENT HOST COMMAND...", the command words
// joined and run by a shell in that host's namespace, under the host's
// name as hostname, so that MPI libraries that tell hosts by name see
// several: what Open MPI's rsh launcher expects; rvmarun can also use
// "ip netns exec"):
//
//	go run ./scripts/hostbed -hosts 4 -slots 16 -- sh -c 'bin/rvmarun -H $HOSTBED_HOSTS \
//	    --launch-agent $HOSTBED_AGENT --rendezvous-addr $HOSTBED_ADDR0 bin/halo3d -n 16'
//	go run ./scripts/hostbed -hosts 4 -slots 16 -- sh -c 'mpirun.openmpi --allow-run-as-root \
//	    --host $HOSTBED_HOSTS --mca plm_rsh_agent $HOSTBED_AGENT --mca routed direct ...'
//
// It needs root and iproute2.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"

	"github.com/rvma/rvma/internal/testbed"
)

// agentScript is the launch agent: "agent [ssh options] HOST COMMAND...".
// Options before the host (Hydra passes ssh's -x) are skipped.
const agentScript = `#!/bin/sh
while [ "${1#-}" != "$1" ]; do shift; done
host=$1; shift
exec ip netns exec "$host" unshare --uts sh -c "hostname $host; $*"
`

func main() {
	hosts := flag.Int("hosts", 4, "number of hosts (network namespaces), 1..200")
	slots := flag.Int("slots", 1, "slots per host in HOSTBED_HOSTS")
	rate := flag.String("rate", "", "shape every host's port to this tc rate (e.g. 1gbit); empty: unshaped")
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: hostbed [-hosts N] [-slots S] [-rate R] -- CMD [ARGS...]")
		os.Exit(2)
	}
	if err := testbed.Available(); err != nil {
		fmt.Fprintln(os.Stderr, "hostbed:", err)
		os.Exit(2)
	}
	tb, err := testbed.BuildHosts(testbed.HostsConfig{Hosts: *hosts, Rate: *rate})
	if tb != nil {
		defer tb.Close()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "hostbed:", err)
		os.Exit(1)
	}
	dir, err := os.MkdirTemp("", "hostbed")
	if err != nil {
		fmt.Fprintln(os.Stderr, "hostbed:", err)
		os.Exit(1)
	}
	defer os.RemoveAll(dir)
	agent := dir + "/agent"
	if err := os.WriteFile(agent, []byte(agentScript), 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "hostbed:", err)
		os.Exit(1)
	}
	var hl, addrs []string
	for i, ns := range tb.Names {
		hl = append(hl, fmt.Sprintf("%s:%d", ns, *slots))
		addrs = append(addrs, tb.Addrs[i].String())
	}
	cmd := exec.Command("ip", append([]string{"netns", "exec", tb.Names[0]}, flag.Args()...)...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), "HOSTBED_HOSTS="+strings.Join(hl, ","), "HOSTBED_NAMES="+strings.Join(tb.Names, " "),
		"HOSTBED_ADDRS="+strings.Join(addrs, " "), "HOSTBED_ADDR0="+addrs[0], "HOSTBED_AGENT="+agent)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "hostbed:", err)
		tb.Close()
		os.Exit(1)
	}
	go func() {
		for s := range sigs {
			cmd.Process.Signal(s)
		}
	}()
	err = cmd.Wait()
	tb.Close()
	os.RemoveAll(dir)
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			os.Exit(max(1, ee.ExitCode()))
		}
		os.Exit(1)
	}
}
