package pmi

import (
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
)

// Env is what a launcher tells a process about its PMI session besides
// the descriptor: PMI_RANK and PMI_SIZE (Hydra, Slurm), PMI_ID (an older
// name of the rank), PMI_JOBID (Slurm).
type Env struct {
	Rank, Size, ID, JobID string
}

// EnvFromOS reads Env from the process's environment.
func EnvFromOS() Env {
	return Env{Rank: os.Getenv("PMI_RANK"), Size: os.Getenv("PMI_SIZE"), ID: os.Getenv("PMI_ID"), JobID: os.Getenv("PMI_JOBID")}
}

// v1 is PMI-1's place in the job, which its protocol does not tell: from
// PMI_RANK and PMI_SIZE.
func (e Env) v1() (rank, size int, err error) {
	rank, err1 := strconv.Atoi(e.Rank)
	size, err2 := strconv.Atoi(e.Size)
	if err1 != nil || err2 != nil || size < 1 || rank < 0 || rank >= size {
		return 0, 0, fmt.Errorf("pmi: PMI_RANK=%q PMI_SIZE=%q are not a rank of a job", e.Rank, e.Size)
	}
	return rank, size, nil
}

// identity is what PMI-2's fullinit tells the server.
func (e Env) identity() Identity {
	id := Identity{PMIRank: e.ID, JobID: e.JobID}
	if id.PMIRank == "" {
		id.PMIRank = e.Rank
	}
	return id
}

// Open starts a PMI session over rw, which it owns from then on (and
// closes on failure). Version 1 or 2 speaks that protocol only. Version 0
// asks for PMI-2 (Hydra and Slurm's pmi2 plugin accept it) and speaks
// PMI-1 if the server answers pmi_version=1 instead: with rc=0 the
// session is then PMI-1's already (as Flux's PMI-1 server answers), with
// another rc (Slurm, when another task of the node began with PMI-1) the
// PMI-1 init follows.
func Open(ctx context.Context, rw io.ReadWriteCloser, version int, env Env) (Session, error) {
	switch version {
	case 1:
		rank, size, err := env.v1()
		if err != nil {
			rw.Close()
			return nil, err
		}
		return New(ctx, rw, rank, size)
	case 2:
		return New2(ctx, rw, env.identity())
	case 0:
	default:
		rw.Close()
		return nil, fmt.Errorf("pmi: version %d: want 1 or 2 (0: either)", version)
	}
	c := newConn(rw)
	m, err := initLine(ctx, c, 2, 0)
	if err != nil {
		return nil, err
	}
	if m["pmi_version"] == "1" {
		rank, size, err := env.v1()
		if err != nil {
			err = fmt.Errorf("%w (the launcher speaks PMI-1 only)", err)
			c.breakWith(err)
			return nil, err
		}
		return newV1(ctx, c, rank, size, m["rc"] == "0")
	}
	if err := want2(m); err != nil {
		c.breakWith(err)
		return nil, err
	}
	return fullinit(ctx, c, env.identity())
}

// FromEnv opens the session the launcher offers through PMI_FD (see
// Open; version 0 negotiates). It returns ok=false when PMI_FD is not
// set.
func FromEnv(ctx context.Context, version int) (s Session, ok bool, err error) {
	fdStr := os.Getenv("PMI_FD")
	if fdStr == "" {
		return nil, false, nil
	}
	fd, err := strconv.Atoi(fdStr)
	if err != nil || fd < 0 {
		return nil, true, fmt.Errorf("pmi: PMI_FD=%q is not a descriptor", fdStr)
	}
	rw, err := fdConn(fd)
	if err != nil {
		return nil, true, err
	}
	s, err = Open(ctx, rw, version, EnvFromOS())
	return s, true, err
}

// fdConn makes a connection of an inherited descriptor (newConn makes a
// socket's a net.Conn).
func fdConn(fd int) (io.ReadWriteCloser, error) {
	f := os.NewFile(uintptr(fd), "PMI_FD")
	if f == nil {
		return nil, fmt.Errorf("pmi: PMI_FD=%d is not a descriptor", fd)
	}
	if _, err := f.Stat(); err != nil {
		f.Close()
		return nil, fmt.Errorf("pmi: PMI_FD=%d: %w", fd, err)
	}
	return f, nil
}
