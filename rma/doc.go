// Package rma is rvma's MPI-style one-sided communication: communicators
// of ranks, windows of memory that other ranks put into, get from and
// accumulate into, MPI's synchronisation (fence, post/start/complete/wait,
// locks, flushes), and RVMA's additions, notified windows and rewind.
//
// # Processes
//
// Init bootstraps a Comm from the environment (rvmarun's variables, PMI-2
// or PMI-1 over PMI_FD as MPICH's Hydra mpiexec and Slurm's srun
// --mpi=pmi2 offer it, Open MPI's mpirun, Slurm with RVMA_RENDEZVOUS, or
// a singleton); NewWorld starts ranks as goroutines of one process, for
// tests and examples. Ranks publish their connection manager's address in
// a key-value rendezvous and connect a queue pair to a peer on first use,
// so a job of N ranks opens only the connections it uses. By default
// (Config.Provider "auto") ranks of one host connect through shared
// memory and the others over UDP, over one composite device per rank;
// on shared memory a put, get or atomic into a window from Allocate is a
// copy or CPU atomic made by the origin, and a notified put is placed and
// counted by the origin in the target's shared mailbox. Collectives
// (Barrier, Bcast, Allgather, AllreduceInt64/Float64) and point-to-point
// messages (Send, Isend, Recv) run over the same connections.
//
// # Windows
//
// Create (over caller memory) and Allocate are collective. Put and Get are
// RDMA WRITEs and READs into the target's registered memory, one per
// contiguous run of target bytes (Layout describes strided data; into a
// plain window, runs of under 64 bytes travel packed, as one message the
// target unpacks). Accumulate, GetAccumulate, FetchAndOp and
// CompareAndSwap are active messages that the target's progress engine
// applies element by element with atomic instructions (elements not
// aligned to their size under a lock: they are accepted, as MPICH does),
// except FetchAndOp (sum, no-op) and CompareAndSwap on aligned 8-byte
// elements, which use the NIC's atomics while no accumulate message to
// that target is in flight. Into a window of this host from Allocate
// (shm), each of them on aligned elements is a CPU atomic made by the
// origin on the mapped window, while none of its accumulates to that
// target is in flight on the QP. All kinds are atomic with respect to each
// other. All accumulate functions from one origin to one target apply in
// issue order (MPI's default ordering), whichever engine applies them.
// Request-returning variants (Rput, Rget, Raccumulate, ...) complete
// individually; the others complete at the next synchronisation.
//
// Synchronisation follows MPI-4.1's chapter on one-sided communication:
// Fence (assertions accepted; ModeNoSucceed ends the epochs), Post, Start,
// Complete, Wait and Test (Complete's message to each target travels
// behind the origin's operations on the same connection, so it costs no
// extra round trip; gets in flight complete before it, as a READ may read
// the target's memory again when a response is lost), Lock and Unlock (shared or exclusive, taken with the
// NIC's atomics on a lock word in the target's memory: passive target, the
// target does nothing), LockAll, UnlockAll, Flush, FlushAll, FlushLocal,
// FlushLocalAll and Sync. Memory is unified: a window's memory is the
// caller's, and bytes placed by remote operations are visible once the
// operation is complete by one of these calls.
//
// A failure never leaves other ranks waiting: Fence, Free and window
// creation fail on every rank when they fail on one (ErrRemote, naming it,
// where the failure did not happen); Complete always tells its targets
// (whose Wait then fails with ErrRemote); Unlock releases the lock even
// when an operation failed; and Close, once an operation failed, waits for
// the other ranks at most Config.CloseTimeout. A rank that dies fails
// every rank's Barrier and Fence with ErrPeer naming it, not only its
// neighbours': a rank waiting for a message probes the sender every
// second, so a dead one breaks the connection within RC's retransmission
// timeouts (about 5 s with the defaults, Config.Connect), and the
// dissemination rounds pass the news on.
//
// # Multipath
//
// With Config.Paths > 1 (RVMA_PATHS, rvmarun --paths) a connection between
// two ranks has several paths, one local address each, after Virtuoso:
// contiguous puts and gets of at least Config.Multipath.Small (64 KiB)
// are split over the paths by a multipath.Conn in proportion to their
// capacity (probed when the connection is dialed, then measured), and a
// path that fails hands its undelivered share to the others
// (a put into a notified window cannot be re-sent, as part of it may have
// been counted: it fails instead). Everything else uses the first path's
// RC connection. Comm.Paths reports each path's state. Split operations
// complete like any other (flushes, fences and unlocks wait for them).
// Puts into notified windows keep their epochs: only per-origin windows
// that count bytes have their puts split, only puts that end within their
// epoch, and a put that starts the next epoch (or crosses the expectation)
// waits for the origin's puts in flight to that target; within an epoch,
// puts pipeline.
//
// # Long-haul peers
//
// With Config.LongHaul (RVMA_LONGHAUL), puts into notified windows toward
// the selected peers travel over the reliability layer (SDR-RDMA's
// unreliable-connected writes with chunk bitmaps and selective repeat or
// erasure coding) instead of RC's go-back-N, which collapses on long lossy
// links; each put lands straight in the target's mailbox buffer and counts
// once, when complete. Comm.LongHaul exposes the connection (RTT, loss,
// link model). A put the target refuses fails with mailbox.ErrRefused.
//
// # Recovering from a rank's death
//
// Under rvmarun --restart K (RVMA_INCARNATION set), a rank whose process
// dies is started again, with the same rank and the next incarnation
// (Comm.Incarnation), up to K times. The launcher tells every rank at
// once, through the rendezvous: operations and waits toward the dead rank,
// and every wait of every rank (WaitEpoch, collectives, locks, PSCW waits,
// connecting), fail with ErrPeer. The application then calls Recover on
// every rank; the respawned rank calls it after creating the windows the
// first incarnation had, in the same order (Comm.Restarted says it is
// one). Recover agrees on membership, gives up connections to the dead
// incarnation (nothing it sent lands afterwards), and rewinds every
// notified window with History to the latest epoch that every rank
// retains; the respawned rank's window comes from its buddy's replica
// (NotifyConfig.Replicate: rank r's buddy is rank r+1). Then every rank
// goes on from Win.Epoch():
//
//	w, _ := comm.Allocate(ctx, size, &rma.WinConfig{Notify: &rma.NotifyConfig{
//		ExpectFrom: expect, History: 4, Every: 10, Replicate: true}})
//	e := 0
//	if comm.Restarted() {
//		comm.Recover(ctx)
//		e = int(w.Epoch())
//	} else {
//		initialise(w.Bytes())
//		w.Snapshot(ctx) // epoch 0 is retained too
//	}
//	for e < steps {
//		err := step(ctx, w, e+1) // puts, then WaitEpoch
//		if errors.Is(err, rma.ErrPeer) {
//			if err := comm.Recover(ctx); err != nil {
//				return err // ErrLost, ErrNotRetained: the job cannot go on
//			}
//			e = int(w.Epoch())
//			continue
//		}
//		e++
//	}
//
// State the application keeps outside notified windows is its own to
// restore (keep it in the window, as examples/rewind and examples/halo3d
// do). History must cover how far apart the ranks' epochs can be (a
// stencil's neighbours are at most one apart). A rank that dies during
// Recover makes it start over with its next incarnation. Recover fails
// with ErrLost when a respawned rank's buddy died with it (or a window
// keeps no replicas), and with ErrNotRetained when no epoch is retained
// everywhere: never with wrong data. Plain windows' memory is not
// restored; their synchronisation state (locks, epochs) is reset.
//
// # Where rvma differs from MPI
//
//   - A notified window (WinConfig.Notify) is RVMA's: the target states how
//     many bytes (or puts) it expects per epoch, from all origins or per
//     origin, and WaitEpoch returns when they have arrived, with no fence
//     and no extra message (mailbox thresholds; MPI has no equivalent,
//     see mpi-forum/mpi-issues#48 and #59). Puts into it need no access
//     epoch. Rewind rolls it back to an earlier completed epoch (from
//     snapshots, NotifyConfig.History) after a failure; AbandonEpoch
//     discards a partial epoch.
//   - FlushLocal equals Flush: origin buffers are read again if a packet is
//     retransmitted, so they are released only when the target has
//     acknowledged.
//   - Datatypes are element types for accumulates (Int32 ... Float64) and
//     byte layouts (Layout) for data movement, not MPI's derived types.
//   - CompareAndSwap compares floating-point elements bit for bit.
//   - Every blocking call takes a context; errors are *OpError values
//     naming the operation and the rank, wrapping the sentinels below
//     (ErrOutOfBounds, ErrNoEpoch, ErrDatatype, ErrPeer, ...). What the
//     origin can check is refused at the call, before anything moves: an
//     access outside the target's window (whatever the displacement: no
//     arithmetic overflows), a layout that overlaps itself or overflows,
//     a put into a per-origin window that does not expect this rank.
//
// # Concurrency and ownership
//
// A Comm and its windows are safe for concurrent use by several
// goroutines, with MPI's usual restriction that synchronisation calls on
// one window (fence, start/complete, post/wait, lock/unlock of one target)
// are made by one goroutine at a time, and collectives are called in the
// same order on every rank. Origin buffers of puts and accumulates must not
// change, and result buffers of gets and fetching operations must not be
// read, until the operation has completed. Buffers used as origins are
// registered with the NIC on first use and stay registered (a cache of
// 1024 regions, the oldest evicted; a region is deregistered only once no
// request built on it waits to be posted); window memory is registered
// for the window's life.
//
// Progress: a background goroutine per Comm handles incoming messages
// (accumulates, replies, synchronisation) while the application computes;
// waiting calls poll for a few microseconds, then block.
//
// A build with -tags rvmadebug checks the library's internal locking
// rules as it runs, and panics, naming the rule, where one is broken (it
// is slower: for tests).
package rma
