package verbs

import (
	"encoding/binary"
	"slices"
	"time"
	"unsafe"

	"github.com/rvma/rvma/internal/psn"
	"github.com/rvma/rvma/internal/wire"
)

// sendWQE is a send-queue slot: a copied work request plus its progress.
type sendWQE struct {
	id         uint64
	op         Opcode
	flags      SendFlags
	signaled   bool
	raddr      uint64
	rkey       uint32
	imm        uint32
	compareAdd uint64
	swap       uint64
	mailbox    uint64
	mboff      uint64

	segs   [][]byte // resolved gather (or scatter, for READ and atomics) list
	inline []byte   // owned copy of inline data
	length int
	status Status // local error found at post time

	firstPSN uint32
	npsn     int  // PSNs the request consumes
	resp     int  // READ/atomic: responses received, in order
	started  bool // transmitted at least once
	acked    bool // done: acknowledged, or all responses in

	// Shared memory (see QP.direct): local requests were executed at post
	// time by copying to or from the peer's memory and send no packet;
	// placed ones (WRITE with immediate) copied their payload that way
	// and send only the notification; pulled ones (large mailbox writes)
	// send the payload's address for the target to fetch it.
	local, placed, pulled bool
}

func (w *sendWQE) reset() {
	segs, inline := w.segs[:0], w.inline[:0]
	*w = sendWQE{segs: segs, inline: inline}
}

func (w *sendWQE) lastPSN() uint32 { return psn.Add(w.firstPSN, w.npsn-1) }

func (w *sendWQE) contains(p uint32) bool {
	return psn.Diff(p, w.firstPSN) >= 0 && psn.Diff(p, w.lastPSN()) <= 0
}

// requester is the send side of a QP: go-back-N over a window of PSNs, as
// InfiniBand RC requesters work. Go-back-N rather than selective repeat
// because the responder then needs no reorder buffer and no per-packet
// state, and because loss on the paths RC is meant for is rare; lossy
// long-haul paths use UC with the reliability package's selective repeat
// and erasure coding instead.
//
// qp.mu guards all of it, the send-queue slots included. Packets built
// from a slot leave with slices of the caller's memory, not of the slot.
type requester struct {
	ring       []sendWQE // grows to max slots (see push)
	max        int
	headSeq    uint64 // oldest incomplete request
	tailSeq    uint64 // next free slot
	txSeq      uint64 // request being transmitted
	txOff      int    // next packet (PSN offset) of that request
	nextPSN    uint32 // next PSN to assign at post time
	txPSN      uint32 // next PSN to transmit
	maxSent    uint32 // one past the highest PSN transmitted
	unacked    uint32 // oldest unacknowledged PSN
	lastAckReq uint32 // the last PSN sent with AckReq
	asked      bool   // some packet was sent with AckReq (lastAckReq is one)
	forceAck   bool   // the next data packet asks for an ACK (see progressSend)
	rdInFlight int
	// pending counts requests in the queue whose effect at the target is
	// not complete yet (all but local and placed ones); a request may
	// be executed directly only when there are none, so it cannot
	// overtake them.
	pending int

	// cwnd is the congestion window in PSNs (AIMD between minCwnd and the
	// configured Window): halved on a loss, grown by about one PSN per
	// window acknowledged. Go-back-N resends the whole flight after a
	// loss, so without it a window larger than the receiver's buffer
	// would overflow it again on every retry.
	cwnd    int
	cwndAcc int // PSNs acknowledged toward the next increase

	retries      int
	rnrRetries   int
	rto          rtoEstimator
	lastProgress time.Time
	rnrUntil     time.Time
	rewound      bool // a sequence NAK already rewound to rewoundTo
	rewoundTo    uint32
}

// initialSendRing is how many send-queue slots a QP starts with; the ring
// doubles when it fills, up to QPConfig.MaxSendWR, and each slot's gather
// list and inline copy grow with use. A QP preallocated to a depth of
// 4096 with 32 SGEs and 256 inline bytes per slot cost 5 MiB before its
// first post: that was most of what each connected peer cost a rank.
const initialSendRing = 64

func (r *requester) init(cfg *QPConfig) {
	ring := r.ring
	if ring == nil {
		ring = make([]sendWQE, min(cfg.MaxSendWR, initialSendRing))
	}
	*r = requester{ring: ring, max: cfg.MaxSendWR}
}

func (r *requester) start(p uint32) {
	r.nextPSN, r.txPSN, r.maxSent, r.unacked, r.lastAckReq = p, p, p, p, p
	r.asked, r.forceAck = false, false
}

// ackComing reports whether something in flight will be acknowledged
// without waiting for the responder's delayed ACK: a packet that asked
// for an ACK, or a READ or atomic (answered at once).
func (r *requester) ackComing() bool {
	return r.rdInFlight > 0 || r.asked && psn.Diff(r.lastAckReq, r.unacked) >= 0
}

func (r *requester) at(seq uint64) *sendWQE { return &r.ring[seq%uint64(len(r.ring))] }
func (r *requester) full() bool             { return r.tailSeq-r.headSeq == uint64(r.max) }

// push takes the next slot, growing the ring if it is full (the queue may
// still hold up to r.max).
func (r *requester) push() *sendWQE {
	if r.tailSeq-r.headSeq == uint64(len(r.ring)) {
		ring := make([]sendWQE, min(2*len(r.ring), r.max))
		for seq := r.headSeq; seq < r.tailSeq; seq++ {
			ring[seq%uint64(len(ring))] = *r.at(seq)
		}
		r.ring = ring
	}
	w := r.at(r.tailSeq)
	r.tailSeq++
	return w
}

func (r *requester) head() *sendWQE {
	if r.headSeq == r.tailSeq {
		return nil
	}
	return r.at(r.headSeq)
}

func (r *requester) pop() {
	if w := r.at(r.headSeq); !w.local && !w.placed {
		r.pending--
	}
	r.headSeq++
	if r.txSeq < r.headSeq {
		r.txSeq, r.txOff = r.headSeq, 0
	}
}

func (r *requester) inFlight() bool { return r.txPSN != r.unacked || r.maxSent != r.unacked }

const minCwnd = 4

// bulkWindow is the congestion window of bulk packets: the bulk window's
// share of cwnd, so that losses shrink it too.
func (r *requester) bulkWindow(c *connAttrs) int32 {
	if c.bulk >= c.window {
		return int32(r.cwnd)
	}
	return int32(max(minCwnd, r.cwnd*c.bulk/c.window))
}

// onLoss halves the congestion window.
func (qp *QP) onLoss() {
	r := &qp.req
	r.cwnd = max(minCwnd, r.cwnd/2)
	r.cwndAcc = 0
}

// onAcked grows the congestion window by one PSN per window acknowledged.
func (qp *QP) onAcked(n int) {
	r := &qp.req
	if r.cwnd >= qp.conn.window {
		return
	}
	r.cwndAcc += n
	for r.cwndAcc >= r.cwnd && r.cwnd < qp.conn.window {
		r.cwndAcc -= r.cwnd
		r.cwnd++
	}
}

// progressSend transmits what the window allows.
func (qp *QP) progressSend(now time.Time, ob *outbox) {
	r := &qp.req
	if qp.state != StateReadyToSend {
		return
	}
	// Deferred packets are older than any built now: if this builds any,
	// they go first (else the responder would see a gap), and wait
	// otherwise.
	start := len(ob.pkts)
	defer func() {
		if len(ob.pkts) > start && len(qp.deferred) > 0 {
			qp.sendDeferred(ob, start)
		}
	}()
	if !r.rnrUntil.IsZero() {
		if now.Before(r.rnrUntil) {
			qp.armTimer(r.rnrUntil)
			return
		}
		r.rnrUntil = time.Time{}
	}
	if r.cwnd == 0 {
		r.cwnd = qp.conn.window
	}
	win := int32(r.cwnd)
	for r.txSeq < r.tailSeq {
		w := r.at(r.txSeq)
		if w.local {
			r.txSeq++ // done at post time; nothing to send
			continue
		}
		if w.status != StatusSuccess {
			// Reported in order, once everything before it completed.
			if r.txSeq == r.headSeq {
				qp.fail(w.status, 0)
				return
			}
			break
		}
		p := psn.Add(w.firstPSN, r.txOff)
		room := win - psn.Diff(p, r.unacked)
		if qp.typ == UC {
			// Nothing acknowledges UC: its window never fills (a message
			// longer than it waited forever for an ACK). What is queued
			// goes now, as the send queue's depth bounds.
			room = int32(w.npsn - r.txOff)
		} else if w.length > bulkLen && room > 0 {
			// The bulk window. Small messages may fill it with packets
			// that asked for no ACK (theirs come every ackEvery, which
			// can be more than the bulk window): then one packet more
			// goes, asking for one, rather than wait for the delayed ACK.
			if bulk := r.bulkWindow(&qp.conn) - psn.Diff(p, r.unacked); bulk > 0 {
				room = bulk
			} else if r.ackComing() {
				room = 0
			} else {
				room, r.forceAck = 1, true
			}
		}
		if room <= 0 {
			break
		}
		if r.txOff == 0 && !w.started {
			if w.op.isReadLike() && r.rdInFlight >= qp.conn.maxRdAtomic {
				break
			}
			if w.flags&FlagFence != 0 && r.rdInFlight > 0 {
				break
			}
		}
		if r.txPSN == r.unacked && r.maxSent == r.unacked {
			r.lastProgress = now // the flight starts now
		}
		if psn.Diff(p, r.maxSent) >= 0 {
			r.rto.sent(p, now) // first transmission: may be timed
		}
		switch {
		case w.op == OpRead:
			n := min(w.npsn-r.txOff, int(room))
			ob.pkts = append(ob.pkts, qp.readRequest(w, r.txOff, n))
			r.txOff += n
		case w.op.isAtomic():
			ob.pkts = append(ob.pkts, qp.atomicRequest(w))
			r.txOff++
		default:
			pk := qp.dataPacket(w, r.txOff)
			if psn.Diff(pk.PSN, r.maxSent) < 0 {
				// A retransmission: the original may be acknowledged, its
				// request completed and its buffer reused before this
				// copy leaves (it is sent after the QP's lock is
				// released), so it carries its own bytes.
				pk.Own()
			} else {
				// A first transmission reads the request's memory when
				// the outbox is sent: no request completes before.
				ob.hold(qp)
			}
			ob.pkts = append(ob.pkts, pk)
			r.txOff++
		}
		if !w.started {
			w.started = true
			if w.op.isReadLike() {
				r.rdInFlight++
			}
		}
		r.txPSN = psn.Add(w.firstPSN, r.txOff)
		if psn.Diff(r.txPSN, r.maxSent) > 0 {
			r.maxSent = r.txPSN
		}
		if r.txOff == w.npsn {
			r.txSeq++
			r.txOff = 0
			if qp.typ == UC {
				// UC completes at the initiator once the message is sent.
				w.acked = true
				r.unacked, r.maxSent = r.txPSN, r.txPSN
				qp.completeDone()
			}
		}
	}
	if qp.typ == RC && r.inFlight() {
		qp.armTimer(r.lastProgress.Add(r.rto.rto()))
	}
}

// completeDone completes finished requests at the head, in order.
func (qp *QP) completeDone() {
	if qp.unflushed.Load() > 0 {
		// A packet of a request may still be on its way out of an outbox:
		// the last flush completes them (see QP.unflushed).
		qp.held.Store(true)
		if qp.unflushed.Load() > 0 {
			return
		}
	}
	qp.held.Store(false)
	// A flush that reached zero may have looked at held before this
	// store cleared it: completions an error held are released here then.
	qp.releaseErrors()
	qp.completeAcked()
}

// completeAcked completes the acknowledged requests at the head, in
// order, whatever completeDone would wait for: fail calls it so that they
// keep their success and the error goes to the request that failed.
func (qp *QP) completeAcked() {
	r := &qp.req
	for w := r.head(); w != nil && w.acked; w = r.head() {
		if w.op.isReadLike() && !w.local {
			r.rdInFlight--
		}
		r.pop()
		qp.completeSend(w, StatusSuccess, 0, false)
	}
}

// goBack rewinds transmission to PSN p (go-back-N).
func (qp *QP) goBack(p uint32) {
	r := &qp.req
	r.rto.resent(p)
	qp.dropDeferred() // rebuilt from p
	for seq := r.headSeq; seq < r.tailSeq; seq++ {
		w := r.at(seq)
		if w.contains(p) {
			r.txSeq, r.txOff = seq, int(psn.Diff(p, w.firstPSN))
			r.txPSN = p
			return
		}
	}
	r.txSeq, r.txOff, r.txPSN = r.tailSeq, 0, r.nextPSN
}

// sendDeferred puts the packets of FlagDefer requests into ob at index at,
// ahead of what follows, and keeps none back.
func (qp *QP) sendDeferred(ob *outbox, at int) {
	if len(qp.deferred) > 0 {
		ob.hold(qp) // first transmissions, built from the requests' memory
	}
	ob.pkts = slices.Insert(ob.pkts, at, qp.deferred...)
	clear(qp.deferred)
	qp.deferred = qp.deferred[:0]
}

// dropDeferred releases the packets of FlagDefer requests not yet sent:
// the QP goes back to rebuild them, or will never send them.
func (qp *QP) dropDeferred() {
	for _, p := range qp.deferred {
		p.Release()
	}
	clear(qp.deferred)
	qp.deferred = qp.deferred[:0]
}

// checkTimers handles the retransmission and RNR timers.
func (qp *QP) checkTimers(now time.Time, ob *outbox) {
	r := &qp.req
	if !r.rnrUntil.IsZero() {
		if now.Before(r.rnrUntil) {
			qp.armTimer(r.rnrUntil)
			return
		}
		r.rnrUntil = time.Time{}
		r.lastProgress = now
	} else if r.inFlight() {
		deadline := r.lastProgress.Add(r.rto.rto())
		if now.Before(deadline) {
			qp.armTimer(deadline)
			return
		}
		if len(qp.deferred) > 0 {
			// Deferred packets waited a timeout for the next post: they
			// were never sent, so nothing was lost. Send them now (a
			// deferral lasts at most a retransmission timeout) and time
			// them from here.
			r.lastProgress = now
			qp.sendDeferred(ob, len(ob.pkts))
			qp.progressSend(now, ob)
			qp.armTimer(now.Add(r.rto.rto()))
			return
		}
		r.retries++
		r.rto.timedOut(now)
		qp.dev.stats.timeouts.Add(1)
		qp.timeouts.Add(1)
		if r.retries > qp.conn.retryCount {
			qp.fail(StatusRetryExceeded, 0)
			return
		}
		qp.onLoss()
		qp.goBack(r.unacked)
		r.rewound = false
		r.lastProgress = now
	}
	qp.progressSend(now, ob)
}

// ackTo acknowledges every PSN up to and including a. It returns false if
// the acknowledgement implies lost READ or atomic responses, in which case
// transmission was rewound to the first missing response.
func (qp *QP) ackTo(a uint32, now time.Time) bool {
	r := &qp.req
	if psn.Diff(a, r.unacked) < 0 {
		return true // stale
	}
	if psn.Diff(a, r.maxSent) >= 0 {
		qp.dev.drop(&qp.dev.stats.malformed) // acknowledges what was never sent
		return false
	}
	for seq := r.headSeq; seq < r.tailSeq; seq++ {
		w := r.at(seq)
		if psn.Diff(a, w.firstPSN) < 0 {
			break
		}
		if w.op.isReadLike() && !w.acked {
			// The responder executed past this request, so its responses
			// were lost: an implied NAK.
			e := psn.Add(w.firstPSN, w.resp)
			qp.progressTo(e, now)
			qp.onLoss()
			qp.goBack(e)
			return false
		}
		if psn.Diff(w.lastPSN(), a) <= 0 {
			w.acked = true
		} else {
			break
		}
	}
	qp.progressTo(psn.Add(a, 1), now)
	return true
}

// progressTo records that every PSN before u is acknowledged.
func (qp *QP) progressTo(u uint32, now time.Time) {
	r := &qp.req
	if psn.Diff(u, r.unacked) <= 0 {
		return
	}
	for seq := r.headSeq; seq < r.tailSeq; seq++ {
		w := r.at(seq)
		if psn.Diff(u, w.lastPSN()) <= 0 {
			break
		}
		w.acked = true // requests before u are done (READs only reach here complete)
	}
	qp.onAcked(int(psn.Diff(u, r.unacked)))
	r.rto.acked(u, now)
	r.unacked = u
	r.retries, r.rnrRetries = 0, 0
	r.lastProgress = now
	r.rewound = false
	if psn.Diff(r.txPSN, u) < 0 {
		qp.goBack(u)
	}
}

// handleResponse processes a packet from the responder: ACK, NAK, READ
// response or atomic acknowledgement.
func (qp *QP) handleResponse(p *wire.Packet, now time.Time, ob *outbox) {
	if qp.typ != RC || qp.state != StateReadyToSend {
		qp.dev.drop(&qp.dev.stats.discarded)
		return
	}
	r := &qp.req
	switch p.Opcode {
	case wire.Acknowledge:
		switch wire.SyndromeType(p.Syndrome) {
		case wire.SyndromeACK:
			qp.ackTo(p.PSN, now)
		case wire.SyndromeRNR:
			if psn.Diff(p.PSN, r.unacked) < 0 || !qp.ackTo(psn.Add(p.PSN, -1), now) {
				break
			}
			r.rnrRetries++
			qp.dev.stats.rnrNaks.Add(1)
			qp.rnrNaks.Add(1)
			if qp.conn.rnrRetry != 7 && r.rnrRetries > qp.conn.rnrRetry {
				qp.fail(StatusRNRRetryExceeded, 0)
				return
			}
			qp.goBack(p.PSN)
			r.rnrUntil = now.Add(rnrDuration(wire.SyndromeValue(p.Syndrome)))
			qp.armTimer(r.rnrUntil)
		case wire.SyndromeNAK:
			if psn.Diff(p.PSN, r.unacked) < 0 || !qp.ackTo(psn.Add(p.PSN, -1), now) {
				break
			}
			qp.completeDone()
			code := wire.SyndromeValue(p.Syndrome)
			switch {
			case code == wire.NAKSequence:
				if r.rewound && r.rewoundTo == p.PSN {
					break // already rewound for this loss
				}
				qp.dev.stats.seqNaks.Add(1)
				qp.seqNaks.Add(1)
				qp.onLoss()
				qp.goBack(p.PSN)
				r.rewound, r.rewoundTo = true, p.PSN
			case code == wire.NAKInvalid:
				qp.fail(StatusRemoteInvalidRequest, 0)
				return
			case code == wire.NAKRemoteAccess:
				qp.fail(StatusRemoteAccessError, 0)
				return
			case code >= wire.NAKMailboxBase:
				qp.fail(StatusRemoteAccessError, uint32(code-wire.NAKMailboxBase)+uint32(MailboxRefused))
				return
			default:
				qp.fail(StatusRemoteOperationalError, 0)
				return
			}
		default:
			qp.dev.drop(&qp.dev.stats.malformed)
			return
		}
	case wire.ReadRespFirst, wire.ReadRespMiddle, wire.ReadRespLast, wire.ReadRespOnly, wire.AtomicAck:
		qp.readResponse(p, now)
	default:
		qp.dev.drop(&qp.dev.stats.malformed)
		return
	}
	if qp.state == StateReadyToSend {
		qp.completeDone()
		qp.progressSend(now, ob)
	}
}

// readResponse places one READ response or atomic acknowledgement.
func (qp *QP) readResponse(p *wire.Packet, now time.Time) {
	r := &qp.req
	var w *sendWQE
	for seq := r.headSeq; seq < r.tailSeq; seq++ {
		if x := r.at(seq); x.op.isReadLike() && !x.acked {
			w = x
			break
		}
	}
	if w == nil || !w.started {
		qp.dev.drop(&qp.dev.stats.duplicates)
		return
	}
	e := psn.Add(w.firstPSN, w.resp)
	switch d := psn.Diff(p.PSN, e); {
	case d < 0:
		qp.dev.drop(&qp.dev.stats.duplicates)
		return
	case d > 0:
		// Responses before p were lost; everything before w was executed.
		qp.dev.drop(&qp.dev.stats.outOfWindow)
		if !w.contains(p.PSN) {
			return
		}
		qp.progressTo(e, now)
		if !(r.rewound && r.rewoundTo == e) {
			qp.onLoss()
			qp.goBack(e)
			r.rewound, r.rewoundTo = true, e
		}
		return
	}
	if (w.op == OpRead) != (p.Opcode != wire.AtomicAck) {
		qp.dev.drop(&qp.dev.stats.malformed)
		return
	}
	if w.op == OpRead {
		off := w.resp * qp.mtu
		want := min(qp.mtu, w.length-off)
		// Framing (FIRST/ONLY) restarts with every READ request, and a READ
		// is re-requested from its first missing response, so only PSN
		// order and length identify a response.
		if len(p.Payload) != want {
			qp.dev.drop(&qp.dev.stats.malformed)
			return
		}
		scatter(w.segs, off, p.Payload)
		w.resp++
		w.acked = w.resp == w.npsn
	} else {
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], p.Orig)
		scatter(w.segs, 0, b[:])
		w.resp, w.acked = 1, true
	}
	qp.progressTo(psn.Add(p.PSN, 1), now)
}

// dataPacket builds packet idx of a SEND, WRITE or mailbox write.
func (qp *QP) dataPacket(w *sendWQE, idx int) *wire.Packet {
	first, last := idx == 0, idx == w.npsn-1
	var fam [6]wire.Opcode // first, middle, last, last+imm, only, only+imm
	switch w.op {
	case OpSend, OpSendImm:
		fam = [6]wire.Opcode{wire.SendFirst, wire.SendMiddle, wire.SendLast, wire.SendLastImm, wire.SendOnly, wire.SendOnlyImm}
	case OpWrite, OpWriteImm:
		fam = [6]wire.Opcode{wire.WriteFirst, wire.WriteMiddle, wire.WriteLast, wire.WriteLastImm, wire.WriteOnly, wire.WriteOnlyImm}
	case OpWriteList: // one packet, ONLY
		fam = [6]wire.Opcode{4: wire.WriteList}
	default:
		fam = [6]wire.Opcode{wire.MailboxFirst, wire.MailboxMiddle, wire.MailboxLast, wire.MailboxLastImm, wire.MailboxOnly, wire.MailboxOnlyImm}
	}
	imm := 0
	if w.op.hasImm() {
		imm = 1
	}
	var op wire.Opcode
	switch {
	case first && last:
		op = fam[4+imm]
	case first:
		op = fam[0]
	case last:
		op = fam[2+imm]
	default:
		op = fam[1]
	}
	if qp.typ == UC {
		op = op.UC()
	}
	pk := qp.newPacket(op, psn.Add(w.firstPSN, idx))
	off := idx * qp.mtu
	switch {
	case w.placed: // the payload is in place already
	case w.pulled:
		b := pk.Bounce(8)
		binary.BigEndian.PutUint64(b, uint64(uintptr(unsafe.Pointer(&w.segs[0][0]))))
		pk.Payload = b
	default:
		pk.Payload = gather(w.segs, off, min(qp.mtu, w.length-off), pk)
		pk.Steady = true // the request's memory, untouched until it completes
	}
	pk.Placed = w.placed || w.pulled
	if op.HasRETH() {
		pk.VA, pk.RKey, pk.DMALen = w.raddr, w.rkey, uint32(w.length)
	}
	if w.op.isMailbox() {
		pk.Mailbox, pk.Offset, pk.MsgOff, pk.MsgLen = w.mailbox, w.mboff, uint32(off), uint32(w.length)
	}
	if op.HasImm() {
		pk.Imm = w.imm
	}
	pk.Solicit = last && w.flags&FlagSolicited != 0
	pk.AckReq = qp.typ == RC && qp.wantAck(pk.PSN, last, w.signaled, idx, w.length > bulkLen)
	return pk
}

// wantAck decides whether a data packet asks for an immediate ACK. A
// responder may coalesce acknowledgements, so the requester asks only where
// it needs one soon: for a signaled request's completion, every quarter
// window so the window keeps moving (the bulk window's, for the packets of
// a bulk message), and when the send queue is half full. Other packets are
// acknowledged by the responder's delayed ACK (ackDelay), well before the
// retransmission timeout.
func (qp *QP) wantAck(p uint32, last, signaled bool, idx int, bulk bool) bool {
	r := &qp.req
	every := qp.conn.ackEvery
	if bulk {
		every = qp.conn.bulkAckEvery
	}
	ask := r.forceAck || (idx+1)%every == 0 ||
		last && (signaled || r.tailSeq-r.headSeq >= uint64(r.max/2) ||
			psn.Diff(p, r.lastAckReq) >= int32(every))
	if ask {
		r.lastAckReq, r.asked, r.forceAck = p, true, false
	}
	return ask
}

// readRequest builds a READ request for n response packets starting at
// packet idx; a READ longer than the window is requested in pieces.
func (qp *QP) readRequest(w *sendWQE, idx, n int) *wire.Packet {
	pk := qp.newPacket(wire.ReadRequest, psn.Add(w.firstPSN, idx))
	off := idx * qp.mtu
	pk.VA, pk.RKey = w.raddr+uint64(off), w.rkey
	pk.DMALen = uint32(min(w.length-off, n*qp.mtu))
	pk.AckReq = true
	return pk
}

func (qp *QP) atomicRequest(w *sendWQE) *wire.Packet {
	op := wire.FetchAdd
	if w.op == OpCompareSwap {
		op = wire.CompareSwap
	}
	pk := qp.newPacket(op, w.firstPSN)
	pk.VA, pk.RKey, pk.SwapAdd, pk.Compare = w.raddr, w.rkey, w.compareAdd, w.swap
	if w.op == OpCompareSwap {
		pk.SwapAdd, pk.Compare = w.swap, w.compareAdd
	}
	pk.AckReq = true
	return pk
}

// gather returns n bytes at offset off of the segment list: a slice of the
// caller's memory when they lie in one segment (zero copy), else a copy in
// the packet's own buffer.
func gather(segs [][]byte, off, n int, pk *wire.Packet) []byte {
	if n <= 0 {
		return nil
	}
	i := 0
	for i < len(segs) && off >= len(segs[i]) {
		off -= len(segs[i])
		i++
	}
	if off+n <= len(segs[i]) {
		return segs[i][off : off+n : off+n]
	}
	b := pk.Bounce(n)
	for k := 0; k < n; i++ {
		k += copy(b[k:], segs[i][off:])
		off = 0
	}
	return b
}

// scatter copies p into the segment list at offset off; false if it does
// not fit.
func scatter(segs [][]byte, off int, p []byte) bool {
	for _, s := range segs {
		if len(p) == 0 {
			return true
		}
		if off >= len(s) {
			off -= len(s)
			continue
		}
		n := copy(s[off:], p)
		p = p[n:]
		off = 0
	}
	return len(p) == 0
}
