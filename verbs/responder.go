package verbs

import (
	"encoding/binary"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/rvma/rvma/internal/lockcheck"
	"github.com/rvma/rvma/internal/psn"
	"github.com/rvma/rvma/internal/wire"
)

// responder is the receive side of a QP. qp.mu guards it, but for mw.
type responder struct {
	ePSN       uint32 // expected PSN
	msn        uint32 // completed messages
	nakSent    bool   // a sequence NAK is outstanding for ePSN
	ackPending bool
	inTouched  bool
	rnrPending bool // the last packet was answered with an RNR NAK
	gen        uint64

	delayed      bool // an ACK is owed within ackDelay
	ackTimerLive bool

	cur struct {
		active  bool
		family  wire.Opcode // SendFirst, WriteFirst or MailboxFirst
		broken  bool        // UC: a packet of this message was lost
		mr      *MR
		va      uint64
		length  uint64
		off     uint64
		recv    recvWQE
		hasRecv bool // recv holds a receive taken for this (or a lost UC) message
	}
	cache     []atomicResult
	cacheNext int

	// mw is the mailbox write being handed to the MailboxHandler. It is
	// owned by the goroutine that runs the port's packet handler (one at
	// a time per port, and a QP is on one port): mailboxExec fills it
	// under mu and the handler reads it after mu is released.
	mw MailboxWrite
}

type atomicResult struct {
	psn   uint32
	orig  uint64
	valid bool
}

func (rs *responder) reset(p uint32) {
	rs.ePSN, rs.msn, rs.nakSent, rs.ackPending, rs.rnrPending = p, 0, false, false, false
	rs.cur.active, rs.cur.broken, rs.cur.hasRecv = false, false, false
	rs.gen++
}

func (rs *responder) initCache(n int) {
	rs.cache = make([]atomicResult, n)
	rs.cacheNext = 0
}

// receive is the entry point for every packet addressed to this QP.
func (qp *QP) receive(p *wire.Packet, now time.Time, ob *outbox) {
	d := qp.dev
	qp.mu.Lock()
	defer qp.mu.Unlock()
	switch {
	case qp.closed || (qp.state != StateReadyToReceive && qp.state != StateReadyToSend):
		d.drop(&d.stats.discarded)
	case p.Src != qp.remote.GID:
		d.drop(&d.stats.badSource)
	case qp.rxMAC != nil && !p.VerifyMAC(qp.rxMAC):
		d.drop(&d.stats.badMAC)
	case qp.rxMAC != nil && !qp.replay.Accept(p.Seq):
		d.drop(&d.stats.replayed)
	case qp.rxMAC == nil && !p.Verify(qp.localSecret):
		d.drop(&d.stats.badSecret)
	case !p.Opcode.Valid() || p.Opcode.IsUC() != (qp.typ == UC):
		d.drop(&d.stats.malformed)
	case p.Opcode.IsResponse():
		qp.handleResponse(p, now, ob)
	case qp.typ == UC:
		qp.handleUC(p, ob)
	default:
		qp.handleRC(p, ob)
	}
}

func (qp *QP) handleRC(p *wire.Packet, ob *outbox) {
	rs := &qp.resp
	d := psn.Diff(p.PSN, rs.ePSN)
	if d > 0 {
		qp.dev.drop(&qp.dev.stats.outOfWindow)
		if !rs.nakSent {
			rs.nakSent = true
			qp.emitAck(ob, wire.SyndromeNAK|wire.NAKSequence, rs.ePSN)
		}
		return
	}
	if d < 0 {
		qp.duplicate(p, ob)
		return
	}
	rs.nakSent = false
	qp.execute(p, ob)
}

func (qp *QP) handleUC(p *wire.Packet, ob *outbox) {
	rs := &qp.resp
	starts := p.Opcode.Starts()
	if p.PSN != rs.ePSN {
		qp.dev.drop(&qp.dev.stats.outOfWindow)
		if !starts {
			// A packet was lost inside this message: drop the rest of it.
			rs.cur.broken = true
			rs.ePSN = psn.Add(p.PSN, 1)
			return
		}
		rs.cur.active = false // the old message lost its tail: no completion
		rs.ePSN = p.PSN
	}
	if !starts && (!rs.cur.active || rs.cur.broken) {
		rs.ePSN = psn.Add(rs.ePSN, 1)
		qp.dev.drop(&qp.dev.stats.discarded)
		return
	}
	if starts {
		rs.cur.active, rs.cur.broken = false, false
	}
	qp.execute(p, ob)
}

// duplicate answers a request the responder already executed: SENDs and
// WRITEs are acknowledged again, READs re-executed, and atomics answered
// from the result cache so that they are never executed twice.
func (qp *QP) duplicate(p *wire.Packet, ob *outbox) {
	qp.dev.drop(&qp.dev.stats.duplicates)
	switch p.Opcode {
	case wire.ReadRequest:
		qp.readRequestExec(p, ob, false)
	case wire.CompareSwap, wire.FetchAdd:
		for _, c := range qp.resp.cache {
			if c.valid && c.psn == p.PSN {
				qp.atomicAck(ob, p.PSN, c.orig)
				return
			}
		}
	default:
		qp.scheduleAck(ob)
	}
}

// reject refuses the packet at ePSN: on RC with a NAK (ePSN does not
// advance), on UC by dropping the rest of the message.
func (qp *QP) reject(ob *outbox, code uint8) {
	rs := &qp.resp
	if qp.typ == UC {
		rs.cur.broken = true
		rs.cur.active = true
		rs.ePSN = psn.Add(rs.ePSN, 1)
		qp.dev.drop(&qp.dev.stats.discarded)
		return
	}
	rs.cur.active = false
	qp.emitAck(ob, wire.SyndromeNAK|code, rs.ePSN)
}

// rnr answers receiver-not-ready: RC NAKs and the requester retries; UC
// drops the message.
func (qp *QP) rnr(ob *outbox) {
	if qp.typ == UC {
		qp.reject(ob, 0)
		return
	}
	qp.resp.rnrPending = true
	qp.emitAck(ob, wire.SyndromeRNR|qp.conn.rnrCode, qp.resp.ePSN)
}

func family(op wire.Opcode) wire.Opcode {
	switch op.Base() {
	case wire.SendFirst, wire.SendMiddle, wire.SendLast, wire.SendLastImm, wire.SendOnly, wire.SendOnlyImm:
		return wire.SendFirst
	case wire.WriteFirst, wire.WriteMiddle, wire.WriteLast, wire.WriteLastImm, wire.WriteOnly, wire.WriteOnlyImm:
		return wire.WriteFirst
	case wire.MailboxFirst, wire.MailboxMiddle, wire.MailboxLast, wire.MailboxLastImm, wire.MailboxOnly, wire.MailboxOnlyImm:
		return wire.MailboxFirst
	}
	return op.Base()
}

// execute runs the in-sequence request p.
func (qp *QP) execute(p *wire.Packet, ob *outbox) {
	rs := &qp.resp
	op := p.Opcode.Base()
	fam := family(op)
	starts, ends := op.Starts(), op.Ends()
	switch op {
	case wire.ReadRequest, wire.CompareSwap, wire.FetchAdd:
		starts, ends = true, true
	}
	// Framing: a message starts only when none is open, and continues only
	// the open one.
	if starts == rs.cur.active || (!starts && rs.cur.family != fam) {
		qp.dev.drop(&qp.dev.stats.malformed)
		qp.reject(ob, wire.NAKInvalid)
		return
	}
	// Every packet but a message's last carries exactly one MTU.
	if !ends && len(p.Payload) != qp.mtu && op.HasPayload() {
		qp.dev.drop(&qp.dev.stats.malformed)
		qp.reject(ob, wire.NAKInvalid)
		return
	}
	wasRNR := rs.rnrPending
	rs.rnrPending = false
	switch fam {
	case wire.ReadRequest:
		if qp.typ == RC {
			qp.readRequestExec(p, ob, true)
		}
		return
	case wire.CompareSwap, wire.FetchAdd:
		if qp.typ == RC {
			qp.atomicExec(p, ob)
		}
		return
	case wire.SendFirst:
		if !qp.sendExec(p, ob, starts, ends) {
			return
		}
	case wire.WriteFirst:
		if !qp.writeExec(p, ob, starts, ends) {
			return
		}
	case wire.WriteList:
		if qp.typ != RC || !qp.writeListExec(p, ob) {
			return
		}
	case wire.MailboxFirst:
		if !qp.mailboxExec(p, ob, starts, ends, wasRNR) {
			return
		}
	default:
		qp.dev.drop(&qp.dev.stats.malformed)
		qp.reject(ob, wire.NAKInvalid)
		return
	}
	rs.cur.active = !ends
	rs.cur.family = fam
	if ends {
		rs.msn++
	}
	rs.ePSN = psn.Add(rs.ePSN, 1)
	switch {
	case p.AckReq:
		qp.scheduleAck(ob)
	case qp.typ == RC:
		qp.delayAck()
	}
}

// ackDelay is how long a responder may hold the acknowledgement of packets
// that did not ask for one: an eighth of the retransmission timeout (the
// connection's Timeout, which both ends are normally given), at most 1ms.
// Longer is cheaper (each delayed ACK is a timer goroutine and a datagram
// competing with pollers for a processor); it only delays the freeing of
// unsignaled send-queue slots, and requesters ask for an immediate ACK when
// their queue is half full.
func (qp *QP) ackDelay() time.Duration {
	return min(qp.conn.timeout/8, time.Millisecond)
}

// delayAck makes sure an ACK covering ePSN-1 goes out within ackDelay.
func (qp *QP) delayAck() {
	rs := &qp.resp
	rs.delayed = true
	if !rs.ackTimerLive {
		rs.ackTimerLive = true
		qp.ackTimer.Reset(qp.ackDelay())
	}
}

func (qp *QP) onAckTimer() {
	ob := outboxPool.Get().(*outbox)
	qp.mu.Lock()
	rs := &qp.resp
	rs.ackTimerLive = false
	if rs.delayed && !qp.closed && (qp.state == StateReadyToReceive || qp.state == StateReadyToSend) {
		qp.emitAck(ob, wire.SyndromeACK|0x1F, psn.Add(rs.ePSN, -1))
	}
	qp.mu.Unlock()
	ob.flush(qp.port)
	outboxPool.Put(ob)
}

// takeRecv makes sure a receive is held for the current message.
func (qp *QP) takeRecv() bool {
	rs := &qp.resp
	if rs.cur.hasRecv {
		return true
	}
	if qp.srq != nil {
		rs.cur.hasRecv = qp.srq.take(&rs.cur.recv)
	} else {
		rs.cur.hasRecv = qp.rq.take(&rs.cur.recv)
	}
	return rs.cur.hasRecv
}

// recvFailed reports a local error of the responder: the receive completes
// with st, the requester gets a NAK, and (on RC) the QP enters the error
// state, as InfiniBand responders do.
func (qp *QP) recvFailed(ob *outbox, st Status, nak uint8) {
	rs := &qp.resp
	qp.completeRecv(WorkCompletion{WRID: rs.cur.recv.id, Status: st, Opcode: WCRecv, SrcQP: qp.remote.QPN})
	rs.cur.hasRecv = false
	qp.reject(ob, nak)
	if qp.typ == RC {
		qp.toErrorLocked()
	}
}

func (qp *QP) sendExec(p *wire.Packet, ob *outbox, starts, ends bool) bool {
	rs := &qp.resp
	if starts {
		if !qp.takeRecv() {
			qp.rnr(ob)
			return false
		}
		rs.cur.off = 0
		if rs.cur.recv.status != StatusSuccess {
			qp.recvFailed(ob, rs.cur.recv.status, wire.NAKRemoteOp)
			return false
		}
	}
	if rs.cur.off+uint64(len(p.Payload)) > uint64(rs.cur.recv.total) {
		qp.recvFailed(ob, StatusLocalLengthError, wire.NAKInvalid)
		return false
	}
	scatter(rs.cur.recv.segs, int(rs.cur.off), p.Payload)
	rs.cur.off += uint64(len(p.Payload))
	if ends {
		wc := WorkCompletion{WRID: rs.cur.recv.id, Opcode: WCRecv, ByteLen: uint32(rs.cur.off), SrcQP: qp.remote.QPN}
		if p.Opcode.HasImm() {
			wc.Flags, wc.Imm = WCWithImm, p.Imm
		}
		rs.cur.hasRecv = false
		qp.completeRecv(wc)
	}
	return true
}

// writeListExec places a WRITE_LIST's runs, once every one of them is
// checked against the memory its rkey names: a run out of bounds or a
// malformed list places nothing.
func (qp *QP) writeListExec(p *wire.Packet, ob *outbox) bool {
	if p.Placed || int(p.DMALen) != len(p.Payload) {
		qp.dev.drop(&qp.dev.stats.malformed)
		qp.reject(ob, wire.NAKInvalid)
		return false
	}
	var mr *MR
	ok := true
	if err := wire.ListEntries(p.Payload, func(va uint64, d []byte) bool {
		if mr == nil { // one rkey: its region's key, rights and liveness are checked once
			mr, _, ok = qp.pd.resolveRemote(p.RKey, va, uint64(len(d)), AccessRemoteWrite)
		} else {
			_, ok = mr.span(va, uint64(len(d)))
		}
		return ok
	}); err != nil {
		qp.dev.drop(&qp.dev.stats.malformed)
		qp.reject(ob, wire.NAKInvalid)
		return false
	}
	if !ok {
		qp.reject(ob, wire.NAKRemoteAccess)
		return false
	}
	if mr == nil {
		return true // an empty list
	}
	if !mr.enter() {
		qp.reject(ob, wire.NAKRemoteAccess)
		return false
	}
	wire.ListEntries(p.Payload, func(va uint64, d []byte) bool {
		dst, _ := mr.span(va, uint64(len(d)))
		copy(dst, d)
		return true
	})
	mr.exit()
	return true
}

func (qp *QP) writeExec(p *wire.Packet, ob *outbox, starts, ends bool) bool {
	rs := &qp.resp
	if starts {
		mr, _, ok := qp.pd.resolveRemote(p.RKey, p.VA, uint64(p.DMALen), AccessRemoteWrite)
		if !ok {
			qp.reject(ob, wire.NAKRemoteAccess)
			return false
		}
		rs.cur.mr, rs.cur.va, rs.cur.length, rs.cur.off = mr, p.VA, uint64(p.DMALen), 0
	}
	n := uint64(len(p.Payload))
	if p.Placed {
		// The requester placed the bytes through shared memory; this is
		// the notification of a whole message, which only shm carries.
		if !starts || !ends || n != 0 || !qp.sharedPort() {
			qp.dev.drop(&qp.dev.stats.malformed)
			qp.reject(ob, wire.NAKInvalid)
			return false
		}
		n = rs.cur.length
	}
	if rs.cur.off+n > rs.cur.length || (ends && rs.cur.off+n != rs.cur.length) {
		qp.dev.drop(&qp.dev.stats.malformed)
		qp.reject(ob, wire.NAKInvalid)
		return false
	}
	withImm := ends && p.Opcode.HasImm()
	if withImm && !qp.takeRecv() {
		qp.rnr(ob) // nothing placed: the retransmission places it
		return false
	}
	mr := rs.cur.mr
	if !mr.enter() {
		qp.reject(ob, wire.NAKRemoteAccess)
		return false
	}
	if n > 0 && !p.Placed {
		dst, _ := mr.span(rs.cur.va+rs.cur.off, n)
		copy(dst, p.Payload)
	}
	mr.exit()
	rs.cur.off += n
	if withImm {
		rs.cur.hasRecv = false
		st := rs.cur.recv.status
		qp.completeRecv(WorkCompletion{WRID: rs.cur.recv.id, Status: st, Opcode: WCRecvWriteImm,
			Flags: WCWithImm, Imm: p.Imm, ByteLen: uint32(rs.cur.length), SrcQP: qp.remote.QPN})
	}
	return true
}

func (qp *QP) mailboxExec(p *wire.Packet, ob *outbox, starts, ends, retry bool) bool {
	rs := &qp.resp
	box := qp.dev.mbox.Load()
	if box == nil {
		qp.reject(ob, wire.NAKRemoteAccess)
		return false
	}
	placed := p.Placed
	if placed && (!starts || !ends || p.MsgOff != 0 || len(p.Payload) != 8 || !qp.sharedPort()) ||
		!placed && uint64(p.MsgOff)+uint64(len(p.Payload)) > uint64(p.MsgLen) {
		qp.dev.drop(&qp.dev.stats.malformed)
		qp.reject(ob, wire.NAKInvalid)
		return false
	}
	mw := &rs.mw
	*mw = MailboxWrite{Mailbox: p.Mailbox, Offset: p.Offset, MsgOff: p.MsgOff, MsgLen: p.MsgLen,
		First: starts, Last: ends, HasImm: p.Opcode.HasImm(), Imm: p.Imm, Payload: p.Payload,
		QPN: qp.num, SrcQP: qp.remote.QPN, Source: p.Src, Transport: qp.typ, Retry: retry}
	if placed {
		// The payload stayed in the sender's memory: the handler pulls it
		// straight into place (MailboxWrite.Place).
		mw.Payload, mw.pull, mw.pullAddr = nil, qp.port.Puller(), binary.BigEndian.Uint64(p.Payload)
	}
	// The handler runs without the QP's lock so that it may post. Packets
	// for this QP are handled by one goroutine (its port's), so no other
	// receive can interleave; a reset or destroy meanwhile is detected by
	// the generation.
	gen := rs.gen
	qp.mu.Unlock()
	lockcheck.AssertNotHeld[qpLocks]("verbs: a MailboxHandler called while a QP's mu is held: it may post")
	res := box.h.HandleMailboxWrite(mw)
	qp.mu.Lock()
	*mw = MailboxWrite{}
	if rs.gen != gen || qp.closed || (qp.state != StateReadyToReceive && qp.state != StateReadyToSend) {
		return false
	}
	switch {
	case res == MailboxAccepted:
		return true
	case res == MailboxNotReady:
		qp.rnr(ob)
	case res >= MailboxRefused && res <= MailboxRefusedMax:
		qp.reject(ob, wire.NAKMailboxBase+uint8(res-MailboxRefused))
	default:
		qp.reject(ob, wire.NAKRemoteOp)
	}
	return false
}

// readRequestExec sends the READ responses for p. A request that reaches
// past the expected PSN consumes the PSNs up to its end, duplicate or not:
// a READ is re-requested from its first missing response, and the new
// request may cover more than the piece first requested (pieces follow the
// requester's window), so PSNs beyond ePSN can only belong to this READ.
// sharedPort reports whether the QP's port is shared memory, the only
// fabric whose packets may say their payload was placed (wire.Placed).
func (qp *QP) sharedPort() bool { return qp.dev.kinds[qp.gid] == ProviderSHM }

func (qp *QP) readRequestExec(p *wire.Packet, ob *outbox, inSeq bool) {
	rs := &qp.resp
	mr, b, ok := qp.pd.resolveRemote(p.RKey, p.VA, uint64(p.DMALen), AccessRemoteRead)
	// The responses read the region when the outbox is sent: it stays
	// entered until then, so Deregister waits for that send rather than
	// free (or unmap) the bytes under it.
	if !ok || !ob.enter(mr) {
		if inSeq {
			qp.reject(ob, wire.NAKRemoteAccess)
		}
		return
	}
	n := qp.npkts(len(b))
	end := psn.Add(p.PSN, n)
	extends := psn.Diff(end, rs.ePSN) > 0
	if extends {
		rs.msn++
	}
	for i := 0; i < n; i++ {
		var op wire.Opcode
		switch {
		case n == 1:
			op = wire.ReadRespOnly
		case i == 0:
			op = wire.ReadRespFirst
		case i == n-1:
			op = wire.ReadRespLast
		default:
			op = wire.ReadRespMiddle
		}
		pk := qp.newPacket(op, psn.Add(p.PSN, i))
		off := i * qp.mtu
		e := min(off+qp.mtu, len(b))
		pk.Payload = b[off:e:e] // the responder's memory, read once by the requester
		if raceBuild && psn.Diff(pk.PSN, rs.ePSN) < 0 {
			// A response sent before: the requester may have completed
			// the READ, and the application may be writing the bytes.
			src := pk.Payload
			pk.Payload = pk.Bounce(len(src))
			copyRacy(pk.Payload, src)
		}
		if op.HasAETH() {
			pk.Syndrome, pk.MSN = wire.SyndromeACK|0x1F, rs.msn
		}
		ob.pkts = append(ob.pkts, pk)
	}
	rs.ackPending, rs.delayed = false, false
	if extends {
		rs.ePSN, rs.nakSent = end, false
	}
}

func (qp *QP) atomicExec(p *wire.Packet, ob *outbox) {
	rs := &qp.resp
	if p.VA%8 != 0 {
		qp.reject(ob, wire.NAKInvalid)
		return
	}
	mr, b, ok := qp.pd.resolveRemote(p.RKey, p.VA, 8, AccessRemoteAtomic)
	if !ok || !mr.enter() {
		qp.reject(ob, wire.NAKRemoteAccess)
		return
	}
	orig := qp.dev.atomicOp(b, p.Opcode == wire.CompareSwap, p.SwapAdd, p.Compare)
	mr.exit()
	rs.cache[rs.cacheNext] = atomicResult{psn: p.PSN, orig: orig, valid: true}
	rs.cacheNext = (rs.cacheNext + 1) % len(rs.cache)
	rs.msn++
	qp.atomicAck(ob, p.PSN, orig)
	rs.ePSN = psn.Add(rs.ePSN, 1)
}

// atomicOp executes a fetch-and-add or compare-and-swap on 8 bytes of
// target memory, in host byte order, atomically with respect to every other
// atomic of this device (and, where the memory is 8-byte aligned in the
// host, with the CPU's atomic instructions).
func (d *Device) atomicOp(b []byte, cas bool, swapAdd, compare uint64) uint64 {
	if uintptr(unsafe.Pointer(&b[0]))%8 == 0 {
		w := (*uint64)(unsafe.Pointer(&b[0]))
		if !cas {
			return atomic.AddUint64(w, swapAdd) - swapAdd
		}
		for {
			old := atomic.LoadUint64(w)
			if old != compare {
				return old
			}
			if atomic.CompareAndSwapUint64(w, old, swapAdd) {
				return old
			}
		}
	}
	d.atomicMu.Lock()
	defer d.atomicMu.Unlock()
	old := binary.NativeEndian.Uint64(b)
	switch {
	case !cas:
		binary.NativeEndian.PutUint64(b, old+swapAdd)
	case old == compare:
		binary.NativeEndian.PutUint64(b, swapAdd)
	}
	return old
}

func (qp *QP) atomicAck(ob *outbox, p uint32, orig uint64) {
	pk := qp.newPacket(wire.AtomicAck, p)
	pk.Syndrome, pk.MSN, pk.Orig = wire.SyndromeACK|0x1F, qp.resp.msn, orig
	ob.pkts = append(ob.pkts, pk)
	qp.resp.ackPending, qp.resp.delayed = false, false
}

// emitAck sends an ACK or NAK now.
func (qp *QP) emitAck(ob *outbox, syndrome uint8, p uint32) {
	pk := qp.newPacket(wire.Acknowledge, p)
	pk.Syndrome, pk.MSN = syndrome, qp.resp.msn
	ob.pkts = append(ob.pkts, pk)
	qp.resp.ackPending, qp.resp.delayed = false, false
}

// scheduleAck asks for a coalesced ACK at the end of the receive batch.
func (qp *QP) scheduleAck(ob *outbox) {
	rs := &qp.resp
	rs.ackPending = true
	if !rs.inTouched {
		rs.inTouched = true
		ob.touched = append(ob.touched, qp)
	}
}

// flushAck sends the coalesced ACK, if one is still pending.
func (qp *QP) flushAck(ob *outbox) {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	rs := &qp.resp
	rs.inTouched = false
	if rs.ackPending && !qp.closed {
		qp.emitAck(ob, wire.SyndromeACK|0x1F, psn.Add(rs.ePSN, -1))
	}
}
