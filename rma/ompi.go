package rma

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/rvma/rvma/internal/kvs"
	"github.com/rvma/rvma/internal/launch"
	"github.com/rvma/rvma/internal/pmix"
)

// Open MPI's mpirun tells each rank its place (OMPI_COMM_WORLD_RANK,
// _SIZE, _LOCAL_SIZE) and offers its key-value space through PMIx only.
// Within one node the job needs no PMIx: rank 0 serves the rendezvous on
// loopback and publishes its address and a fresh key in a file of the
// job's session directory, a directory of the node that Open MPI makes
// for the job, readable by its user only (mode 0700), and removes when
// the job ends. Across nodes rank 0 publishes them through PMIx
// (ompipmix.go), or, with RVMA_OMPI_PMIX=0, RVMA_RENDEZVOUS must say
// where rank 0 serves, as under Slurm.

// Environment variables of Open MPI that Init reads.
const (
	envOMPIRank      = "OMPI_COMM_WORLD_RANK"
	envOMPISize      = "OMPI_COMM_WORLD_SIZE"
	envOMPILocalSize = "OMPI_COMM_WORLD_LOCAL_SIZE"
	envOMPINodes     = "OMPI_MCA_orte_num_nodes"          // Open MPI 4 (ORTE)
	envOMPISession   = "OMPI_MCA_orte_jobfam_session_dir" // Open MPI 4: the job family's directory on this node
	envPMIxTmpdir    = "PMIX_SERVER_TMPDIR"               // the node's PMIx server's directory (Open MPI 4 and 5)
	envPMIxNamespace = "PMIX_NAMESPACE"                   // the job's PMIx namespace, unique per job
	envOMPIJobID     = "OMPI_MCA_ess_base_jobid"          // Open MPI 4's job id
	rendezvousPrefix = "rvma-rendezvous-"                 // + the job's namespace: the file rank 0 publishes
	rendezvousMax    = 4096                               // bytes of a rendezvous file read
	rendezvousPoll   = 100 * time.Millisecond             // the longest pause between two looks for the file
	rendezvousFirst  = 2 * time.Millisecond               // the first pause
	rendezvousPerm   = fs.FileMode(0o600)                 // the file's mode
	rendezvousMagic  = "rvma-rendezvous 1"                // the file's first line
	rendezvousLocal  = "127.0.0.1:0"                      // where rank 0 serves a job of one node
)

// ompiBootstrap is the bootstrap under Open MPI's mpirun; ok=false when
// OMPI_COMM_WORLD_RANK is not set.
func ompiBootstrap(ctx context.Context) (b boot, ok bool, err error) {
	r, ok, err := envInt(envOMPIRank)
	if !ok && err == nil {
		return boot{}, false, nil
	}
	s, _, err2 := envInt(envOMPISize)
	if err = errors.Join(err, err2); err != nil {
		return boot{}, true, err
	}
	if s < 1 || r < 0 || r >= s {
		return boot{}, true, fmt.Errorf("%w: %s/%s give rank %d of %d", ErrBootstrap, envOMPIRank, envOMPISize, r, s)
	}
	const job = "an Open MPI job"
	if addr := os.Getenv(EnvRendezvous); addr != "" {
		b, err := rendezvousAt(ctx, r, s, addr, job)
		return b, true, err
	}
	several, why, err := ompiNodes(s)
	if err != nil {
		return boot{}, true, err
	}
	mode := os.Getenv(EnvOMPIPMIx)
	switch mode {
	case "", "0", "1":
	default:
		return boot{}, true, fmt.Errorf("%w: %s=%q: want 1 (through PMIx even on one node) or 0 (never)", ErrBootstrap, EnvOMPIPMIx, mode)
	}
	if (several && mode != "0") || mode == "1" {
		env, ok, err := pmix.FromEnv()
		if ok && err == nil {
			b, err := pmixRendezvous(ctx, r, s, env)
			if err != nil {
				return boot{}, true, fmt.Errorf("%w: %s, through PMIx: %w", ErrBootstrap, job, err)
			}
			return b, true, nil
		}
		if err != nil {
			return boot{}, true, fmt.Errorf("%w: %s: %w", ErrBootstrap, job, err)
		}
		if !several {
			return boot{}, true, fmt.Errorf("%w: %s: %s=1 but Open MPI named no PMIx server (PMIX_SERVER_URI3)", ErrBootstrap, job, EnvOMPIPMIx)
		}
	}
	if several {
		if mode != "0" {
			why += "; Open MPI named no PMIx server (PMIX_SERVER_URI3) to publish rank 0's address through"
		}
		return boot{}, true, fmt.Errorf("%w: %s across nodes (%s) needs %s=host:port where rank 0 serves the rendezvous, "+
			"and %s naming the job's key file (rvmarun --make-key FILE): without them the other nodes' ranks cannot find rank 0",
			ErrBootstrap, job, why, EnvRendezvous, launch.EnvKeyFile)
	}
	dir := cmpEnv(envOMPISession, envPMIxTmpdir)
	if dir == "" {
		return boot{}, true, fmt.Errorf("%w: %s: Open MPI gave no session directory (%s or %s) to publish the rendezvous in; set %s=host:port",
			ErrBootstrap, job, envOMPISession, envPMIxTmpdir, EnvRendezvous)
	}
	path := filepath.Join(dir, rendezvousPrefix+fileToken(cmpEnv(envPMIxNamespace, envOMPIJobID)))
	b, err = localRendezvous(ctx, r, s, path)
	if err != nil {
		return boot{}, true, fmt.Errorf("%w: %s: %w", ErrBootstrap, job, err)
	}
	return b, true, nil
}

// ompiNodes tells whether the job's ranks run on several nodes, and how
// that is known: this node holds fewer than all ranks
// (OMPI_COMM_WORLD_LOCAL_SIZE), or else ORTE says so
// (OMPI_MCA_orte_num_nodes).
func ompiNodes(size int) (several bool, why string, err error) {
	local, ok, err := envInt(envOMPILocalSize)
	if err != nil {
		return false, "", err
	}
	if ok && local > 0 {
		return local < size, fmt.Sprintf("%d of its %d ranks on this node", local, size), nil
	}
	n, ok, err := envInt(envOMPINodes)
	if err != nil || !ok {
		return false, "", err
	}
	return n > 1, fmt.Sprintf("%d nodes", n), nil
}

// cmpEnv is the first of the variables that is set and not empty.
func cmpEnv(names ...string) string {
	for _, n := range names {
		if v := os.Getenv(n); v != "" {
			return v
		}
	}
	return ""
}

// fileToken makes s usable in a file name.
func fileToken(s string) string {
	if s == "" {
		return "job"
	}
	return strings.Map(func(r rune) rune {
		if r == '/' || r == os.PathSeparator || r < ' ' {
			return '_'
		}
		return r
	}, s)
}

// localRendezvous bootstraps rank r of s ranks of one node through the
// file path: rank 0 serves the rendezvous on loopback under the job's key
// (RVMA_KEY or RVMA_KEY_FILE if set, else a fresh one) and publishes both
// there; the others wait for the file, bounded by ctx.
func localRendezvous(ctx context.Context, r, s int, path string) (boot, error) {
	if r == 0 {
		key, err := launch.KeyFromEnv()
		if errors.Is(err, launch.ErrNoKey) {
			key, err = launch.NewKey(), nil
		}
		if err != nil {
			return boot{}, err
		}
		srv, err := kvs.ListenConfig(rendezvousLocal, s, &kvs.ServerConfig{Key: key})
		if err != nil {
			return boot{}, err
		}
		if err := publishRendezvous(path, srv.Addr(), key); err != nil {
			srv.Close()
			return boot{}, err
		}
		cl, err := kvs.Dial(ctx, srv.Addr(), key)
		if err != nil {
			os.Remove(path)
			srv.Close()
			return boot{}, err
		}
		return boot{rank: r, size: s, store: cl, own: true, srv: srv, key: key, published: path}, nil
	}
	addr, key, err := awaitRendezvous(ctx, path)
	if err != nil {
		return boot{}, err
	}
	cl, err := kvs.Dial(ctx, addr, key)
	if err != nil {
		return boot{}, fmt.Errorf("the rendezvous %s published in %s: %w", addr, path, err)
	}
	return boot{rank: r, size: s, store: cl, own: true, key: key}, nil
}

// publishRendezvous writes the rendezvous's address and the job's key to
// path, readable by its owner only, atomically: under a temporary name
// first, renamed once complete, so that a reader never sees half of it.
func publishRendezvous(path, addr string, key []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".rvma-rendezvous-*") // mode 0600
	if err != nil {
		return fmt.Errorf("publishing the rendezvous: %w", err)
	}
	tmp := f.Name()
	_, err = fmt.Fprintf(f, "%s\n%s\n%s\n", rendezvousMagic, addr, launch.EncodeKey(key))
	err = errors.Join(err, f.Chmod(rendezvousPerm), f.Sync(), f.Close())
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("publishing the rendezvous in %s: %w", path, err)
	}
	return nil
}

// awaitRendezvous waits until rank 0 has published the rendezvous in
// path, or ctx ends.
func awaitRendezvous(ctx context.Context, path string) (addr string, key []byte, err error) {
	for delay := rendezvousFirst; ; delay = min(2*delay, rendezvousPoll) {
		addr, key, err := readRendezvous(path)
		if !errors.Is(err, fs.ErrNotExist) {
			return addr, key, err
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return "", nil, fmt.Errorf("rank 0 did not publish the rendezvous in %s: %w", path, ctx.Err())
		case <-t.C:
		}
	}
}

// readRendezvous reads what publishRendezvous wrote, refusing a file that
// is not a regular file of this user readable by it alone (one that
// someone else could have planted or read).
func readRendezvous(path string) (addr string, key []byte, err error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscallNoFollow, 0)
	if err != nil {
		return "", nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return "", nil, err
	}
	if !st.Mode().IsRegular() || st.Mode().Perm()&0o077 != 0 || !ownedByMe(st) {
		return "", nil, fmt.Errorf("rendezvous file %s (mode %v) is not a regular file readable by its owner only, or not this user's", path, st.Mode())
	}
	buf := make([]byte, rendezvousMax)
	n, _ := f.Read(buf)
	lines := strings.Split(string(buf[:n]), "\n")
	if len(lines) < 3 || lines[0] != rendezvousMagic || lines[1] == "" {
		return "", nil, fmt.Errorf("rendezvous file %s is malformed", path)
	}
	key, err = launch.DecodeKey(lines[2])
	if err != nil {
		return "", nil, fmt.Errorf("rendezvous file %s: %w", path, err)
	}
	if _, _, err := net.SplitHostPort(lines[1]); err != nil {
		return "", nil, fmt.Errorf("rendezvous file %s: %w", path, err)
	}
	return lines[1], key, nil
}
