// Package cm is rvma's connection manager, the rdma_cm role: it exchanges
// what two queue pairs need to know about each other (QP number, first PSN,
// GID, MTU, the per-connection secret and the transport type) over a TCP
// connection, and brings both QPs to ReadyToSend, so that higher layers say
// Dial and Listen and never copy QP attributes by hand.
//
// The exchange is three messages, as InfiniBand's CM does it: the dialer
// sends a request (REQ) with its endpoint and optional private data; the
// listener's application accepts it with a QP, which is connected, and a
// reply (REP) carries that QP's endpoint back; the dialer connects its QP
// and confirms (RTU), after which both sides may send. A listener may
// reject a request instead (REJ), with a reason the dialer receives.
//
// With a key (Config.Key, ListenerConfig.Key: the job's), every message
// carries an HMAC-SHA256 over the handshake so far, with fresh nonces from
// both sides, so that only holders of the key connect, a captured request
// cannot be replayed, and the connection's secret and MAC key travel
// masked. Requests are read concurrently, each within a handshake
// timeout, and connections still sending theirs are bounded.
//
// It works with every provider, because it only moves verbs.Endpoint
// values. Listeners and requests are safe for concurrent use; each Accept
// and Dial runs its own TCP connection, which is closed once the QPs are
// connected.
package cm
