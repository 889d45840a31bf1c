// Command verbsdemo is the smallest complete tour of rvma's soft verbs: two
// devices on an in-process fabric, a queue pair on each connected through
// the connection manager, then an RDMA WRITE, a READ back, fetch-and-add and
// compare-and-swap, each verified byte for byte and timed.
package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/rvma/rvma/verbs"
	"github.com/rvma/rvma/verbs/cm"
)

func main() {
	uri := flag.String("device", "loop://verbsdemo", "device URI for both sides")
	size := flag.Int("size", 1<<20, "bytes to write and read back")
	flag.Parse()
	if err := run(*uri, *size); err != nil {
		fmt.Fprintln(os.Stderr, "verbsdemo:", err)
		os.Exit(1)
	}
}

// side is one end: device, PD, CQ, QP and a registered buffer.
type side struct {
	dev *verbs.Device
	cq  *verbs.CQ
	qp  *verbs.QP
	buf []byte
	mr  *verbs.MR
}

func open(ctx context.Context, uri string, size int) (*side, error) {
	dev, err := verbs.Open(ctx, uri, nil)
	if err != nil {
		return nil, err
	}
	pd, err := dev.AllocPD()
	if err != nil {
		return nil, err
	}
	cq, err := dev.CreateCQ(verbs.CQConfig{})
	if err != nil {
		return nil, err
	}
	qp, err := pd.CreateQP(verbs.QPConfig{SendCQ: cq})
	if err != nil {
		return nil, err
	}
	buf := make([]byte, size+64)
	mr, err := pd.RegisterMR(buf, verbs.AccessAll)
	if err != nil {
		return nil, err
	}
	return &side{dev: dev, cq: cq, qp: qp, buf: buf, mr: mr}, nil
}

// remote is what the server tells the client about its memory, as private
// data of the connection.
type remote struct {
	Addr uint64
	RKey uint32
}

func run(uri string, size int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	server, err := open(ctx, uri, size)
	if err != nil {
		return err
	}
	defer server.dev.Close()
	client, err := open(ctx, uri, size)
	if err != nil {
		return err
	}
	defer client.dev.Close()
	fmt.Printf("devices: server %v, client %v (%s)\n", server.dev.GIDs()[0], client.dev.GIDs()[0], uri)

	// Connect through the connection manager on a loopback TCP port.
	t0 := time.Now()
	ln, err := cm.Listen(ctx, "127.0.0.1:0", nil)
	if err != nil {
		return err
	}
	defer ln.Close()
	accepted := make(chan error, 1)
	go func() {
		req, err := ln.Accept(ctx)
		if err != nil {
			accepted <- err
			return
		}
		pd, _ := json.Marshal(remote{Addr: server.mr.Addr(), RKey: server.mr.RKey()})
		accepted <- req.Accept(ctx, server.qp, &cm.Config{PrivateData: pd})
	}()
	res, err := cm.Dial(ctx, ln.Addr().String(), client.qp, nil)
	if err != nil {
		return err
	}
	if err := <-accepted; err != nil {
		return err
	}
	var rm remote
	if err := json.Unmarshal(res.PrivateData, &rm); err != nil {
		return err
	}
	fmt.Printf("connected: QP %d <-> QP %d, path MTU %d, in %v\n", client.qp.Num(), server.qp.Num(), client.qp.PathMTU(), time.Since(t0).Round(time.Microsecond))

	// WRITE size bytes into the server's memory.
	payload := client.buf[:size]
	for i := range payload {
		payload[i] = byte(i*7 + i>>8)
	}
	d, err := timed(ctx, client, verbs.SendWR{ID: 1, Opcode: verbs.OpWrite, Flags: verbs.FlagSignaled,
		SGL: []verbs.SGE{client.mr.SGE(0, size)}, RemoteAddr: rm.Addr, RKey: rm.RKey}, 21)
	if err != nil {
		return err
	}
	if !bytes.Equal(server.buf[:size], payload) {
		return fmt.Errorf("WRITE: server memory differs from what was written")
	}
	report("WRITE", size, d, "(median of 21)")

	// READ it back into a fresh buffer and compare.
	back := make([]byte, size)
	clear(client.buf[:size])
	d, err = timed(ctx, client, verbs.SendWR{ID: 2, Opcode: verbs.OpRead, Flags: verbs.FlagSignaled,
		SGL: []verbs.SGE{client.mr.SGE(0, size)}, RemoteAddr: rm.Addr, RKey: rm.RKey}, 21)
	if err != nil {
		return err
	}
	copy(back, client.buf[:size])
	if !bytes.Equal(back, server.buf[:size]) {
		return fmt.Errorf("READ: data read back differs from the server's memory")
	}
	report("READ", size, d, "(median of 21)")

	// Atomics on an 8-byte counter at the end of the server's buffer.
	counter := rm.Addr + uint64(size)
	binary.NativeEndian.PutUint64(server.buf[size:], 40)
	result := client.mr.SGE(size, 8)
	d, err = post(ctx, client, verbs.SendWR{ID: 3, Opcode: verbs.OpFetchAdd, Flags: verbs.FlagSignaled,
		SGL: []verbs.SGE{result}, RemoteAddr: counter, RKey: rm.RKey, CompareAdd: 2})
	if err != nil {
		return err
	}
	if old, now := binary.NativeEndian.Uint64(client.buf[size:]), binary.NativeEndian.Uint64(server.buf[size:]); old != 40 || now != 42 {
		return fmt.Errorf("FETCH_ADD: fetched %d (want 40), counter %d (want 42)", old, now)
	}
	report("FETCH_ADD", 8, d, "(one run)")
	d, err = post(ctx, client, verbs.SendWR{ID: 4, Opcode: verbs.OpCompareSwap, Flags: verbs.FlagSignaled,
		SGL: []verbs.SGE{result}, RemoteAddr: counter, RKey: rm.RKey, CompareAdd: 42, Swap: 7})
	if err != nil {
		return err
	}
	if old, now := binary.NativeEndian.Uint64(client.buf[size:]), binary.NativeEndian.Uint64(server.buf[size:]); old != 42 || now != 7 {
		return fmt.Errorf("CMP_SWAP: fetched %d (want 42), counter %d (want 7)", old, now)
	}
	report("CMP_SWAP", 8, d, "(one run)")

	// An access outside the server's region fails at the initiator and
	// changes nothing at the target.
	before := bytes.Clone(server.buf)
	_, err = post(ctx, client, verbs.SendWR{ID: 5, Opcode: verbs.OpWrite, Flags: verbs.FlagSignaled,
		SGL: []verbs.SGE{client.mr.SGE(0, 64)}, RemoteAddr: rm.Addr + uint64(len(server.buf)) - 32, RKey: rm.RKey})
	if !errors.Is(err, verbs.StatusRemoteAccessError) || !bytes.Equal(before, server.buf) {
		return fmt.Errorf("out-of-bounds WRITE: got %v, target changed: %v", err, !bytes.Equal(before, server.buf))
	}
	fmt.Printf("%-9s  out of bounds -> %v, target unchanged\n", "WRITE", err)
	fmt.Println("all operations verified")
	return nil
}

// post posts one signaled request and waits for its completion.
func post(ctx context.Context, s *side, wr verbs.SendWR) (time.Duration, error) {
	t0 := time.Now()
	if _, err := s.qp.PostSend([]verbs.SendWR{wr}); err != nil {
		return 0, err
	}
	var wc [1]verbs.WorkCompletion
	if _, err := s.cq.WaitPoll(ctx, wc[:]); err != nil {
		return 0, err
	}
	return time.Since(t0), wc[0].Err()
}

// timed runs a request repeats times and returns the median time; the
// first run pays for page faults and cold caches.
func timed(ctx context.Context, s *side, wr verbs.SendWR, repeats int) (time.Duration, error) {
	ds := make([]time.Duration, repeats)
	for i := range ds {
		d, err := post(ctx, s, wr)
		if err != nil {
			return 0, err
		}
		ds[i] = d
	}
	slices.Sort(ds)
	return ds[len(ds)/2], nil
}

func report(op string, n int, d time.Duration, how string) {
	fmt.Printf("%-9s  %8d bytes  %10v %-13s %8.2f Gbit/s  verified\n", op, n, d.Round(100*time.Nanosecond), how, float64(n)*8/d.Seconds()/1e9)
}
