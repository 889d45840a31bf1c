// Package wire defines the packets of rvma's soft RDMA transport: the
// InfiniBand transport headers RoCEv2 carries (BTH, RETH, AETH, ImmDt,
// AtomicETH, AtomicAckETH) in decoded form, the IBTA opcodes for the RC and UC
// transports, and rvma's mailbox-write extension, whose opcodes sit in the
// manufacturer-specific range (0xC0-0xFF) and whose extension header (MBXETH)
// carries a 64-bit mailbox address and a byte offset instead of an IOVA and
// a key.
//
// A Packet is the unit every provider moves. The in-process provider hands
// the struct itself to the receiver; a socket provider encodes it. Packets
// come from a pool (Get) and go back to it (Release); whoever holds a packet
// owns it, and a Port's Send takes ownership of the packets it is given.
//
// An encoded packet ends with a trailer in RoCEv2's ICRC position: a
// CRC-32C keyed by the receiver's connection secret, or, for a packet with
// Auth set, the sender's counter and an AES-GMAC tag under the receiver's
// key (MAC), which a receiver checks with VerifyMAC and a ReplayWindow. A
// MAC is safe for concurrent use; a ReplayWindow belongs to its QP.
//
// Payload may reference memory the packet does not own (the initiator's
// registered memory, for zero-copy transmission); such a payload is only
// read, never written, and is valid until the packet is released.
package wire
