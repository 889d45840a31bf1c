// Package shmfab is the shared-memory fabric behind verbs' shm provider:
// ports of processes on one host exchange packets (package wire) through
// rings in shared memory instead of sockets.
//
// Each port owns a segment, an anonymous memfd mapped shared, made of a
// header and Rings single-producer, single-consumer byte rings, one per
// sending port. A port's address (its GID) is a unique-local IPv6 address
// that carries the owner's pid and the segment's descriptor, so a sender
// maps a destination's segment through /proc/PID/fd/FD without any
// registry or name in /dev/shm; the segment disappears with the last
// process that maps it, crashed or not. A sender claims a free ring in the
// destination's segment with a compare-and-swap of its token (pid and
// descriptor), then appends length-prefixed encoded packets and publishes
// them by advancing the ring's head; the receiver parses them in place,
// hands them to the handler and then advances the tail, which frees the
// space. Ports of different fabric names refuse each other.
//
// Waiting: the receiver spins for a while after traffic (RVMA_SPIN), then
// (with one Go processor, once the process has neither polled nor spun
// for a while: a sleeping system call would hold the processor a waiter
// needs) marks itself asleep and blocks on a futex in its header; a sender that
// finds it asleep bumps the futex word and wakes it, so an idle port costs
// no processor and a wake-up is one system call.
//
// Robustness: nothing is ever locked across processes. A sender that dies
// leaves at worst an unpublished entry; the receiver notices the dead pid
// (every 100 ms) and frees its ring. A receiver that dies stops draining;
// senders drop packets once its ring stays full and its pid is gone, and
// the transport above fails its connections by timeout. A corrupt ring
// (lengths that do not fit, undecodable packets) is discarded and counted
// (Stats.Dropped), as a malformed datagram would be.
//
// Direct access (memory.go; fabric.Exporter, Accessor, BoxSharer, Puller,
// Allocator): a segment also holds tables
// of the regions its device exported (remote key, rights, protection
// domain, address, and where the bytes are: an allocation from Alloc,
// which peers map, or ordinary memory, reached with process_vm_writev/
// readv), of the QPs ready to take direct accesses, and of the mailbox
// windows whose counting boxes (package shmbox) it shares. An initiator
// copies into or out of a peer's region, runs atomics on it and places
// mailbox puts itself; a withdrawn region is waited out through per-sender
// busy words, so the owner never sees an access after Unexport. Tables
// are read as untrusted: every offset and length is checked against the
// mapping before use.
//
// A Port is safe for concurrent use: sends are serialised per port, and
// so are its direct accesses; one goroutine receives and runs the
// handler. Packets handed to the handler alias the ring and are valid
// only during the call. Memory from Alloc belongs to the caller until
// Free.
package shmfab
