package rma

import (
	"context"
	"errors"
)

// ErrNotShared: a rank's part of a window cannot be mapped into this
// process (another host, a provider without shared memory, memory not
// from Allocate, a notified window).
var ErrNotShared = errors.New("rma: window memory not shared with this process")

// Shared returns rank's part of the window mapped into this process, for
// loads and stores with no call per access (MPI_Win_shared_query): this
// rank's own memory, or a peer's when both ranks are on one host over
// shared memory and the peer's memory came from Allocate; ErrNotShared
// otherwise. The slice is valid until Free. Accesses through it are
// ordered with the window's operations only by the window's
// synchronisation (Fence, a barrier, Sync, locks), as MPI's shared-memory
// windows are; the mapping is made once, at the first call for rank.
func (w *Win) Shared(ctx context.Context, rank int) ([]byte, error) {
	if err := w.c.checkRank("shared", rank); err != nil {
		return nil, err
	}
	if rank == w.c.rank {
		return w.mem, nil
	}
	rw := &w.remote[rank]
	if rw.size == 0 && rw.notify == 0 {
		return []byte{}, nil // nothing to map
	}
	// mapped declines while faults are injected on the port: the
	// mapping would bypass them, and so would the caller's stores.
	if m := w.mapped(ctx, rank); m != nil {
		return m.Bytes(), nil
	}
	return nil, opErr("shared", rank, ErrNotShared)
}
