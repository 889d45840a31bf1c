package main

import (
	"context"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rvma/rvma/internal/udpfab"
	"github.com/rvma/rvma/internal/wire"
)

// The raw-UDP baselines use the udp provider's own socket layer (batching,
// GSO, GRO, buffer sizes, receive spin) with no verbs processing, so that
// rvma's efficiency over UDP is a ratio measured on the same path.

func rawConns(o *options) (tx, rx *udpfab.Conn, err error) {
	ip, err := netip.ParseAddr(o.addr)
	if err != nil {
		return nil, nil, err
	}
	if tx, err = udpfab.Listen(netip.AddrPortFrom(ip, 0), nil); err != nil {
		return nil, nil, err
	}
	if rx, err = udpfab.Listen(netip.AddrPortFrom(ip, 0), nil); err != nil {
		tx.Close()
		return nil, nil, err
	}
	return tx, rx, nil
}

func rawMTU(o *options) int {
	if o.mtu > 0 {
		return o.mtu
	}
	return udpfab.DefaultMTU
}

// udpRaw streams messages of --size bytes as datagrams of MTU payload plus
// the BTH and trailer a WRITE_MIDDLE carries, in GSO trains, unpaced, and
// reports the payload the receiver got. Loss is expected (the sender does
// not wait for the receiver): the received rate is the ceiling a
// flow-controlled transport can reach on this path.
func udpRaw(ctx context.Context, o *options) (*Result, error) {
	tx, rx, err := rawConns(o)
	if err != nil {
		return nil, err
	}
	defer tx.Close()
	mtu := rawMTU(o)
	hdr := wire.BTHLen + wire.ICRCLen
	dgram := mtu + hdr
	var got atomic.Int64 // payload bytes received
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		msgs := make([]udpfab.Message, udpfab.BatchSize)
		for i := range msgs {
			msgs[i].Buf = make([]byte, udpfab.MaxTrain)
		}
		for {
			n, err := rx.ReadBatch(msgs)
			if err != nil {
				return
			}
			var sum int64
			for i := 0; i < n; i++ {
				udpfab.Split(&msgs[i], func(d []byte) { sum += int64(len(d) - hdr) })
			}
			got.Add(sum)
		}
	}()
	// One message's datagrams, laid out as trains.
	size := max(o.size, 1)
	var trains []udpfab.Message
	for off := 0; off < size; {
		per := min(udpfab.MaxTrain/dgram, udpfab.MaxSegments)
		var buf []byte
		for k := 0; k < per && off < size; k++ {
			n := min(mtu, size-off)
			buf = append(buf, make([]byte, n+hdr)...)
			off += n
		}
		trains = append(trains, udpfab.Message{Buf: buf, Addr: rx.LocalAddr(), Seg: dgram})
	}
	if !tx.Features().GSO {
		for i := range trains {
			trains[i].Seg = 0
		}
	}
	start := time.Now()
	sent := 0
	for {
		if _, err := tx.WriteBatch(trains); err != nil {
			return nil, err
		}
		sent++
		if o.iters > 0 && sent >= o.iters || o.iters == 0 && time.Since(start) >= o.duration || ctx.Err() != nil {
			break
		}
	}
	// Let the receiver drain what is in flight and queued at its socket:
	// until its count stops moving (on a loaded host its goroutine may
	// not have run at all yet), at most a second.
	el := time.Since(start).Seconds()
	for last, still, deadline := int64(-1), 0, time.Now().Add(time.Second); still < 4 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
		if g := got.Load(); g == last && g > 0 {
			still++
		} else {
			last, still = g, 0
		}
	}
	rx.Close()
	wg.Wait()
	b := got.Load()
	return &Result{Test: "udp_raw", Provider: "udp", Size: o.size, Iters: int(b) / size, QPs: 1, Seconds: el,
		Gbps: float64(b) * 8 / el / 1e9, Mops: float64(b) / float64(size) / el / 1e6}, nil
}

// udpPingPong bounces one datagram the size of a WRITE_ONLY of --size bytes
// between two sockets and reports half the round trip.
func udpPingPong(ctx context.Context, o *options) (*Result, error) {
	a, b, err := rawConns(o)
	if err != nil {
		return nil, err
	}
	defer a.Close()
	n := o.size + wire.BTHLen + wire.RETHLen + wire.ICRCLen
	go func() {
		m := []udpfab.Message{{Buf: make([]byte, udpfab.MaxTrain)}}
		for {
			if _, err := b.ReadBatch(m); err != nil {
				return
			}
			m[0].Buf = m[0].Buf[:m[0].N]
			if _, err := b.WriteBatch(m); err != nil {
				return
			}
			m[0].Buf = m[0].Buf[:cap(m[0].Buf)]
		}
	}()
	defer b.Close()
	out := []udpfab.Message{{Buf: make([]byte, n), Addr: b.LocalAddr()}}
	in := []udpfab.Message{{Buf: make([]byte, udpfab.MaxTrain)}}
	lat, el, err := pingPong(ctx, o, func() error {
		if _, err := a.WriteBatch(out); err != nil {
			return err
		}
		_, err := a.ReadBatch(in)
		return err
	})
	if err != nil {
		return nil, err
	}
	r, err := latencyResult("udp_pingpong", o.size, lat, el)
	if r != nil {
		r.Provider = "udp"
	}
	return r, err
}
