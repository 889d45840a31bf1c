package rma

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rvma/rvma/internal/launch"
	"github.com/rvma/rvma/internal/pmitest"
	"github.com/rvma/rvma/internal/pmix/pmixtest"
	"github.com/stretchr/testify/require"
)

// clearLaunchEnv unsets every variable a launcher sets, for the test.
func clearLaunchEnv(t *testing.T) {
	for _, v := range []string{EnvRank, EnvSize, EnvKVS, EnvRendezvous, EnvPMI, launch.EnvKey, launch.EnvKeyFile,
		"PMI_FD", "PMI_RANK", "PMI_SIZE", "PMI_ID", "PMI_JOBID",
		envOMPIRank, envOMPISize, envOMPILocalSize, envOMPINodes, envOMPISession, envPMIxTmpdir, envPMIxNamespace, envOMPIJobID,
		EnvOMPIPMIx, envOMPIHNPURI, EnvAddr, "PMIX_SERVER_URI3", "PMIX_SERVER_URI4", "PMIX_SERVER_URI41", "PMIX_SERVER_URI21",
		"PMIX_SERVER_URI2", "PMIX_RANK", "PMIX_SECURITY_MODE", envPMIxHostname, "SLURM_PROCID", "SLURM_NTASKS"} {
		t.Setenv(v, "") // restored after the test
		require.NoError(t, os.Unsetenv(v))
	}
}

// Ranks of one node find each other through the file rank 0 publishes:
// created 0600 under its final name only once complete, removed once
// every rank has joined; the others wait for it.
func TestOMPILocalRendezvous(t *testing.T) {
	const n = 3
	path := filepath.Join(t.TempDir(), rendezvousPrefix+"42")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	boots := make([]boot, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := n - 1; r >= 0; r-- { // rank 0 last: the others wait for it
		wg.Add(1)
		go func() {
			defer wg.Done()
			boots[r], errs[r] = localRendezvous(ctx, r, n, path)
		}()
		if r == 1 {
			time.Sleep(20 * time.Millisecond)
		}
	}
	wg.Wait()
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
	st, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	entries, err := os.ReadDir(filepath.Dir(path))
	require.NoError(t, err)
	require.Len(t, entries, 1, "no temporary file left")
	require.Equal(t, path, boots[0].published)
	require.NotNil(t, boots[0].srv)
	for r, b := range boots {
		require.Equal(t, r, b.rank)
		require.Equal(t, n, b.size)
		require.Equal(t, boots[0].key, b.key, "rank %d has the job's key", r)
	}
	// The store works: put, barrier, get.
	each := func(f func(b boot) error) {
		var wg sync.WaitGroup
		for r := range boots {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[r] = f(boots[r])
			}()
		}
		wg.Wait()
		for r, err := range errs {
			require.NoError(t, err, "rank %d", r)
		}
	}
	each(func(b boot) error { return b.store.Put(ctx, fmt.Sprintf("k%d", b.rank), "v") })
	each(func(b boot) error { return b.store.Barrier(ctx) })
	each(func(b boot) error {
		_, err := b.store.Get(ctx, fmt.Sprintf("k%d", (b.rank+1)%n))
		return err
	})
	c := &Comm{published: boots[0].published}
	c.unpublish()
	_, err = os.Stat(path)
	require.True(t, os.IsNotExist(err))
	for _, b := range boots {
		b.store.Close()
	}
	boots[0].srv.Close()
}

// A rank whose rank 0 never publishes gives up with ctx, saying where it
// looked; a file that is not this user's alone, is a link, or is
// malformed is refused at once.
func TestOMPIRendezvousRefused(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, rendezvousPrefix+"1")
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	t0 := time.Now()
	_, err := localRendezvous(ctx, 1, 2, path)
	cancel()
	require.ErrorContains(t, err, "rank 0 did not publish the rendezvous in "+path)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Less(t, time.Since(t0), 2*time.Second)

	good := rendezvousMagic + "\n127.0.0.1:1\n" + launch.EncodeKey(launch.NewKey()) + "\n"
	for _, tc := range []struct {
		name, content string
		mode          os.FileMode
		want          string
	}{
		{"readable by others", good, 0o644, "readable by its owner only"},
		{"no magic", "127.0.0.1:1\n" + launch.EncodeKey(launch.NewKey()) + "\n", 0o600, "malformed"},
		{"bad key", rendezvousMagic + "\n127.0.0.1:1\nxyz\n", 0o600, "hex"},
		{"bad address", rendezvousMagic + "\nnowhere\n" + launch.EncodeKey(launch.NewKey()) + "\n", 0o600, "missing port"},
	} {
		require.NoError(t, os.WriteFile(path, []byte(tc.content), tc.mode))
		require.NoError(t, os.Chmod(path, tc.mode))
		_, err := localRendezvous(context.Background(), 1, 2, path)
		require.ErrorContains(t, err, tc.want, tc.name)
		os.Remove(path)
	}
	target := filepath.Join(dir, "elsewhere")
	require.NoError(t, os.WriteFile(target, []byte(good), 0o600))
	require.NoError(t, os.Symlink(target, path))
	_, err = localRendezvous(context.Background(), 1, 2, path)
	require.ErrorIs(t, err, syscall.ELOOP)
}

// Open MPI's variables: one node needs nothing more; several need
// RVMA_RENDEZVOUS (with the job's key); without a session directory the
// error says what is missing.
func TestOMPIBootstrap(t *testing.T) {
	clearLaunchEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	t.Setenv(envOMPIRank, "0")
	t.Setenv(envOMPISize, "1")
	t.Setenv(envOMPILocalSize, "1")
	_, err := bootstrap(ctx)
	require.ErrorIs(t, err, ErrBootstrap)
	require.ErrorContains(t, err, "no session directory")

	dir := t.TempDir()
	t.Setenv(envOMPISession, dir)
	t.Setenv(envPMIxNamespace, "job/7")
	b, err := bootstrap(ctx)
	require.NoError(t, err)
	require.Equal(t, filepath.Join(dir, rendezvousPrefix+"job_7"), b.published)
	b.store.Close()
	b.srv.Close()
	os.Remove(b.published)

	t.Setenv(envOMPISize, "4")
	t.Setenv(envOMPILocalSize, "2")
	_, err = bootstrap(ctx)
	require.ErrorIs(t, err, ErrBootstrap)
	require.ErrorContains(t, err, "across nodes (2 of its 4 ranks on this node; Open MPI named no PMIx server")
	require.ErrorContains(t, err, "needs RVMA_RENDEZVOUS=host:port")
	t.Setenv(EnvOMPIPMIx, "0") // PMIx refused: the message does not offer it
	_, err = bootstrap(ctx)
	require.ErrorContains(t, err, "across nodes (2 of its 4 ranks on this node) needs RVMA_RENDEZVOUS=host:port")
	t.Setenv(EnvOMPIPMIx, "2")
	_, err = bootstrap(ctx)
	require.ErrorContains(t, err, "RVMA_OMPI_PMIX=\"2\": want 1")
	t.Setenv(EnvOMPIPMIx, "")
	t.Setenv(envOMPILocalSize, "")
	os.Unsetenv(envOMPILocalSize)
	t.Setenv(envOMPINodes, "2")
	_, err = bootstrap(ctx)
	require.ErrorContains(t, err, "across nodes (2 nodes;")

	// With RVMA_RENDEZVOUS, as under Slurm: the key from the environment.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	t.Setenv(envOMPISize, "1")
	t.Setenv(EnvRendezvous, addr)
	_, err = bootstrap(ctx)
	require.ErrorContains(t, err, "an Open MPI job: launch: no job key")
	require.ErrorContains(t, err, "rvmarun --make-key")
	t.Setenv(launch.EnvKey, launch.EncodeKey(launch.NewKey()))
	b, err = bootstrap(ctx)
	require.NoError(t, err)
	require.Equal(t, addr, b.srv.Addr())
	require.Empty(t, b.published)
	b.store.Close()
	b.srv.Close()
}

// Under Open MPI across nodes (here one rank, forced), rank 0 serves the
// rendezvous on an address other nodes reach (RVMA_ADDR's, else the route
// toward mpirun's address) and publishes it with the key through PMIx;
// Init then binds that address.
func TestOMPIPMIxBootstrap(t *testing.T) {
	clearLaunchEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	srv, err := pmixtest.New(1)
	require.NoError(t, err)
	defer srv.Close()
	for _, kv := range srv.Env(0) {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	t.Setenv(envOMPIRank, "0")
	t.Setenv(envOMPISize, "1")
	t.Setenv(EnvOMPIPMIx, "1")
	t.Setenv(envOMPIHNPURI, "1.0;tcp://127.0.0.1,192.0.2.1:4000;tcp6://[::1]:4001")
	t.Setenv(envPMIxHostname, "node7")
	b, err := bootstrap(ctx)
	if err != nil && strings.Contains(err.Error(), "no address other nodes could reach") {
		t.Log("this host has only loopback:", err)
	} else {
		require.NoError(t, err)
		b.store.Close()
		b.srv.Close()
		// 127.0.0.1 is skipped (other nodes cannot reach it); 192.0.2.1
		// (TEST-NET) is routed only where a default route exists, else
		// the first non-loopback address is taken
		require.NotEmpty(t, b.addr)
		require.False(t, net.ParseIP(b.addr).IsLoopback(), b.addr)
		require.Equal(t, 1, srv.Finalized())
	}

	t.Setenv(EnvAddr, "127.0.0.1,127.0.0.2")
	b, err = bootstrap(ctx)
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1", b.addr, "RVMA_ADDR's first")
	require.Equal(t, hostIdentity()+"/node7", b.host, "the node's name tells nodes that share a kernel apart")
	host, _, _ := net.SplitHostPort(b.srv.Addr())
	require.Equal(t, "127.0.0.1", host, "the rendezvous serves there too")
	b.store.Close()
	b.srv.Close()
	require.Equal(t, []string{"127.0.0.1", "192.0.2.1"}, hnpAddrs("1.0;tcp://127.0.0.1,192.0.2.1:4000;tcp6://[::1]:4001"))
	require.Empty(t, hnpAddrs(""))
}

// The bootstrap order: rvmarun, then PMI, then Open MPI, then Slurm.
func TestBootstrapOrder(t *testing.T) {
	clearLaunchEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	t.Setenv("SLURM_PROCID", "0")
	t.Setenv("SLURM_NTASKS", "1")
	_, err := bootstrap(ctx)
	require.ErrorContains(t, err, "srun --mpi=pmi2")

	t.Setenv(envOMPIRank, "0")
	t.Setenv(envOMPISize, "1")
	t.Setenv(envOMPISession, t.TempDir())
	b, err := bootstrap(ctx)
	require.NoError(t, err, "Open MPI before Slurm")
	require.NotEmpty(t, b.published)
	b.store.Close()
	b.srv.Close()

	srv := pmitest.New(1)
	defer srv.Close()
	srv.Setenv(t, 0)
	b, err = bootstrap(ctx)
	require.NoError(t, err, "PMI before Open MPI")
	require.Empty(t, b.published)
	require.Equal(t, 2, srv.Version(0))
	require.NoError(t, b.store.Close())
	require.Equal(t, 1, srv.Finalized())

	t.Setenv(EnvPMI, "3")
	_, err = bootstrap(ctx)
	require.ErrorContains(t, err, `RVMA_PMI="3"`)
}

// rma.Init over PMI-2 with a server that never answers the fence: Init
// ends with Config.Timeout, saying where it stopped.
func TestInitPMI2Timeout(t *testing.T) {
	clearLaunchEnv(t)
	srv := pmitest.New(2) // the other rank never comes
	defer srv.Close()
	srv.Setenv(t, 0)
	t0 := time.Now()
	_, err := Init(context.Background(), &Config{Timeout: 300 * time.Millisecond, Provider: "udp"})
	require.ErrorIs(t, err, ErrBootstrap)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorContains(t, err, "kvs-fence")
	require.Less(t, time.Since(t0), 5*time.Second)
}

// A rank of rvmarun whose rendezvous already refuses connections (its
// launcher died before the rank got there) ends at once, saying why,
// rather than retrying the rendezvous for Config.Timeout: its launcher
// watch starts before the dial.
func TestInitLauncherAlreadyGone(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envHostRole+"=plain", EnvRank+"=0", EnvSize+"=2", EnvKVS+"="+addr,
		launch.EnvKey+"="+launch.EncodeKey(launch.NewKey()))
	start := time.Now()
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee, string(out))
	require.Contains(t, string(out), "the launcher is gone: its rendezvous at "+addr+" refuses connections")
	require.Less(t, time.Since(start), 30*time.Second, "the rank retried the rendezvous")
}
