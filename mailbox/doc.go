// Package mailbox implements RVMA's receiver-managed mailboxes (Grant et
// al., Sandia, IPDPS 2021) on rvma's soft verbs.
//
// A target initialises a Window on a 64-bit mailbox address with a
// threshold counted in bytes or in operations, and posts buffers to it.
// Initiators put to (mailbox, offset) and never learn a target address. The
// bytes of each put are placed straight into the window's head buffer by
// the verbs receive path (the one copy a NIC makes); when the count
// reaches or exceeds the threshold, the window writes a completion record
// (which buffer, how many bytes and operations, which epoch), retires the
// buffer into its history (package epoch) and makes the next posted buffer
// the head. Arrival order does not matter: counting, not "the last byte",
// completes an epoch. Waiting on a window wakes only that window's waiters.
//
// Placement is steered (bytes land at the offset the initiator named) or
// appended (each put lands after the previous one, for stream semantics and
// unknown sizes). A put that would cross the end of the buffer is refused,
// never truncated. A put is never split across epochs: a multi-packet put
// is pinned to the buffer its first packet landed in, an epoch completes
// once its count is reached and no put into it is half-placed, and puts
// that start after the count is reached go to the next buffer. Only an
// epoch ended by hand (IncEpoch, Abandon) can cut a put short; the rest of
// it is then refused with ErrEpochCrossed.
//
// When no buffer is posted, a put is answered "not ready": an RC initiator
// retries after the receiver-not-ready timer, up to its RNR retry count,
// then fails with ErrNoBuffer; nothing is lost silently. A closed window
// refuses later puts (the initiator gets ErrWindowClosed), or, with
// Config.Silent, discards them. Addresses without a window go to the
// catch-all window if there is one, and are refused otherwise. Limits let
// a target refuse work it did not ask for: a cap on posted buffers and on
// the bytes one peer may have outstanding in incomplete epochs.
//
// As in RDMA, a refusal is a remote access error for the initiator's QP,
// which moves to the error state: a window a peer may put into after it is
// closed should be Silent, or the peer must reconnect.
//
// Duplicates: over RC the transport delivers each packet exactly once, so
// no byte is counted twice. Over UC, duplicated packets would be counted
// again; on unreliable paths puts therefore go over the reliability
// package (ReliableInitiator, Target.ServeReliable): the target reserves a
// put's place (Window.Reserve), its chunks land there and are tracked in a
// bitmap, and the put counts once, when the bitmap is full (Commit).
// Reserved bytes count toward a buffer's fullness at once, so puts started
// in order are assigned to epochs in that order whatever order they
// complete in.
//
// Shared windows: a window's counters (per posted buffer: bytes and puts
// placed, reservations, puts in progress, fullness) live in a box
// (package internal/shmbox) with its own lock. On a device with shm ports
// the box is in memory shared with the host's processes and listed on the
// ports (verbs.Device.ShareMailbox): an initiator on the host then places
// a put into a posted buffer that lies in device memory (verbs.PD.AllocMR)
// and counts it itself, under the box's lock, with no packet and no work
// by the target, which learns of completed epochs from the box. Puts that
// arrive as packets (other hosts, ordinary memory, refusals) are counted
// in the same box under the same lock, so counting stays exact however
// many processes put into one window at once. The catch-all window, and
// windows of targets with a per-peer byte limit, keep a private box.
//
// Where the rules live: what a put counts, where it lands (Begin), when a
// buffer is full and when its epoch may complete (Count, Completable), what
// a reservation or a put in progress holds back, are internal/shmbox's
// functions, the one home of the counting rules, which this package owns
// and which the shm provider calls for the puts it places. Refusals (a
// closed window, a put out of range, an epoch crossed, a peer over its
// limit) are decided here, on the packet path only: an initiator on the
// host declines to place anything shmbox does not accept, and its put goes
// as packets, which this package then refuses with the reason. The box
// layout has a version (shmbox.Version) checked when a peer maps it.
//
// Targets, windows and initiators are safe for concurrent use. Posted
// buffers belong to the window until they are handed back in a completion
// record; retired buffers then belong to the window's history until they
// are evicted or rewound (see package epoch).
package mailbox
