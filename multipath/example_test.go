package multipath_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"

	"github.com/rvma/rvma/mailbox"
	"github.com/rvma/rvma/multipath"
	"github.com/rvma/rvma/verbs"
)

// One logical connection over the three GIDs of an in-process fabric: the
// listener accepts it, Dial connects and probes every path, and a Write
// is split over the paths in proportion to their measured capacities.
// Both ends are in one process here, so the Write names dstMR's address
// and rkey directly; ExampleConn_Write shows how a target sends them.
func Example() {
	ctx := context.Background()
	open := func() (*verbs.Device, *verbs.PD) {
		dev, err := verbs.Open(ctx, "loop://multipath-example?gids=3", nil)
		if err != nil {
			panic(err)
		}
		pd, _ := dev.AllocPD()
		return dev, pd
	}
	devA, pdA := open()
	defer devA.Close()
	devB, pdB := open()
	defer devB.Close()

	ln, err := multipath.Listen(ctx, pdB, "127.0.0.1:0", nil)
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	accepted := make(chan *multipath.Conn, 1)
	go func() {
		c, _ := ln.Accept(ctx)
		accepted <- c
	}()
	conn, err := multipath.Dial(ctx, pdA, ln.Addr(), nil)
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	peer := <-accepted
	defer peer.Close()

	src := bytes.Repeat([]byte("one connection, three paths. "), 1<<15) // ~1 MB
	srcMR, _ := pdA.RegisterMR(src, 0)
	dst := make([]byte, len(src))
	dstMR, _ := pdB.RegisterMR(dst, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	req, err := conn.Write(srcMR, 0, len(src), dstMR.Addr(), dstMR.RKey())
	if err != nil {
		panic(err)
	}
	if err := req.Wait(ctx); err != nil {
		panic(err)
	}
	var carried uint64
	used := 0
	for _, p := range conn.Paths() {
		carried += p.Bytes
		if p.Up && p.Capacity > 0 && p.Bytes > 0 {
			used++
		}
	}
	fmt.Println(bytes.Equal(src, dst), carried == uint64(len(src)), used)
	// Output: true true 3
}

// connect opens two devices on an in-process fabric with the given GIDs
// (one path each), listens on one and dials from the other with cfg, and
// returns both PDs, the dialer's Conn and the accepted one.
func connect(fabric string, cfg *multipath.Config) (pdA, pdB *verbs.PD, conn, peer *multipath.Conn, done func()) {
	ctx := context.Background()
	devA, _ := verbs.Open(ctx, "loop://"+fabric, nil)
	devB, _ := verbs.Open(ctx, "loop://"+fabric, nil)
	pdA, _ = devA.AllocPD()
	pdB, _ = devB.AllocPD()
	ln, err := multipath.Listen(ctx, pdB, "127.0.0.1:0", cfg)
	if err != nil {
		panic(err)
	}
	accepted := make(chan *multipath.Conn, 1)
	go func() {
		c, _ := ln.Accept(ctx)
		accepted <- c
	}()
	if conn, err = multipath.Dial(ctx, pdA, ln.Addr(), cfg); err != nil {
		panic(err)
	}
	peer = <-accepted
	return pdA, pdB, conn, peer, func() {
		conn.Close()
		peer.Close()
		ln.Close()
		devA.Close()
		devB.Close()
	}
}

// Once connected, the target can also tell the initiator where to write
// with a two-sided message (ExampleConn_PeerData passes it in the
// handshake instead): the initiator posts a receive (PostRecv), the target
// sends its buffer's address and rkey (Send), the initiator takes it (Recv)
// and writes. Both sides hold the same Key, which authenticates every
// path's handshake.
func ExampleConn_Write() {
	ctx := context.Background()
	cfg := &multipath.Config{Key: []byte("this job's shared key, 32 bytes.")}
	pdA, pdB, conn, peer, done := connect("multipath-example-write?gids=2", cfg)
	defer done()

	// Target: memory the initiator may write, and its (raddr, rkey).
	dst := make([]byte, 256<<10)
	dstMR, _ := pdB.RegisterMR(dst, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	ref := binary.BigEndian.AppendUint64(nil, dstMR.Addr())
	ref = binary.BigEndian.AppendUint32(ref, dstMR.RKey())
	refMR, _ := pdB.RegisterMR(ref, 0)

	// Initiator: a buffer for the target's message (the target writes
	// into it over the paths, so it needs remote write access).
	in := make([]byte, 12)
	inMR, _ := pdA.RegisterMR(in, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	if err := conn.PostRecv(ctx, inMR, 0, len(in), 1); err != nil {
		panic(err)
	}
	if err := peer.Send(ctx, refMR, 0, len(ref)); err != nil {
		panic(err)
	}
	msg, err := conn.Recv(ctx)
	if err != nil {
		panic(err)
	}
	raddr, rkey := binary.BigEndian.Uint64(in), binary.BigEndian.Uint32(in[8:])
	fmt.Println("message", msg.ID, "of", msg.Len, "bytes")

	// Initiator: one Write, split over both paths.
	src := bytes.Repeat([]byte("multipath write!"), len(dst)/16)
	srcMR, _ := pdA.RegisterMR(src, 0)
	req, err := conn.Write(srcMR, 0, len(src), raddr, rkey)
	if err != nil {
		panic(err)
	}
	if err := req.Wait(ctx); err != nil {
		panic(err)
	}
	fmt.Println(len(src), "bytes written:", bytes.Equal(src, dst))
	// Output:
	// message 1 of 12 bytes
	// 262144 bytes written: true
}

// The target's listener hands every initiator its buffer's address and
// rkey in the handshake (Config.PrivateData); the initiator reads them
// with PeerData and writes, with no message first.
func ExampleConn_PeerData() {
	ctx := context.Background()
	devA, _ := verbs.Open(ctx, "loop://multipath-example-peerdata?gids=2", nil)
	defer devA.Close()
	devB, _ := verbs.Open(ctx, "loop://multipath-example-peerdata?gids=2", nil)
	defer devB.Close()
	pdA, _ := devA.AllocPD()
	pdB, _ := devB.AllocPD()

	// Target: memory the initiator may write, announced by the listener.
	dst := make([]byte, 128<<10)
	dstMR, _ := pdB.RegisterMR(dst, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	ref := binary.BigEndian.AppendUint64(nil, dstMR.Addr())
	ref = binary.BigEndian.AppendUint32(ref, dstMR.RKey())
	ln, err := multipath.Listen(ctx, pdB, "127.0.0.1:0", &multipath.Config{PrivateData: ref})
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	accepted := make(chan *multipath.Conn, 1)
	go func() {
		c, _ := ln.Accept(ctx)
		accepted <- c
	}()

	// Initiator: its hello may carry data too (the target reads it with
	// PeerData on the accepted Conn).
	conn, err := multipath.Dial(ctx, pdA, ln.Addr(), &multipath.Config{PrivateData: []byte("initiator 7")})
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	peer := <-accepted
	defer peer.Close()
	fmt.Printf("the target was greeted by %q\n", peer.PeerData())

	pd := conn.PeerData()
	raddr, rkey := binary.BigEndian.Uint64(pd), binary.BigEndian.Uint32(pd[8:])
	src := bytes.Repeat([]byte("address by hello"), len(dst)/16)
	srcMR, _ := pdA.RegisterMR(src, 0)
	req, err := conn.Write(srcMR, 0, len(src), raddr, rkey)
	if err != nil {
		panic(err)
	}
	if err := req.Wait(ctx); err != nil {
		panic(err)
	}
	fmt.Println(bytes.Equal(src, dst))
	// Output:
	// the target was greeted by "initiator 7"
	// true
}

// A mailbox put needs no address or key from the target: the initiator
// names the mailbox (42 here) and the offset, and the target's window
// completes its epoch once every byte of every path's share has arrived.
func ExampleConn_Put() {
	ctx := context.Background()
	pdA, pdB, conn, _, done := connect("multipath-example-put?gids=3", nil)
	defer done()

	// Target: a window on mailbox 42, complete at 1 MiB.
	const size = 1 << 20
	win, err := mailbox.NewTarget(pdB.Device(), nil).Init(42, mailbox.Config{Threshold: size})
	if err != nil {
		panic(err)
	}
	dst := make([]byte, size)
	win.Post(dst)

	// Initiator.
	src := bytes.Repeat([]byte("rvma"), size/4)
	srcMR, _ := pdA.RegisterMR(src, 0)
	req, err := conn.Put(srcMR, 0, size, 42, 0)
	if err != nil {
		panic(err)
	}
	if err := req.Wait(ctx); err != nil {
		panic(err)
	}

	rec, err := win.Wait(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Printf("epoch %d: %d bytes, intact: %v\n", rec.Epoch, rec.Bytes, bytes.Equal(src, dst))
	// Output: epoch 0: 1048576 bytes, intact: true
}
