package multipath_test

import (
	"bytes"
	"context"
	"fmt"

	"github.com/rvma/rvma/multipath"
	"github.com/rvma/rvma/verbs"
)

// One logical connection over the three GIDs of an in-process fabric: the
// listener accepts it, Dial connects and probes every path, and a Write
// is split over the paths in proportion to their measured capacities.
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
