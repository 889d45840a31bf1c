package testbed_test

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/internal/testbed"
	"github.com/rvma/rvma/verbs"
)

func listenIn(t *testing.T, b *testbed.Bed, ns string, addr netip.AddrPort) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	require.NoError(t, b.In(ns, func() error {
		var err error
		c, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(addr))
		return err
	}))
	t.Cleanup(func() { c.Close() })
	return c
}

// The source address picks the path, whatever the destination.
func TestSourceSelectsPath(t *testing.T) {
	b := testbed.New(t, testbed.Config{Paths: 2})
	rx := listenIn(t, b, b.NameB, netip.AddrPortFrom(b.Paths[0].B, 7000))
	for i, p := range b.Paths {
		before0, err := b.TxBytes(b.NameA, b.Paths[0].DevA)
		require.NoError(t, err)
		before1, err := b.TxBytes(b.NameA, b.Paths[1].DevA)
		require.NoError(t, err)
		tx := listenIn(t, b, b.NameA, netip.AddrPortFrom(p.A, 0))
		// First one datagram until it arrives: the neighbour entry is
		// resolved meanwhile, and the kernel queues only a few datagrams
		// while it resolves.
		buf := make([]byte, 2000)
		for try := 0; ; try++ {
			require.Less(t, try, 50, "nothing arrives over path %d", i)
			_, err := tx.WriteToUDPAddrPort(make([]byte, 10), netip.AddrPortFrom(b.Paths[0].B, 7000))
			require.NoError(t, err)
			rx.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
			if _, _, err := rx.ReadFromUDPAddrPort(buf); err == nil {
				break
			}
		}
		for range 50 { // fits the receive buffer unread
			_, err := tx.WriteToUDPAddrPort(make([]byte, 1000), netip.AddrPortFrom(b.Paths[0].B, 7000))
			require.NoError(t, err)
		}
		rx.SetReadDeadline(time.Now().Add(5 * time.Second))
		for range 50 { // fits the receive buffer unread
			_, from, err := rx.ReadFromUDPAddrPort(buf)
			require.NoError(t, err)
			require.Equal(t, p.A, from.Addr())
		}
		after0, _ := b.TxBytes(b.NameA, b.Paths[0].DevA)
		after1, _ := b.TxBytes(b.NameA, b.Paths[1].DevA)
		sent := []uint64{after0 - before0, after1 - before1}
		require.GreaterOrEqual(t, sent[i], uint64(50*1000), "path %d carried its source's traffic", i)
		require.Less(t, sent[1-i], uint64(10*1000), "path %d carried path %d's traffic", 1-i, i)
	}
}

// tbf limits a path's rate: an upper bound only (a slow machine sends
// less, never more).
func TestShaping(t *testing.T) {
	b := testbed.New(t, testbed.Config{Paths: 1, Rates: []string{"20mbit"}})
	rx := listenIn(t, b, b.NameB, netip.AddrPortFrom(b.Paths[0].B, 7001))
	tx := listenIn(t, b, b.NameA, netip.AddrPortFrom(b.Paths[0].A, 0))
	done := make(chan uint64)
	go func() {
		var got uint64
		buf := make([]byte, 2000)
		for {
			rx.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
			n, _, err := rx.ReadFromUDPAddrPort(buf)
			if err != nil {
				done <- got
				return
			}
			got += uint64(n)
		}
	}()
	start := time.Now()
	for time.Since(start) < 500*time.Millisecond {
		tx.WriteToUDPAddrPort(make([]byte, 1400), netip.AddrPortFrom(b.Paths[0].B, 7001))
	}
	got := <-done
	el := time.Since(start).Seconds()
	limit := 20e6/8*el + 64<<10 // rate x time + the bucket
	require.Positive(t, got)
	require.Less(t, float64(got), 1.5*limit, "received %d bytes in %.2fs through a 20 Mbit/s path", got, el)
}

// Two soft NICs, one in each namespace, with one GID per path: a QP bound
// to GID 1 carries its WRITE over path 1.
func TestVerbsOverPaths(t *testing.T) {
	b := testbed.New(t, testbed.Config{Paths: 2})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	open := func(ns string, a0, a1 netip.Addr) *verbs.Device {
		var d *verbs.Device
		require.NoError(t, b.In(ns, func() error {
			var err error
			d, err = verbs.Open(ctx, "udp://"+a0.String()+":0,"+a1.String()+":0", nil)
			return err
		}))
		t.Cleanup(func() { d.Close() })
		return d
	}
	da := open(b.NameA, b.Paths[0].A, b.Paths[1].A)
	db := open(b.NameB, b.Paths[0].B, b.Paths[1].B)
	side := func(d *verbs.Device, buf []byte) (*verbs.QP, *verbs.CQ, *verbs.MR) {
		pd, err := d.AllocPD()
		require.NoError(t, err)
		cq, err := d.CreateCQ(verbs.CQConfig{})
		require.NoError(t, err)
		qp, err := pd.CreateQP(verbs.QPConfig{SendCQ: cq, GID: 1})
		require.NoError(t, err)
		mr, err := pd.RegisterMR(buf, verbs.AccessAll)
		require.NoError(t, err)
		return qp, cq, mr
	}
	src, dst := make([]byte, 1<<20), make([]byte, 1<<20)
	for i := range src {
		src[i] = byte(i * 31)
	}
	qa, cqa, mra := side(da, src)
	qb, _, mrb := side(db, dst)
	require.NoError(t, qa.Connect(qb.Endpoint(), nil))
	require.NoError(t, qb.Connect(qa.Endpoint(), nil))
	before, err := b.TxBytes(b.NameA, b.Paths[1].DevA)
	require.NoError(t, err)
	_, err = qa.PostSend([]verbs.SendWR{{ID: 1, Opcode: verbs.OpWrite, Flags: verbs.FlagSignaled,
		SGL: []verbs.SGE{mra.SGE(0, len(src))}, RemoteAddr: mrb.Addr(), RKey: mrb.RKey()}})
	require.NoError(t, err)
	wcs := make([]verbs.WorkCompletion, 1)
	_, err = cqa.WaitPoll(ctx, wcs)
	require.NoError(t, err)
	require.NoError(t, wcs[0].Err())
	require.True(t, bytes.Equal(src, dst))
	after, _ := b.TxBytes(b.NameA, b.Paths[1].DevA)
	require.GreaterOrEqual(t, after-before, uint64(len(src)), "the WRITE left by path 1")
}
