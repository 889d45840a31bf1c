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
// mice are not stuck behind elephants. The bytes a split or a pick
// assigns count as the paths' outstanding bytes at once, so decisions
// made in a burst see each other. A request completes once, when every
// sub-flow has; its error names the failed path. Mailbox puts need no
// reassembly: each sub-flow is placed by its own offset and counted once
// by the target.
//
// # Probing
//
// Capacities are measured by probes (a timed 512 KiB write per path into
// the peer's probe region, exchanged when the paths connect) and kept
// current from live completions (an EWMA of bytes over the time the path
// spent on the sub-flow). Dial probes every path before it returns, so
// the first request is already split in proportion to the paths'
// capacities, and a path whose probe is not acknowledged starts down
// (Config.NoProbe skips this: paths are then up once connected and split
// equally until measured). Probe measures again.
//
// # Failover
//
// A sub-flow is posted as work requests of at most the path's chunk size,
// each tracked on its own, so a failure tells which chunks arrived. A
// path whose QP fails (retries exhausted) is marked down. Of a Write's or
// Read's failed sub-flow, only the chunks that did not complete are
// issued again, split by the balancer over the paths still up (writes are
// idempotent by offset). A mailbox Put's is not: a chunk that failed may
// still have been counted by the target, so the request fails instead,
// until the reliability layer's chunk bitmaps make a re-send safe.
//
// A failed path comes back by Revive: the dialing side connects a new QP
// for it through the listener (which serves revivals of connections it
// accepted), and each side probes the path over the new QP. On each side
// the path is up again only once that side's probe is acknowledged, and
// it carries no data before: the connection manager's TCP exchange goes to
// the listener's address by whatever route the host picks, so it proves
// nothing about the path. Config.Revive makes the dialing side try this
// periodically by itself; while attempts fail, the wait between them
// doubles, up to Config.ReviveMax.
//
// Paths reports each path's state, capacity and outstanding bytes, and
// counters over the connection's life (bytes delivered, posted, and
// re-issued from failed paths) that never go down, also not across a
// revival.
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
// A Conn is safe for concurrent use. The memory a request names must stay
// registered and unchanged until the request completes.
package multipath
