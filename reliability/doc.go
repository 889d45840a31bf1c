// Package reliability is software-defined reliability for long-haul links,
// after SDR-RDMA (Khalilov et al., SC'25): RDMA's zero-copy writes over
// unreliable-connected (UC) queue pairs, with a receive bitmap that records
// which chunks arrived and a sender that repairs what is missing by
// selective repeat (SR) or Reed-Solomon erasure coding (EC), chosen per
// message by a model of the link.
//
// # Protocol
//
// The receiver posts buffers (Conn.Post); the sender's n-th message
// (Conn.Send) lands in the receiver's n-th posted buffer, as SDR's
// order-based matching. Each chunk (Config.Chunk, a multiple of the path
// MTU) is one UC write with immediate straight into the buffer; the 32-bit
// immediate carries the message id (sequence number mod 1024, 10 bits) and
// the chunk index (22 bits). A posted buffer is registered afresh for each
// message and deregistered when the message completes, so a late chunk of
// an old message is refused by the NIC and can never land in a new one;
// a chunk whose id names another message is ignored.
//
// The receiver's status of each posted buffer travels on the same QP as a
// small SEND (internal/sdrwire): the keys to write to (clear-to-send), the
// first missing chunk, the highest chunk seen and a slice of the bitmap
// after it, counts, and the floor below which every message is complete.
// Statuses go out soon after a change and at least every RTT/2; every one
// is idempotent, so losing some costs only time. The sender repeats a
// chunk the receiver reports missing once a round trip has passed since it
// was sent (the NACK variant: about one RTT to detect a loss), and any
// chunk not reported on after RTO = RTT + α·RTT (the timeout variant, for
// the tail of a message); pings measure the RTT and its variance.
//
// With EC, each stripe of K data chunks is followed by M parity chunks,
// encoded by the single injecting goroutine just before they go out, into
// the receiver's parity area. The receiver rebuilds a stripe's missing data
// chunks in place as soon as any K of its K+M chunks arrived; a stripe that
// lost more than M falls back to selective repeat of its missing data
// chunks once its parity had time to arrive (Config.Fallback). The codes
// are Cauchy Reed-Solomon (klauspost/reedsolomon), whose first M parity
// rows do not depend on the total parity count, so the receiver decodes
// any M up to its MaxParity with one decoder.
//
// # Model and policy
//
// SRTime and ECTime are the paper's completion-time model with the exact
// (ceiling) retransmission tail; the test checks both against a Monte-Carlo
// simulation of the same link, within 5%. With Scheme Auto the sender asks
// Choose per message, with the measured RTT, Config.Rate and the chunk-loss
// rate estimated from its own repairs and the receiver's decodes; the
// choice and the model's view are in SendResult.
//
// # Concurrency and buffers
//
// A Conn is safe for concurrent use. A posted buffer belongs to the Conn
// until its receive completes (Recv.Wait or Recv.Done); a sent buffer until
// its send completes (Send.Wait). Recv.Bitmap is safe to read at any time;
// Recv.Take completes a receive early with chunks missing (partial
// completion), and the sender is told to stop.
//
// The Conn polls the QP's CQ and owns its receive queue; the caller creates
// the QP with QPConfig, connects it, and closes QP, CQ and device after
// Conn.Close.
package reliability
