package verbs_test

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/rvma/rvma/internal/udpfab"
	"github.com/rvma/rvma/internal/wire"
	"github.com/rvma/rvma/verbs"
	"github.com/rvma/rvma/verbs/verbstest"
)

// forger makes forged datagrams aimed at target, an RC QP whose peer is
// peer. Kinds: random bytes; well-formed packets with random QPN, PSN, keys
// and offsets; writes aimed at the target's memory with a wrong secret;
// and exact replays of valid packets (the right secret), which only the
// source check stops.
type forger struct {
	r      *rand.Rand
	target verbs.Endpoint
	mr     *verbs.MR
	buf    []byte
}

func (f *forger) next(replays bool) []byte {
	r := f.r
	kinds := 3
	if replays {
		kinds = 4
	}
	b := f.buf[:0]
	switch r.IntN(kinds) {
	case 0: // garbage
		n := r.IntN(200)
		for i := 0; i < n; i++ {
			b = append(b, byte(r.Uint32()))
		}
		return b
	case 1: // well formed, random everything
		var op wire.Opcode
		for !op.Valid() {
			op = wire.Opcode(r.Uint32())
		}
		p := &wire.Packet{Opcode: op, DestQP: r.Uint32() & 0xFFFFFF, PSN: r.Uint32() & 0xFFFFFF,
			VA: r.Uint64(), RKey: r.Uint32(), DMALen: r.Uint32() % 4096, Mailbox: r.Uint64(), Offset: r.Uint64(),
			SwapAdd: r.Uint64(), Compare: r.Uint64(), Secret: r.Uint64()}
		if op.HasPayload() {
			p.Payload = make([]byte, r.IntN(64))
		}
		if r.IntN(2) == 0 {
			p.DestQP = f.target.QPN
		}
		return wire.Append(b, p)
	}
	// Aimed at the target: its QPN, a PSN near where it is, a valid key
	// and an address inside the region, a WRITE or an atomic.
	p := &wire.Packet{Opcode: wire.WriteOnly, DestQP: f.target.QPN, PSN: (f.target.PSN + uint32(r.IntN(64))) & 0xFFFFFF,
		VA: f.mr.Addr() + uint64(r.IntN(f.mr.Len()-64)), RKey: f.mr.RKey(), DMALen: 32, Payload: bytes.Repeat([]byte{0xEE}, 32),
		Secret: f.target.Secret ^ (1 + r.Uint64()%^uint64(0))}
	if r.IntN(3) == 0 {
		p.Opcode, p.Payload, p.SwapAdd = wire.FetchAdd, nil, 1
		p.VA &^= 7
	}
	return wire.Append(b, p)
}

// TestForgedPackets: a million forged packets change no byte of any MR,
// and the device's drop counters account for every one.
func TestForgedPackets(t *testing.T) {
	total := 1_000_000
	if raceEnabledVerbs || testing.Short() {
		total = 100_000
	}
	a, b := verbstest.Pair(t, verbstest.UDP(), verbstest.PairConfig{BufSize: 1 << 20})
	other, err := b.PD.RegisterMR(make([]byte, 64<<10), verbs.AccessAll)
	require.NoError(t, err)
	for _, s := range []*verbstest.Side{a, b} {
		for i := range s.Buf {
			s.Buf[i] = byte(i * 7)
		}
	}
	snapA, snapB, snapO := bytes.Clone(a.Buf), bytes.Clone(b.Buf), bytes.Clone(other.Bytes())

	// Aim at b's QP with the endpoint values a real capture would reveal
	// (the real secret is used only for exact replays).
	target := b.QP.Endpoint()
	target.PSN = a.QP.Endpoint().PSN // what b expects next
	f := &forger{r: rand.New(rand.NewPCG(1, 2)), target: target, mr: b.MR, buf: make([]byte, 0, 512)}
	dst := b.QP.GID()
	before := b.Dev.Stats()
	accounted := func() uint64 {
		s := b.Dev.Stats()
		return s.RxDropped - before.RxDropped + s.Undecodable - before.Undecodable
	}
	sent := uint64(0)
	wait := func() {
		deadline := time.Now().Add(20 * time.Second)
		for accounted() < sent && time.Now().Before(deadline) {
			time.Sleep(100 * time.Microsecond)
		}
	}

	// From a foreign socket: everything, replays included.
	foreign, err := udpfab.Listen(netip.MustParseAddrPort("127.0.0.1:0"), nil)
	require.NoError(t, err)
	defer foreign.Close()
	msgs := make([]udpfab.Message, udpfab.BatchSize)
	bufs := make([][]byte, len(msgs))
	spoofed := 0
	if os.Geteuid() == 0 {
		spoofed = total * 2 / 5
	} else {
		t.Log("not root: the spoofed-source part (a raw socket) is skipped")
	}
	for int(sent) < total-spoofed {
		for i := range msgs {
			bufs[i] = append(bufs[i][:0], f.next(true)...)
			msgs[i] = udpfab.Message{Buf: bufs[i], Addr: dst}
		}
		dropped, err := foreign.WriteBatch(msgs)
		require.NoError(t, err)
		require.Zero(t, dropped)
		sent += uint64(len(msgs))
		if sent%2048 == 0 {
			wait() // keep the receiver's socket buffer from overflowing
		}
	}
	wait()
	require.Equal(t, sent, accounted(), "every forged packet from a foreign socket is counted as a drop")
	require.Positive(t, b.Dev.Stats().BadSource-before.BadSource, "the source check stopped foreign packets")

	// Spoofing the peer's own address (root only): the source check passes,
	// so the connection secret, the QPN and the PSN window must stop them.
	if spoofed > 0 {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_RAW)
		require.NoError(t, err)
		defer unix.Close(fd)
		src := a.QP.GID()
		pkt := make([]byte, 0, 1024)
		for n := 0; n < spoofed; n++ {
			payload := f.next(false)
			pkt = ipv4UDP(pkt[:0], src, dst, payload)
			require.NoError(t, unix.Sendto(fd, pkt, 0, &unix.SockaddrInet4{Addr: dst.Addr().As4()}))
			sent++
			if sent%1024 == 0 {
				wait()
			}
		}
		wait()
		require.Equal(t, sent, accounted(), "every spoofed packet is counted as a drop")
		require.Positive(t, b.Dev.Stats().BadMAC-before.BadMAC, "the MAC stopped aimed packets")
	}
	s := b.Dev.Stats()
	t.Logf("sent %d forged: undecodable %d, unknown QP %d, bad source %d, bad MAC %d, malformed %d, other %d",
		sent, s.Undecodable-before.Undecodable, s.UnknownQP-before.UnknownQP, s.BadSource-before.BadSource,
		s.BadMAC-before.BadMAC, s.Malformed-before.Malformed,
		(s.RxDropped-before.RxDropped)-(s.UnknownQP-before.UnknownQP)-(s.BadSource-before.BadSource)-
			(s.BadMAC-before.BadMAC)-(s.Malformed-before.Malformed))

	require.True(t, bytes.Equal(snapB, b.Buf), "target MR changed")
	require.True(t, bytes.Equal(snapO, other.Bytes()), "other target MR changed")
	require.True(t, bytes.Equal(snapA, a.Buf), "peer MR changed")

	// The connection still works.
	a.Post(t, verbs.SendWR{ID: 1, Opcode: verbs.OpWrite, Flags: verbs.FlagSignaled,
		SGL: []verbs.SGE{a.MR.SGE(0, 100)}, RemoteAddr: b.MR.Addr() + 1000, RKey: b.MR.RKey()})
	require.Equal(t, verbs.StatusSuccess, a.Wait(t).Status)
	require.Equal(t, a.Buf[:100], b.Buf[1000:1100])
}

// ipv4UDP builds an IPv4 datagram with a UDP header (checksum 0: none),
// for a raw socket that spoofs the source.
func ipv4UDP(b []byte, src, dst netip.AddrPort, payload []byte) []byte {
	total := 20 + 8 + len(payload)
	s4, d4 := src.Addr().As4(), dst.Addr().As4()
	b = append(b, 0x45, 0, byte(total>>8), byte(total), 0, 0, 0x40, 0, 64, unix.IPPROTO_UDP, 0, 0)
	b = append(b, s4[:]...)
	b = append(b, d4[:]...)
	b = binary.BigEndian.AppendUint16(b, src.Port())
	b = binary.BigEndian.AppendUint16(b, dst.Port())
	b = binary.BigEndian.AppendUint16(b, uint16(8+len(payload)))
	b = append(b, 0, 0)
	return append(b, payload...)
}
