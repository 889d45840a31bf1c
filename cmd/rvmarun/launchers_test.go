package main

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/internal/launch"
	"github.com/rvma/rvma/internal/pmitest"
	"github.com/rvma/rvma/internal/pmix/pmixtest"
	"github.com/rvma/rvma/rma"
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
	mpirunPutwin(t, "launch")

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

// Open MPI's mpirun across nodes, as a fake PMIx server (internal/pmix/
// pmixtest) and the variables Open MPI sets stand for it: two "nodes" of
// two ranks each (OMPI_COMM_WORLD_LOCAL_SIZE=2 of 4), told apart by
// RVMA_HOST. Rank 0 publishes the rendezvous and the job's key through
// PMIx, the others read it after the fence, every rank finalizes, and the
// ranks of one node meet over shared memory, the others over UDP. With a
// key file, only the address crosses PMIx.
func TestOpenMPIPMIxFake(t *testing.T) {
	for _, keyFile := range []bool{false, true} {
		t.Run(fmt.Sprintf("keyfile=%v", keyFile), func(t *testing.T) {
			const n = 4
			srv, err := pmixtest.New(n)
			require.NoError(t, err)
			defer srv.Close()
			var extra []string
			if keyFile {
				kf := filepath.Join(t.TempDir(), "key")
				require.NoError(t, os.WriteFile(kf, []byte(launch.EncodeKey(launch.NewKey())+"\n"), 0o600))
				extra = append(extra, launch.EnvKeyFile+"="+kf)
			}
			self, err := os.Executable()
			require.NoError(t, err)
			cmds := make([]*exec.Cmd, n)
			outs := make([]*bytes.Buffer, n)
			for r := range cmds {
				outs[r] = new(bytes.Buffer)
				cmds[r] = exec.Command(self)
				cmds[r].Env = append(os.Environ(), srv.Env(r)...)
				cmds[r].Env = append(cmds[r].Env, extra...)
				cmds[r].Env = append(cmds[r].Env, envRole+"=transport", "OMPI_COMM_WORLD_RANK="+strconv.Itoa(r),
					"OMPI_COMM_WORLD_SIZE="+strconv.Itoa(n), "OMPI_COMM_WORLD_LOCAL_SIZE=2", rma.EnvHost+"=node"+strconv.Itoa(r/2),
					rma.EnvAddr+"=127.0.0.1") // the address rank 0 serves on and every rank binds; without it, one other nodes reach
				cmds[r].Stdout, cmds[r].Stderr = outs[r], outs[r]
				require.NoError(t, cmds[r].Start())
			}
			waitAll(t, cmds, outs, time.Minute)
			for r := range n {
				for p := range n {
					if p == r {
						continue
					}
					want := "udp"
					if p/2 == r/2 {
						want = "shm"
					}
					require.Contains(t, outs[r].String(), fmt.Sprintf("transport %d %d %s\n", r, p, want))
				}
			}
			require.Equal(t, n, srv.Finalized())
			reqs := strings.Join(srv.Requests(), "\n")
			require.Contains(t, reqs, "0: commit 1")
			require.Contains(t, reqs, "3: commit 0")
			require.Contains(t, reqs, "2: fence [4242.*] collect=true")
			require.Contains(t, reqs, "1: get 4242.0 rvma-rendezvous")
			require.NotContains(t, reqs, "0: get")
			kvs := srv.Visible(0)
			require.Len(t, kvs, 1)
			v := kvs[0].Value.(string)
			if keyFile {
				require.Regexp(t, `^127\.0\.0\.1:\d+$`, v, "the address alone")
			} else {
				require.Regexp(t, `^127\.0\.0\.1:\d+ [0-9a-f]{64}$`, v, "the address and the key rank 0 made")
			}
		})
	}
}

// Failures of the PMIx path name it: a server that is gone, and a rank
// whose key setting differs from rank 0's.
func TestOpenMPIPMIxErrors(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	one := exec.Command(filepath.Join(bins, "putwin"))
	one.Env = append(os.Environ(), "OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_LOCAL_SIZE=1",
		"PMIX_SERVER_URI3=x.0;tcp4://"+addr, "PMIX_NAMESPACE=x", "PMIX_RANK=1")
	msg, err := one.CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(msg), "an Open MPI job, through PMIx")
	require.Contains(t, string(msg), "PMIx server is gone")

	// RVMA_OMPI_PMIX=1 on one node, without a server: says so
	one = exec.Command(filepath.Join(bins, "putwin"))
	one.Env = append(os.Environ(), "OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=1", rma.EnvOMPIPMIx+"=1")
	msg, err = one.CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(msg), "named no PMIx server")
}

// Open MPI's mpirun on one node, its ranks made to meet through Open
// MPI's own PMIx server (RVMA_OMPI_PMIX=1) and not the session directory
// (whose variables the wrapper removes): the path a job across nodes
// takes, against the real server.
func TestMPIRunOpenMPIPMIx(t *testing.T) {
	mpirunPutwin(t, "PMIx", "-x", rma.EnvOMPIPMIx+"=1", "env", "-u", "OMPI_MCA_orte_jobfam_session_dir", "-u", "PMIX_SERVER_TMPDIR")
}

// mpirunPutwin runs putwin as 3 ranks under Open MPI's mpirun, with
// mpirun's arguments args before the program (a wrapper command may end
// them), and checks every rank's result; what names the test in the skip
// message.
func mpirunPutwin(t *testing.T, what string, args ...string) {
	t.Helper()
	mpirun, err := exec.LookPath("mpirun.openmpi")
	if err != nil {
		t.Skipf("mpirun.openmpi not installed (apt-get install openmpi-bin); skipping the Open MPI %s test", what)
	}
	const n = 3
	args = append(append([]string{"--oversubscribe", "-n", strconv.Itoa(n)}, args...), filepath.Join(bins, "putwin"))
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
}
