package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/internal/pmitest"
)

// srun --mpi=pmi2, as its PMI-2 server (internal/pmitest, which answers as
// Slurm's pmi2 plugin does) and the variables it sets: the ranks
// bootstrap through PMI-2 with no RVMA_RENDEZVOUS and no key file (rank
// 0's key travels through the PMI key-value space), although
// SLURM_PROCID is set too.
func TestSlurmPMI2(t *testing.T) {
	const n = 3
	srv := pmitest.New(n)
	defer srv.Close()
	cmds := make([]*exec.Cmd, n)
	outs := make([]*bytes.Buffer, n)
	for r := range cmds {
		outs[r] = new(bytes.Buffer)
		f, err := srv.Conn(r)
		require.NoError(t, err)
		cmds[r] = exec.Command(filepath.Join(bins, "putwin"))
		cmds[r].ExtraFiles = []*os.File{f} // descriptor 3
		cmds[r].Env = append(os.Environ(), srv.Env(r, 3)...)
		cmds[r].Env = append(cmds[r].Env, "SLURM_PROCID="+strconv.Itoa(r), "SLURM_NTASKS="+strconv.Itoa(n), "SLURM_JOB_ID=4242")
		cmds[r].Stdout, cmds[r].Stderr = outs[r], outs[r]
		require.NoError(t, cmds[r].Start())
		f.Close()
	}
	waitAll(t, cmds, outs, time.Minute)
	for r := range cmds {
		require.Contains(t, outs[r].String(), "rank "+strconv.Itoa(r)+" of 3 got")
		require.Equal(t, 2, srv.Version(r))
	}
	require.Equal(t, n, srv.Finalized())
	reqs := strings.Join(srv.Requests(), "\n")
	require.Contains(t, reqs, "0: cmd=kvs-put;key=rvma-key;")
	require.Contains(t, reqs, "1: cmd=kvs-get;srcid=-1;key=rvma-key;")
	require.Contains(t, reqs, "2: cmd=kvs-put;key=rvma-cm-2;")
}

// Open MPI's mpirun starts rvma programs on one node with no help: rank 0
// publishes the rendezvous in the job's session directory.
func TestMPIRunOpenMPI(t *testing.T) {
	mpirun, err := exec.LookPath("mpirun.openmpi")
	if err != nil {
		t.Skip("mpirun.openmpi not installed (apt-get install openmpi-bin); skipping the Open MPI launch test")
	}
	const n = 3
	args := []string{"--oversubscribe", "-n", strconv.Itoa(n), filepath.Join(bins, "putwin")}
	if os.Geteuid() == 0 {
		args = append([]string{"--allow-run-as-root"}, args...)
	}
	cmd := exec.Command(mpirun, args...)
	cmd.Env = os.Environ()
	out := new(bytes.Buffer)
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start())
	waitAll(t, []*exec.Cmd{cmd}, []*bytes.Buffer{out}, time.Minute)
	for r := range n {
		require.Contains(t, out.String(), "rank "+strconv.Itoa(r)+" of 3 got")
	}

	// Across nodes (as this node's share of the ranks says) without
	// RVMA_RENDEZVOUS: refused, saying what to set and why.
	one := exec.Command(filepath.Join(bins, "putwin"))
	one.Env = append(os.Environ(), "OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=4", "OMPI_COMM_WORLD_LOCAL_SIZE=2")
	msg, err := one.CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(msg), "needs RVMA_RENDEZVOUS=host:port")
	require.Contains(t, string(msg), "PMIx")
}

// waitAll waits for every command to succeed, killing one that outlives
// the bound.
func waitAll(t *testing.T, cmds []*exec.Cmd, outs []*bytes.Buffer, bound time.Duration) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for r, c := range cmds {
		done := make(chan error, 1)
		go func() { done <- c.Wait() }()
		select {
		case err := <-done:
			require.NoError(t, err, outs[r].String())
		case <-time.After(time.Until(deadline)):
			for _, c := range cmds {
				c.Process.Kill()
			}
			t.Fatalf("process %d did not finish: %s", r, outs[r].String())
		}
	}
}
