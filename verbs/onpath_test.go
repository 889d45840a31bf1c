package verbs_test

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/internal/wire"
	"github.com/rvma/rvma/verbs"
	"github.com/rvma/rvma/verbs/verbstest"
)

// relay is an attacker on the path between two UDP QPs: every datagram
// passes through it (each side's peer address is the relay's), so it sees
// them all and can send anything with the source address the receiver
// expects, as a capture-and-spoof attacker can.
type relay struct {
	conn     *net.UDPConn
	a, b     netip.AddrPort // the two sides' GIDs
	mu       sync.Mutex
	captured [][]byte // datagrams in the order they passed, with their destination
	toB      []bool
}

func newRelay(t *testing.T) *relay {
	c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.MustParseAddrPort("127.0.0.1:0")))
	require.NoError(t, err)
	r := &relay{conn: c}
	t.Cleanup(func() { c.Close() })
	return r
}

func (r *relay) addr() netip.AddrPort { return r.conn.LocalAddr().(*net.UDPAddr).AddrPort() }

func (r *relay) run() {
	buf := make([]byte, 70000)
	for {
		n, from, err := r.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			return
		}
		d := bytes.Clone(buf[:n])
		r.mu.Lock()
		toB := from == r.a
		r.captured = append(r.captured, d)
		r.toB = append(r.toB, toB)
		r.mu.Unlock()
		r.inject(d, toB)
	}
}

// inject sends d to one side as if from the other.
func (r *relay) inject(d []byte, toB bool) {
	dst := r.a
	if toB {
		dst = r.b
	}
	r.conn.WriteToUDPAddrPort(d, dst)
}

// capturedTo returns the datagrams captured on their way to B (or A) whose
// packets match keep.
func (r *relay) capturedTo(toB bool, keep func(*wire.Packet) bool) [][]byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out [][]byte
	for i, d := range r.captured {
		var p wire.Packet
		if r.toB[i] == toB && wire.Parse(d, &p) == nil && keep(&p) {
			out = append(out, d)
		}
	}
	return out
}

type onPath struct {
	a, b  *verbstest.Side
	relay *relay
}

// connectViaRelay opens two UDP devices and connects a QP of typ on each
// to the other through a relay.
func connectViaRelay(t *testing.T, typ verbs.QPType) *onPath {
	mk := func() *verbstest.Side {
		d, err := verbs.Open(context.Background(), "udp://127.0.0.1:0", nil)
		require.NoError(t, err)
		t.Cleanup(func() { d.Close() })
		s := &verbstest.Side{Dev: d}
		s.PD, err = d.AllocPD()
		require.NoError(t, err)
		s.CQ, err = d.CreateCQ(verbs.CQConfig{})
		require.NoError(t, err)
		s.QP, err = s.PD.CreateQP(verbs.QPConfig{Type: typ, SendCQ: s.CQ})
		require.NoError(t, err)
		s.Buf = make([]byte, 64<<10)
		s.MR, err = s.PD.RegisterMR(s.Buf, verbs.AccessAll)
		require.NoError(t, err)
		return s
	}
	o := &onPath{a: mk(), b: mk(), relay: newRelay(t)}
	o.relay.a, o.relay.b = o.a.QP.GID(), o.b.QP.GID()
	ea, eb := o.a.QP.Endpoint(), o.b.QP.Endpoint()
	require.NotZero(t, ea.MACKey, "a UDP QP asks for a MAC")
	ea.GID, eb.GID = o.relay.addr(), o.relay.addr()
	require.NoError(t, o.a.QP.Connect(eb, nil))
	require.NoError(t, o.b.QP.Connect(ea, nil))
	go o.relay.run()
	return o
}

func (o *onPath) write(t *testing.T, off int, data []byte, signaled bool) {
	copy(o.a.Buf[off:], data)
	var fl verbs.SendFlags
	if signaled {
		fl = verbs.FlagSignaled
	}
	o.a.Post(t, verbs.SendWR{ID: uint64(off), Opcode: verbs.OpWrite, Flags: fl, SGL: []verbs.SGE{o.a.MR.SGE(off, len(data))},
		RemoteAddr: o.b.MR.Addr() + uint64(off), RKey: o.b.MR.RKey()})
}

// An attacker that captures and spoofs packets on the path replays
// writes, swaps their payloads, moves them elsewhere, downgrades them to
// the checksum with the connection's secret in hand, and replays ACKs.
// No byte of either side's memory changes, every such packet is counted
// as a drop, and the connection stays in sync: later operations complete
// with the right data.
func TestOnPathAttacker(t *testing.T) {
	for _, typ := range []verbs.QPType{verbs.RC, verbs.UC} {
		t.Run(typ.String(), func(t *testing.T) {
			o := connectViaRelay(t, typ)
			first := bytes.Repeat([]byte("first write....."), 8)
			// A write, then a send: its receive tells B the write landed
			// (on UC too, which keeps order but acknowledges nothing).
			o.b.PostRecv(t, 1, 61000, 64)
			o.write(t, 0, first, false)
			o.a.Post(t, verbs.SendWR{ID: 2, Opcode: verbs.OpSend, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{o.a.MR.SGE(8192, 8)}})
			require.Equal(t, verbs.StatusSuccess, o.a.Wait(t).Status)
			require.Equal(t, verbs.StatusSuccess, o.b.Wait(t).Status)
			require.Equal(t, first, o.b.Buf[:len(first)])
			// The target changes its memory; the old write must not come back.
			copy(o.b.Buf, bytes.Repeat([]byte{0xB0}, len(first)))
			snapB, snapA := bytes.Clone(o.b.Buf), bytes.Clone(o.a.Buf)
			before, beforeA := o.b.Dev.Stats(), o.a.Dev.Stats()

			writes := o.relay.capturedTo(true, func(p *wire.Packet) bool { return len(p.Payload) > 0 })
			require.NotEmpty(t, writes)
			injected := 0
			for _, w := range writes {
				// Exact replay.
				o.relay.inject(w, true)
				// Payload swapped.
				c := bytes.Clone(w)
				var p wire.Packet
				require.NoError(t, wire.Parse(c, &p))
				copy(p.Payload, bytes.Repeat([]byte("PWNED-BY-FORGED-"), len(p.Payload)/16+1))
				o.relay.inject(c, true)
				// Aimed elsewhere: the RETH's address moved, the tag kept.
				if p.Opcode.HasRETH() {
					c = bytes.Clone(w)
					c[wire.BTHLen+7] ^= 0x40
					o.relay.inject(c, true)
					injected++
				}
				// Downgraded to the checksum, with the real secret: a MAC
				// connection takes none.
				var q wire.Packet
				require.NoError(t, wire.Parse(bytes.Clone(w), &q))
				q.Auth, q.Secret = nil, o.b.QP.Endpoint().Secret
				copy(q.Payload, "PWNED-BY-FORGED-")
				o.relay.inject(wire.Append(nil, &q), true)
				injected += 3
			}
			acks := o.relay.capturedTo(false, func(*wire.Packet) bool { return true })
			for _, a := range acks {
				o.relay.inject(a, false)
			}
			// Wait until every injected packet was handled: counted as
			// a drop by the side it was aimed at.
			require.Eventually(t, func() bool {
				after, afterA := o.b.Dev.Stats(), o.a.Dev.Stats()
				return (after.BadMAC-before.BadMAC)+(after.Replayed-before.Replayed) >= uint64(injected) &&
					afterA.Replayed-beforeA.Replayed >= uint64(len(acks))
			}, 10*time.Second, time.Millisecond, "the injected packets were not all handled")
			require.Equal(t, snapB, o.b.Buf, "target memory changed")
			require.Equal(t, snapA, o.a.Buf, "initiator memory changed")
			after, afterA := o.b.Dev.Stats(), o.a.Dev.Stats()
			require.Equal(t, uint64(injected), (after.BadMAC-before.BadMAC)+(after.Replayed-before.Replayed),
				"every forged or replayed packet is counted")
			require.Equal(t, uint64(len(writes)), after.Replayed-before.Replayed)
			require.Equal(t, uint64(len(acks)), afterA.Replayed-beforeA.Replayed, "replayed ACKs are counted")

			// In sync: more writes and a send complete, with their bytes.
			o.b.PostRecv(t, 9, 60000, 64)
			second := bytes.Repeat([]byte("second write...."), 64)
			o.write(t, 4096, second, false)
			copy(o.a.Buf[8192:], "a message after the attack")
			o.a.Post(t, verbs.SendWR{ID: 7, Opcode: verbs.OpSend, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{o.a.MR.SGE(8192, 26)}})
			require.Equal(t, verbs.StatusSuccess, o.a.Wait(t).Status)
			wc := o.b.Wait(t)
			require.Equal(t, verbs.StatusSuccess, wc.Status)
			require.Equal(t, "a message after the attack", string(o.b.Buf[60000:60026]))
			require.Equal(t, second, o.b.Buf[4096:4096+len(second)])
		})
	}
}
