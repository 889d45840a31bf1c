// Package udpfab is the UDP fabric behind verbs' udp provider: RoCEv2-style
// packets (package wire) carried in UDP datagrams, one socket per GID.
//
// Its socket layer (Conn) is batch-first after wireguard-go's conn package:
// sendmmsg and recvmmsg on Linux, UDP GSO (UDP_SEGMENT) to hand the kernel
// trains of equal-size datagrams in one call and UDP GRO to receive them
// coalesced, socket buffers sized up and read back (with one warning if the
// kernel clamps them), and don't-fragment set so an oversized datagram fails
// instead of being fragmented. Each feature is probed at start and falls
// back cleanly: GSO is turned off if the kernel rejects it (EIO on a device
// without checksum offload), and Config.NoGSO and NoGRO turn them off by
// hand. Other systems get a portable one-datagram-per-call
// path.
//
// The batch syscalls are called through syscall.RawConn with preallocated
// message headers and closures, so a batch allocates nothing and a blocked
// read parks on the runtime's network poller rather than a thread. We do
// not use golang.org/x/net's ipv4.PacketConn batch API: it allocates a
// *net.UDPAddr per received message and has no GSO/GRO, and the syscalls are
// a few lines over golang.org/x/sys.
//
// A Port is safe for concurrent use: sends from several goroutines are
// serialised on the port's send batch; one goroutine receives and runs the
// handler, so the handler is never called concurrently for one port.
package udpfab
