// Package multipath is one logical connection over several paths, after
// Virtuoso (Tian et al.): a QP per path, one per local address (GID), all
// in one PD sharing the registered memory and completing into one CQ.
//
// Atomics (FetchAdd, CompareSwap) go whole on the path the balancer
// picks. A request (Write, Read, or a mailbox Put) larger than Config.Small is
// split by a Balancer into one contiguous sub-flow per path, sized so that
// the paths finish together: Equal, Proportional (a path's share is
// proportional to its estimated capacity, Virtuoso's equation 1) or
// Adaptive (earliest expected finish, counting each path's outstanding
// bytes). Smaller requests go whole on the path the balancer picks, so
// mice are not stuck behind elephants. A request completes once, when
// every sub-flow has; its error names the failed path. Capacities are
// measured by Probe (a timed 512 KiB write per path into the peer's probe
// region, exchanged when the paths connect) and kept current from live
// completions (an EWMA of bytes over the time the path spent on the
// sub-flow). Mailbox puts need no reassembly: each sub-flow
// is placed by its own offset and counted once by the target.
//
// A path whose QP fails (retries exhausted) is marked down; the failed
// sub-flow of a Write or Read is issued again on the paths still up
// (writes are idempotent by offset). A mailbox Put's is not: part of it
// may have been counted, and the request fails instead, until the
// reliability layer's chunk bitmaps make a re-send safe.
//
// Two-sided messages use Virtuoso's hybrid (PostRecv, Send, Recv): the
// receiver advertises a posted buffer on path 0; the sender writes the
// message into it over all paths and then sends one empty SEND with
// immediate on path 0, so the receiver sees one completion per message.
//
// On lossy paths, a sub-flow is posted as work requests of at most the
// path's chunk size, which doubles while the path is clean and, once a
// loss appears (a retransmission on the path's QP), halves and then grows
// linearly (Virtuoso §3.5).
//
// A failed path comes back by Revive: the dialing side connects a new QP
// for it through the listener (which serves revivals of connections it
// accepted) and probes it; Config.Revive makes the dialing side try this
// periodically by itself.
//
// A Conn is safe for concurrent use. The memory a request names must stay
// registered and unchanged until the request completes.
package multipath
