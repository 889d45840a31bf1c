package multipath

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/rvma/rvma/verbs"
)

// Two-sided messages over many paths, Virtuoso's hybrid: the receiver
// advertises a posted buffer (a small SEND on path 0); the sender writes
// the message into it as sub-flows over all paths and, once every write
// has completed, sends one empty SEND with immediate (the length) on
// path 0, behind which the receiver sees one completion. Buffers are used
// in the order they were posted.

const (
	ctlSlots = 64 // receives posted on path 0 for control messages
	ctlLen   = 24 // advertisement: id, address, rkey, length
)

// Message is a received two-sided message.
type Message struct {
	ID  uint64 // the id PostRecv was given
	Len int    // bytes the sender wrote into the buffer
}

// ErrTooLong reports a message longer than the receiver's buffer.
var ErrTooLong = errors.New("multipath: message longer than the posted buffer")

type remoteBuf struct {
	addr uint64
	rkey uint32
	len  int
}

// twoSided is the hybrid's state; guarded by the engine's lock.
type twoSided struct {
	ctl     *verbs.MR // ctlSlots receive slots, then ctlSlots send slots
	nextCtl int
	remote  []remoteBuf // the peer's buffers, in post order
	posted  []uint64    // ids of our buffers, in post order
	arrived []Message
}

// setupTwoSided posts path 0's control receives.
func (c *Conn) setupTwoSided() error {
	mr, err := c.pd.RegisterMR(make([]byte, 2*ctlSlots*ctlLen), verbs.AccessLocalWrite)
	if err != nil {
		return err
	}
	c.two.ctl = mr
	return c.postCtlRecvs(c.qps[0])
}

// postCtlRecvs posts the control receives on path 0's QP qp.
func (c *Conn) postCtlRecvs(qp *verbs.QP) error {
	wrs := make([]verbs.RecvWR, ctlSlots)
	for i := range wrs {
		wrs[i] = verbs.RecvWR{ID: uint64(i), SGL: []verbs.SGE{c.two.ctl.SGE(i*ctlLen, ctlLen)}}
	}
	_, err := qp.PostRecv(wrs)
	return err
}

// onRecv handles a receive on path 0 (in the engine's poller).
func (c *Conn) onRecv(wc *verbs.WorkCompletion) {
	if wc.Status != verbs.StatusSuccess {
		return
	}
	slot := wc.WRID
	b := c.two.ctl.Bytes()[slot*ctlLen : (slot+1)*ctlLen]
	c.eng.Locked(func() {
		if wc.Flags&verbs.WCWithImm != 0 { // a message arrived
			if len(c.two.posted) > 0 {
				c.two.arrived = append(c.two.arrived, Message{ID: c.two.posted[0], Len: int(wc.Imm)})
				c.two.posted = c.two.posted[1:]
			}
		} else if wc.ByteLen == ctlLen { // an advertised buffer
			c.two.remote = append(c.two.remote, remoteBuf{addr: binary.BigEndian.Uint64(b[8:]),
				rkey: binary.BigEndian.Uint32(b[16:]), len: int(binary.BigEndian.Uint32(b[20:]))})
		}
	})
	c.qp(0).PostRecv([]verbs.RecvWR{{ID: slot, SGL: []verbs.SGE{c.two.ctl.SGE(int(slot)*ctlLen, ctlLen)}}})
}

// PostRecv offers n bytes of mr at off for the peer's next message; Recv
// returns the message with this id.
func (c *Conn) PostRecv(ctx context.Context, mr *verbs.MR, off, n int, id uint64) error {
	var slot int
	c.eng.Locked(func() {
		slot = ctlSlots + c.two.nextCtl%ctlSlots
		c.two.nextCtl++
		c.two.posted = append(c.two.posted, id)
	})
	b := c.two.ctl.Bytes()[slot*ctlLen : (slot+1)*ctlLen]
	binary.BigEndian.PutUint64(b, id)
	binary.BigEndian.PutUint64(b[8:], mr.Addr()+uint64(off))
	binary.BigEndian.PutUint32(b[16:], mr.RKey())
	binary.BigEndian.PutUint32(b[20:], uint32(n))
	op, wid := c.eng.Start(1, nil)
	if _, err := c.qp(0).PostSend([]verbs.SendWR{{ID: wid, Opcode: verbs.OpSend, Flags: verbs.FlagSignaled | verbs.FlagInline,
		Inline: b}}); err != nil {
		c.eng.Posted(op, wid, 1, 0, err)
	}
	return op.Wait(ctx)
}

// Send sends n bytes of mr at off as one message into the peer's next
// posted buffer, waiting (bounded by ctx) for the peer to post one. A
// message longer than that buffer fails with ErrTooLong and leaves the
// buffer for the next message. The
// bytes travel over all paths; the message is delivered once all of them
// have arrived.
func (c *Conn) Send(ctx context.Context, mr *verbs.MR, off, n int) error {
	var rb remoteBuf
	if err := c.eng.Wait(ctx, func() bool {
		if len(c.two.remote) == 0 {
			return false
		}
		rb = c.two.remote[0]
		if n <= rb.len { // a message too long leaves the buffer for the next
			c.two.remote = c.two.remote[1:]
		}
		return true
	}); err != nil {
		return err
	}
	if n > rb.len {
		return fmt.Errorf("%w: %d bytes into %d", ErrTooLong, n, rb.len)
	}
	req, err := c.Write(mr, off, n, rb.addr, rb.rkey)
	if err != nil {
		return err
	}
	if err := req.Wait(ctx); err != nil {
		return err
	}
	op, wid := c.eng.Start(1, nil)
	if _, err := c.qp(0).PostSend([]verbs.SendWR{{ID: wid, Opcode: verbs.OpSendImm, Flags: verbs.FlagSignaled,
		Imm: uint32(n)}}); err != nil {
		c.eng.Posted(op, wid, 1, 0, err)
	}
	return op.Wait(ctx)
}

// Recv waits for the next message to arrive in a posted buffer.
func (c *Conn) Recv(ctx context.Context) (Message, error) {
	var m Message
	err := c.eng.Wait(ctx, func() bool {
		if len(c.two.arrived) == 0 {
			return false
		}
		m, c.two.arrived = c.two.arrived[0], c.two.arrived[1:]
		return true
	})
	return m, err
}
