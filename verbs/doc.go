// Package verbs is rvma's soft RDMA NIC: the ibverbs object model in Go,
// running entirely in software over pluggable providers.
//
// # Objects
//
// A Device is opened from a provider URI (loop://NAME in process,
// udp://IP:PORT[,IP:PORT...] over UDP, shm://NAME between the processes of
// a host) and has one or more GIDs, its local addresses. A PD groups memory regions
// and queue pairs. An MR registers a caller-owned []byte with access rights
// and random local and remote keys. A CQ collects flat WorkCompletion values.
// A QP (RC or UC) is bound to one GID and moves through the states Reset,
// Init, ReadyToReceive, ReadyToSend and Error; an SRQ is a receive queue
// several QPs share. The connection manager (package cm) exchanges
// Endpoints and brings QPs to ReadyToSend.
//
// Operations are SEND and SEND with immediate, RDMA WRITE and WRITE with
// immediate, RDMA READ, fetch-and-add and compare-and-swap on 8 aligned
// bytes, and rvma's mailbox write, whose target is a 64-bit mailbox address
// and offset placed by the target's MailboxHandler instead of an IOVA and a
// key.
//
// # Semantics
//
// RC is reliable: in order, exactly once, acknowledged, with go-back-N
// retransmission after a sequence NAK or a timeout (ConnectConfig.Timeout
// as the floor of a timeout that follows measured round trips, RFC 6298
// style, and doubles after each timeout up to MaxTimeout; RetryCount
// retries), receiver-not-ready NAKs for SENDs that find no receive
// posted (RNRRetry), duplicate READs re-executed and duplicate atomics
// answered from a result cache so that no atomic executes twice. UC sends
// without acknowledgement or retransmission: a message that loses a packet
// produces no completion at the target, and the initiator completes as
// soon as the message is sent.
//
// Access is checked at the target, as a NIC checks it: a remote access with
// a wrong key, outside the region, without the right, or to a deregistered
// region fails at the initiator with StatusRemoteAccessError and writes
// nothing. Such a failure, and every local error (a wrong lkey or an SGE
// outside its region: StatusLocalProtectionError), moves the QP to Error,
// where every outstanding request completes with StatusFlushed, as in
// InfiniBand.
//
// Where rvma differs from ibverbs: there are no memory windows, no UD or
// XRC, and no completion channels (CQ.Wait blocks with a context instead);
// atomics operate in host byte order; a READ larger than the window is
// requested in pieces; PostSend returns ErrQPState in Reset, Init and
// ReadyToReceive but accepts and flushes requests in Error.
//
// # Concurrency and ownership
//
// Every object is safe for concurrent use. Requests posted to one QP
// execute in post order. Completions carry values only; Poll copies them
// into the caller's slice and allocates nothing. The engine calls out
// (to a provider's Send, to a MailboxHandler) only with none of its QPs'
// locks held, so a handler may post; a build with -tags rvmadebug checks
// that rule, and the engine's other locking rules, and panics where one is
// broken (make test-debug).
//
// The caller owns every buffer. A registered buffer must stay registered
// while requests that name it are outstanding; the initiator's source bytes
// are read when packets are sent (and again on retransmission), so they
// must not change until the request completes, as with a hardware NIC.
// Inline data is copied at post time. Bytes placed by remote writes are
// visible to the target's goroutines once they observe a completion that
// follows them (the initiator's completion, communicated, or the target's
// own receive completion). After MR.Deregister returns, the device never
// touches the buffer again.
//
// # Progress
//
// A device makes progress on its own (a goroutine per UDP socket), and also
// in the goroutines that poll it: CQ.Poll and the spin of CQ.Wait receive
// and handle arrived packets in the caller's goroutine, and Device.Progress
// does the same for callers that poll memory rather than a CQ. Polling saves
// a goroutine hand-off per packet, which is most of a small message's
// latency over UDP. Requesters ask for an immediate acknowledgement only
// when they need it (signaled requests, every quarter window, a half-full
// send queue); otherwise the responder acknowledges within an eighth of the
// retransmission timeout (at most 1ms), coalescing.
//
// # Providers
//
// The loop provider connects devices that open the same fabric name in one
// process. It behaves like a NIC rather than a function call: packets pass
// through the destination port's queue, completions are asynchronous,
// access checks happen at the target, and Device.SetFaults injects seeded
// loss, duplication, reordering and delay per GID, so higher layers can test
// loss handling deterministically without sockets. Its packets carry
// references to the initiator's memory, and the target copies them once
// into place, which is the one copy a NIC's DMA makes.
//
// The udp provider carries RoCEv2's header layout (BTH and the extension
// headers, IBTA opcodes; rvma's mailbox extension in the manufacturer range)
// in UDP datagrams, one socket per GID, with batched system calls and UDP
// GSO/GRO. A packet is accepted only from the connected peer's address and
// QP, inside the PSN window, with a valid key, and with a trailer (in the
// ICRC position) that is the sender's packet counter and an AES-GMAC tag
// over the whole packet under the receiving QP's per-connection key
// (Endpoint.MACKey), the counter new to the connection's replay window;
// with DeviceConfig.NoMAC, and on shm and loop ports, a CRC-32C keyed by
// the receiver's connection secret instead. See package internal/wire.
//
// The shm provider (shm://NAME) connects the processes of one host through
// rings in shared memory (package internal/shmfab), and beyond packets it
// lets a requester reach the peer's memory itself, as one host's CPUs do:
// memory from PD.AllocMR is shared with the host's processes, so a WRITE
// or READ into it is one copy by the initiator, done before PostSend
// returns, and an atomic is the CPU's atomic instruction on the shared
// word; registered caller memory is reached with process_vm_writev/readv
// where the kernel allows it (CrossMemoryAttach says), else through the
// rings. A WRITE with immediate places its bytes the same way and sends
// only the notification; a large mailbox write leaves its payload for the
// target to pull into place; a mailbox write into a window the target
// shares (Device.ShareMailbox, which package mailbox uses) is placed and
// counted by the initiator. A direct operation is made only when
// everything the QP posted before it has taken effect at the target, and
// only on behalf of the peer's QP while it is ready (a destroyed QP, one in
// error, a region deregistered, of another PD, out of range or without the
// right, a dead process, a port under fault injection: all go as packets,
// whose handling at the target decides the outcome as everywhere else).
// Remote atomics on shared memory are atomic with respect to each other
// and to the owner's sync/atomic operations on the same aligned word; on
// caller memory the owner's engine executes them with the same
// instructions, so the rule is the same: the owner uses sync/atomic on
// words that peers update with atomics. Composite devices
// ("udp://...+shm://...") combine providers, one GID each.
package verbs
