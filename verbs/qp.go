package verbs

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	mrand "math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/rvma/rvma/internal/fabric"
	"github.com/rvma/rvma/internal/lockcheck"
	"github.com/rvma/rvma/internal/psn"
	"github.com/rvma/rvma/internal/spin"
	"github.com/rvma/rvma/internal/wire"
)

// QPConfig configures CreateQP. The zero value of each field means its
// default; SendCQ is required.
type QPConfig struct {
	Type   QPType // RC or UC; default RC
	SendCQ *CQ    // completions of send work requests; required
	RecvCQ *CQ    // completions of receives; default SendCQ
	SRQ    *SRQ   // take receives from this shared queue instead of the QP's own
	GID    int    // index of the local GID (see Device.GIDs); default 0

	MaxSendWR  int // send queue depth; default 256, range 1..16384
	MaxRecvWR  int // receive queue depth; default 256, range 1..16384
	MaxSendSGE int // SGEs per send request; default 4, range 1..32
	MaxRecvSGE int // SGEs per receive; default 4, range 1..32
	MaxInline  int // largest inline payload; default 256, range 0..4096

	// SignalAll makes every send request produce a completion; otherwise
	// only those with FlagSignaled do (failures always do).
	SignalAll bool
}

// Endpoint is what a peer needs to connect to a QP; the connection manager
// exchanges it.
type Endpoint struct {
	GID GID    // the QP's local address
	QPN uint32 // the QP number
	PSN uint32 // the first PSN the QP will send
	MTU int    // the largest payload the QP's port carries
	// Secret is the value the QP expects in every packet sent to it; a
	// packet without it is dropped.
	Secret uint64
	// MACKey, unless zero, is the key of the AES-GMAC tag the QP expects
	// on every packet sent to it (UDP ports; see DeviceConfig.NoMAC). It
	// is as secret as the connection: the connection manager masks it
	// with the job's key.
	MACKey [16]byte
}

// ConnectConfig holds the connection attributes of the ReadyToReceive and
// ReadyToSend transitions. The zero value means defaults.
type ConnectConfig struct {
	// MTU caps the path MTU; the path MTU is the smallest of this, the local
	// port's and the remote's. Default: no cap.
	MTU int
	// Timeout is the shortest time an RC requester waits for an
	// acknowledgement before it retransmits, and the wait before a round
	// trip has been measured. The wait is the larger of this and
	// SRTT + 4·RTTVAR of measured round trips (RFC 6298), doubled after
	// each timeout that brings no progress, up to MaxTimeout. Default
	// 20ms, range 100µs..10s.
	Timeout time.Duration
	// MaxTimeout caps the retransmission timeout and its backoff. With
	// the defaults, a peer that answers nothing fails a request after
	// about 5 s (20 ms doubled over 7 retries). Default 2s, range
	// Timeout..60s.
	MaxTimeout time.Duration
	// RetryCount is how many times an RC requester retransmits after a
	// timeout before it fails with StatusRetryExceeded. Default 7, range
	// 0..7 (set NoRetry for zero: the field's zero value means default).
	RetryCount int
	// RNRRetry is how many receiver-not-ready NAKs an RC requester
	// tolerates for one request before StatusRNRRetryExceeded; 7 means
	// unlimited, as in InfiniBand. Default 7; NoRetry for zero.
	RNRRetry int
	// MinRNRTimer is how long this QP, as responder, asks a requester to
	// wait after a receiver-not-ready NAK. Default 1ms, rounded up to the
	// InfiniBand timer table (10µs..655ms).
	MinRNRTimer time.Duration
	// MaxRdAtomic bounds the READs and atomics in flight (as requester) and
	// the atomic results kept for duplicates (as responder). Default 16,
	// range 1..256.
	MaxRdAtomic int
	// Window bounds the PSNs in flight unacknowledged. The requester starts
	// with the whole window, halves it on every loss (down to 4) and grows
	// it back by one PSN per window acknowledged. Default 128; where the
	// default meets a UDP path MTU above 4096, the packets of messages
	// longer than 4096 bytes are held to the share of the congestion
	// window that carries 1 MiB when nothing is lost (17 packets of
	// 61440), so that large packets do not outrun a socket's receive
	// buffer while small messages keep the whole window. Range 4..8192.
	Window int
}

// NoRetry requests zero retries in ConnectConfig.RetryCount and RNRRetry.
const NoRetry = -1

// QP is a queue pair, bound to one local GID.
//
// A QP is safe for concurrent use: posting from several goroutines is
// serialised; requests are executed in post order.
type QP struct {
	// Immutable after CreateQP: read without a lock.
	dev    *Device
	pd     *PD
	typ    QPType
	num    uint32
	full   error // the send queue's ErrQueueFull, made once: posters meet it in loops
	gid    int
	port   *fabric.FaultPort
	sendCQ *CQ
	recvCQ *CQ
	srq    *SRQ
	cfg    QPConfig
	timer  *time.Timer // the requester's retransmission and RNR timer (onTimer)
	// ackTimer is the responder's delayed ACK (onAckTimer).
	ackTimer *time.Timer

	// mu guards the fields below (the atomics at the end excepted). The
	// re-entrancy rule: no goroutine calls Port.Send, a MailboxHandler or
	// any other code outside the engine while it holds the mu of any QP,
	// since that code may re-enter the engine (the loop fabric delivers
	// inline, to this device too, and a handler may post): packets made
	// under mu go into an outbox that is flushed after it is released,
	// and mailboxExec releases mu around the handler. What is called
	// under it calls nothing back: completions are pushed to the CQs
	// (CQ.mu nests inside QP.mu), receives taken from an SRQ (SRQ.mu
	// too), and on shm a request is executed directly through the
	// port's memory (its locks too). Under -tags rvmadebug the rule is
	// checked (see outbox.flush, mailboxExec and internal/lockcheck).
	mu     lockcheck.Mutex[qpLocks]
	state  QPState
	closed bool

	remote      Endpoint
	mtu         int
	localSecret uint64
	localMACKey [16]byte          // zero: no MAC expected
	rxMAC       *wire.MAC         // checks packets sent to this QP
	txMAC       *wire.MAC         // signs packets to the remote QP, if it asked for a MAC (replaced, never modified, and safe for concurrent use: packets in an outbox sign with it after mu is released)
	replay      wire.ReplayWindow // counters of packets accepted since connecting
	startPSN    uint32

	conn connAttrs

	req  requester
	resp responder // but resp.mw: see responder
	rq   recvQueue // unused with an SRQ (which has its own lock)
	// deferred holds the packets of FlagDefer requests built but not sent
	// yet, oldest first (progressSend sends them ahead of what it builds).
	deferred []*wire.Packet
	// placed counts the next requests of the current post whose mailbox
	// writes placeBatch placed already; boxPuts, boxSegs and boxInline
	// are its scratch.
	placed    int
	boxPuts   []fabric.BoxPut
	boxSegs   [][]byte
	boxInline []byte

	timerAt   time.Time
	timerLive bool

	// Atomics: requester events since creation, for QP.Stats (read
	// without mu, written under it).
	timeouts, seqNaks, rnrNaks atomic.Uint64

	// unflushed counts the outboxes that hold first transmissions of
	// this QP's requests and are not flushed yet (incremented under mu,
	// decremented after the send, without it). Those packets point into
	// their requests' memory (or send-queue slots): a request completed
	// meanwhile (its retransmission acknowledged first, on a loaded
	// machine) would hand back a buffer still being read. completeDone
	// waits for zero; held says it waited, and the flush that reaches
	// zero completes them.
	unflushed atomic.Int32
	held      atomic.Bool
	// A QP that fails while outboxes hold first transmissions keeps the
	// completions of its requests, errors included, in heldWCs until the
	// last of those outboxes is flushed: an error completion hands a
	// buffer back just as a success does (under mu).
	errHeld bool
	heldWCs []WorkCompletion
}

// flushed is called when an outbox holding first transmissions of qp's
// requests has been sent.
func (qp *QP) flushed() {
	// Both sides order the counter and the flag with sequentially
	// consistent atomics: completeDone sets held, then looks at the
	// counter; this drops the counter, then looks at held. One of them
	// sees the other.
	if qp.unflushed.Add(-1) > 0 || !qp.held.Load() {
		return
	}
	var ob *outbox
	qp.mu.Lock()
	if qp.closed {
		// Destroyed meanwhile: its requests are discarded, with no
		// completion after Destroy returned.
		qp.mu.Unlock()
		return
	}
	qp.completeDone() // releases what an error held too, if nothing holds packets now
	if r := &qp.req; qp.state == StateReadyToSend && r.txSeq < r.tailSeq {
		// A request that failed at post time may be at the head now
		// (progressSend fails the QP with it); or the window has room.
		ob = outboxPool.Get().(*outbox)
		qp.progressSend(time.Now(), ob)
	}
	qp.mu.Unlock()
	if ob != nil {
		ob.flush(qp.port)
		outboxPool.Put(ob)
	}
}

// qpLocks is the lock class of every QP's mu (see internal/lockcheck): the
// re-entrancy rule above is about all of them, since a send from one QP
// may reach another's handler inline.
type qpLocks struct{}

func (qpLocks) LockClass() string { return "a verbs QP's mu" }

type connAttrs struct {
	timeout     time.Duration
	maxTimeout  time.Duration
	retryCount  int
	rnrRetry    int
	rnrCode     uint8
	maxRdAtomic int
	window      int
	ackEvery    int
	// bulk and bulkAckEvery are window and ackEvery for the packets of
	// messages longer than bulkLen: smaller where the path MTU is large.
	bulk, bulkAckEvery int
	defWindow          bool // window was not given, so bulk follows the path MTU
}

// bulkLen is the longest message whose packets the whole window serves
// when the path MTU is above it: RoCE's largest MTU.
const bulkLen = 4096

// defaultWindow is ConnectConfig.Window's default.
const defaultWindow = 128

// fitWindow sizes the bulk window to the path MTU of a UDP port
// (ConnectConfig.Window). Rings and in-process ports have no socket
// buffer to outrun: their bulk window is the whole one.
func (a *connAttrs) fitWindow(mtu int, udp bool) {
	a.bulk, a.bulkAckEvery = a.window, a.ackEvery
	if a.defWindow && udp && mtu > bulkLen {
		a.bulk = max(minCwnd, min(a.window, bulkBytes/mtu))
		a.bulkAckEvery = ackEveryFor(a.bulk)
	}
}

// bulkBytes is what the bulk window carries when nothing is lost: 17
// packets of 61440. Half of it, 8 packets, cost 4-7% of bandwidth and a
// quarter more on a 1 MiB READ (requested in pieces of the window).
const bulkBytes = 1 << 20

// ackEveryFor is how often a requester asks for an ACK: every quarter
// window, but at least every 64 packets: sparser ACKs only stretch the
// round trip the timeout must cover.
func ackEveryFor(window int) int { return min(max(1, window/4), 64) }

// CreateQP creates a queue pair in the Reset state.
func (pd *PD) CreateQP(cfg QPConfig) (*QP, error) {
	if err := pd.usable(); err != nil {
		return nil, err
	}
	d := pd.dev
	if cfg.Type == 0 {
		cfg.Type = RC
	}
	if cfg.Type != RC && cfg.Type != UC {
		return nil, fmt.Errorf("verbs: create QP: %w: type %v", ErrInvalidArgument, cfg.Type)
	}
	if cfg.SendCQ == nil {
		return nil, fmt.Errorf("verbs: create QP: %w: SendCQ is required", ErrInvalidArgument)
	}
	if cfg.RecvCQ == nil {
		cfg.RecvCQ = cfg.SendCQ
	}
	if cfg.GID < 0 || cfg.GID >= len(d.ports) {
		return nil, fmt.Errorf("verbs: create QP: %w: GID index %d of %d", ErrInvalidArgument, cfg.GID, len(d.ports))
	}
	for _, f := range []struct {
		v        *int
		def, max int
		min      int
		name     string
	}{
		{&cfg.MaxSendWR, 256, 16384, 1, "MaxSendWR"},
		{&cfg.MaxRecvWR, 256, 16384, 1, "MaxRecvWR"},
		{&cfg.MaxSendSGE, 4, 32, 1, "MaxSendSGE"},
		{&cfg.MaxRecvSGE, 4, 32, 1, "MaxRecvSGE"},
		{&cfg.MaxInline, 256, 4096, 0, "MaxInline"},
	} {
		if *f.v == 0 {
			*f.v = f.def
		}
		if *f.v < f.min || *f.v > f.max {
			return nil, fmt.Errorf("verbs: create QP: %w: %s=%d", ErrInvalidArgument, f.name, *f.v)
		}
	}
	if cfg.SRQ != nil && cfg.SRQ.pd != pd {
		return nil, fmt.Errorf("verbs: create QP: %w: SRQ of another PD", ErrInvalidArgument)
	}
	if err := cfg.SendCQ.attach(1); err != nil {
		return nil, err
	}
	if err := cfg.RecvCQ.attach(1); err != nil {
		cfg.SendCQ.attach(-1)
		return nil, err
	}
	qp := &QP{dev: d, pd: pd, typ: cfg.Type, gid: cfg.GID, port: d.ports[cfg.GID],
		sendCQ: cfg.SendCQ, recvCQ: cfg.RecvCQ, srq: cfg.SRQ, cfg: cfg}
	qp.newKeys()
	qp.startPSN = mrand.Uint32() & psn.Mask
	qp.req.init(&cfg)
	qp.resp.cur.recv.segs = make([][]byte, 0, cfg.MaxRecvSGE)
	if cfg.SRQ == nil {
		qp.rq = newRecvQueue(pd, cfg.MaxRecvWR, cfg.MaxRecvSGE)
	}
	qp.timer = time.AfterFunc(time.Hour, qp.onTimer)
	qp.timer.Stop()
	qp.ackTimer = time.AfterFunc(time.Hour, qp.onAckTimer)
	qp.ackTimer.Stop()

	d.mu.Lock()
	qps := *d.qps.Load()
	for qp.num < 2 || qps[qp.num] != nil {
		qp.num = mrand.Uint32() & psn.Mask
	}
	cow(d, &d.qps, func(m map[uint32]*QP) { m[qp.num] = qp })
	d.mu.Unlock()
	qp.full = fmt.Errorf("verbs: QP %d: post send: %w", qp.num, ErrQueueFull)
	pd.mu.Lock()
	pd.qps++
	pd.mu.Unlock()
	return qp, nil
}

// newKeys chooses what packets sent to the QP must prove: the secret, and
// on a UDP port the MAC key (a new one per connection, so that a MAC's
// nonces, the sender's counters, never repeat under one key).
func (qp *QP) newKeys() {
	qp.localSecret = randomSecret()
	qp.rxMAC, qp.localMACKey = nil, [16]byte{}
	if qp.dev.kinds[qp.gid] == ProviderUDP && !qp.dev.noMAC {
		rand.Read(qp.localMACKey[:])
		qp.rxMAC = wire.NewMAC(qp.localMACKey)
	}
	qp.replay.Reset()
}

func randomSecret() uint64 {
	var b [8]byte
	rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:]) | 1 // never zero: zero is "unset"
}

// Num returns the QP number.
func (qp *QP) Num() uint32 { return qp.num }

// Type returns the QP's transport service.
func (qp *QP) Type() QPType { return qp.typ }

// GID returns the local address the QP is bound to.
func (qp *QP) GID() GID { return qp.dev.gids[qp.gid] }

// GIDIndex returns the index of the QP's local GID (QPConfig.GID).
func (qp *QP) GIDIndex() int { return qp.gid }

// State returns the QP's current state.
func (qp *QP) State() QPState {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	return qp.state
}

// Endpoint returns what a peer needs to connect to this QP.
func (qp *QP) Endpoint() Endpoint {
	qp.mu.Lock() // Reset chooses a new PSN and keys
	defer qp.mu.Unlock()
	return Endpoint{GID: qp.GID(), QPN: qp.num, PSN: qp.startPSN, MTU: qp.port.MaxPayload(), Secret: qp.localSecret, MACKey: qp.localMACKey}
}

// QPStats counts a QP's requester events: what a multipath layer reads to
// tell a lossy path from a clean one.
type QPStats struct {
	Timeouts uint64 // retransmission timeouts
	SeqNaks  uint64 // sequence-error NAKs (a loss the responder noticed), each a go-back
	RNRNaks  uint64 // receiver-not-ready NAKs
}

// Stats returns the QP's requester counters. It is safe to call at any
// time.
func (qp *QP) Stats() QPStats {
	return QPStats{Timeouts: qp.timeouts.Load(), SeqNaks: qp.seqNaks.Load(), RNRNaks: qp.rnrNaks.Load()}
}

// Remote returns the endpoint the QP is connected to (zero before
// ReadyToReceive).
func (qp *QP) Remote() Endpoint {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	return qp.remote
}

// PathMTU returns the negotiated path MTU (zero before ReadyToReceive).
func (qp *QP) PathMTU() int {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	return qp.mtu
}

// Init moves the QP from Reset to Init, where receives may be posted.
func (qp *QP) Init() error {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	if err := qp.usableLocked(); err != nil {
		return err
	}
	if qp.state != StateReset {
		return fmt.Errorf("verbs: QP %d: Init from %v: %w", qp.num, qp.state, ErrQPState)
	}
	qp.state = StateInit
	return nil
}

// ReadyToReceive moves the QP from Init to ReadyToReceive, connected to
// remote: from now on it accepts packets from that endpoint.
func (qp *QP) ReadyToReceive(remote Endpoint, cfg *ConnectConfig) error {
	c, err := resolveConnect(cfg)
	if err != nil {
		return err
	}
	qp.mu.Lock()
	defer qp.mu.Unlock()
	if err := qp.usableLocked(); err != nil {
		return err
	}
	if qp.state != StateInit {
		return fmt.Errorf("verbs: QP %d: ReadyToReceive from %v: %w", qp.num, qp.state, ErrQPState)
	}
	if !remote.GID.IsValid() || remote.QPN == 0 || remote.QPN > psn.Mask || remote.MTU < 256 {
		return fmt.Errorf("verbs: QP %d: %w: remote endpoint %+v", qp.num, ErrInvalidArgument, remote)
	}
	qp.remote = remote
	qp.txMAC = nil
	if remote.MACKey != ([16]byte{}) {
		qp.txMAC = wire.NewMAC(remote.MACKey)
	}
	qp.replay.Reset()
	qp.mtu = min(qp.port.MaxPayload(), remote.MTU)
	if cfg != nil && cfg.MTU > 0 {
		qp.mtu = min(qp.mtu, cfg.MTU)
	}
	if qp.mtu < 256 {
		qp.mtu = 256
	}
	c.fitWindow(qp.mtu, qp.dev.kinds[qp.gid] == ProviderUDP)
	qp.conn = c
	qp.resp.reset(remote.PSN & psn.Mask)
	qp.resp.initCache(c.maxRdAtomic)
	qp.state = StateReadyToReceive
	if x := qp.port.Exporter(); x != nil {
		x.Attach(qp.num, qp.localSecret, qp.pd.id) // a full table leaves the QP to packets
	}
	return nil
}

// detachLocked ends the peer's direct accesses on this QP's behalf (see
// fabric.Exporter.Attach): it left the ready states.
func (qp *QP) detachLocked() {
	lockcheck.AssertHeld(&qp.mu, "verbs: QP.detachLocked")
	if x := qp.port.Exporter(); x != nil && qp.state != StateReset && qp.state != StateInit {
		x.Detach(qp.num)
	}
}

// ReadyToSend moves the QP from ReadyToReceive to ReadyToSend, where sends
// may be posted. cfg's requester attributes (Timeout, MaxTimeout,
// RetryCount, RNRRetry, MaxRdAtomic, Window) apply; nil keeps those given
// to ReadyToReceive.
func (qp *QP) ReadyToSend(cfg *ConnectConfig) error {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	if err := qp.usableLocked(); err != nil {
		return err
	}
	if qp.state != StateReadyToReceive {
		return fmt.Errorf("verbs: QP %d: ReadyToSend from %v: %w", qp.num, qp.state, ErrQPState)
	}
	if cfg != nil {
		c, err := resolveConnect(cfg)
		if err != nil {
			return err
		}
		c.rnrCode = qp.conn.rnrCode
		c.fitWindow(qp.mtu, qp.dev.kinds[qp.gid] == ProviderUDP)
		qp.conn = c
	}
	qp.req.start(qp.startPSN)
	qp.req.rto.init(qp.conn.timeout, qp.conn.maxTimeout)
	qp.state = StateReadyToSend
	return nil
}

// Connect runs Init, ReadyToReceive and ReadyToSend with one configuration.
func (qp *QP) Connect(remote Endpoint, cfg *ConnectConfig) error {
	if err := qp.Init(); err != nil {
		return err
	}
	if err := qp.ReadyToReceive(remote, cfg); err != nil {
		return err
	}
	return qp.ReadyToSend(nil)
}

// MTU is the payload bytes of one packet on the connection (0 before it
// is connected): the longest OpWriteList list.
func (qp *QP) MTU() int {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	return qp.mtu
}

// Idle reports whether the QP is ready to send and every request posted
// to it has completed. On shared memory, writes, reads and atomics into a
// peer's registered memory complete as they are posted, so a caller that
// needs its unsignalled requests done (a flush) needs no fence request
// then.
func (qp *QP) Idle() bool {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	return qp.state == StateReadyToSend && qp.req.headSeq == qp.req.tailSeq
}

// SetError moves the QP to the error state: outstanding work requests
// complete with StatusFlushed and new ones are flushed at once.
func (qp *QP) SetError() error {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	if err := qp.usableLocked(); err != nil {
		return err
	}
	qp.toErrorLocked()
	return nil
}

// Reset returns the QP to Reset, discarding every queued work request
// without completions, as ibv_modify_qp to RESET does. Completions of a
// failure that wait for an outbox still holding the QP's packets (see
// QP.unflushed) are not discarded: they arrive once it is sent, ahead of
// the new connection's. The QP gets a new
// starting PSN and secret, so packets of its old connection cannot reach it.
func (qp *QP) Reset() error {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	if err := qp.usableLocked(); err != nil {
		return err
	}
	qp.stopTimerLocked()
	qp.detachLocked()
	qp.dropDeferred()
	qp.state = StateReset
	qp.remote = Endpoint{}
	qp.req.init(&qp.cfg)
	if qp.srq == nil {
		qp.rq.head, qp.rq.n = 0, 0
	}
	qp.resp.reset(0)
	qp.newKeys()
	qp.txMAC = nil
	qp.startPSN = mrand.Uint32() & psn.Mask
	return nil
}

// Destroy removes the QP. Outstanding requests are discarded without
// completions; once it returns, no packet of the QP reads their memory
// any more (so it waits for sends in progress: not from a
// MailboxHandler). Later calls return ErrClosed.
func (qp *QP) Destroy() error {
	qp.mu.Lock()
	if qp.closed {
		qp.mu.Unlock()
		return ErrClosed
	}
	// An acknowledgement still owed goes out first: the requester may
	// have nothing else to complete its last message with, and a peer
	// that is gone cannot answer its retransmission.
	var ob *outbox
	if rs := &qp.resp; (rs.delayed || rs.ackPending) && qp.typ == RC &&
		(qp.state == StateReadyToReceive || qp.state == StateReadyToSend) {
		ob = outboxPool.Get().(*outbox)
		qp.emitAck(ob, wire.SyndromeACK|0x1F, psn.Add(rs.ePSN, -1))
	}
	qp.detachLocked()
	qp.dropDeferred()
	qp.closed = true
	qp.state = StateError
	qp.resp.gen++
	qp.stopTimerLocked()
	qp.mu.Unlock()
	if ob != nil {
		ob.flush(qp.port)
		outboxPool.Put(ob)
	}
	// A first transmission built before Destroy still reads its request's
	// memory from an outbox another goroutine is sending: once Destroy
	// returns the caller may reuse that memory, as a NIC reads none
	// after ibv_destroy_qp, so wait for those sends (each is bounded: a
	// ring that stays full or a socket error drops the datagram).
	for i := 0; qp.unflushed.Load() > 0; i++ {
		spin.Pause(i)
	}
	d := qp.dev
	d.mu.Lock()
	cow(d, &d.qps, func(m map[uint32]*QP) { delete(m, qp.num) })
	d.mu.Unlock()
	qp.sendCQ.attach(-1)
	qp.recvCQ.attach(-1)
	qp.pd.mu.Lock()
	qp.pd.qps--
	qp.pd.mu.Unlock()
	return nil
}

func (qp *QP) usableLocked() error {
	lockcheck.AssertHeld(&qp.mu, "verbs: QP.usableLocked")
	if qp.closed || qp.dev.closed.Load() {
		return ErrClosed
	}
	return nil
}

func resolveConnect(cfg *ConnectConfig) (connAttrs, error) {
	var c ConnectConfig
	if cfg != nil {
		c = *cfg
	}
	a := connAttrs{timeout: c.Timeout, maxTimeout: c.MaxTimeout, retryCount: c.RetryCount, rnrRetry: c.RNRRetry,
		maxRdAtomic: c.MaxRdAtomic, window: c.Window}
	if a.timeout == 0 {
		a.timeout = 20 * time.Millisecond
	}
	if a.maxTimeout == 0 {
		a.maxTimeout = max(2*time.Second, a.timeout)
	}
	switch a.retryCount {
	case 0:
		a.retryCount = 7
	case NoRetry:
		a.retryCount = 0
	}
	switch a.rnrRetry {
	case 0:
		a.rnrRetry = 7
	case NoRetry:
		a.rnrRetry = 0
	}
	if a.maxRdAtomic == 0 {
		a.maxRdAtomic = 16
	}
	if a.window == 0 {
		a.window, a.defWindow = defaultWindow, true
	}
	rnr := c.MinRNRTimer
	if rnr == 0 {
		rnr = time.Millisecond
	}
	if a.timeout < 100*time.Microsecond || a.timeout > 10*time.Second || a.maxTimeout < a.timeout || a.maxTimeout > time.Minute ||
		a.retryCount < 0 || a.retryCount > 7 ||
		a.rnrRetry < 0 || a.rnrRetry > 7 || a.maxRdAtomic < 1 || a.maxRdAtomic > 256 ||
		a.window < 4 || a.window > 8192 || rnr < 0 {
		return a, fmt.Errorf("verbs: connect: %w: %+v", ErrInvalidArgument, c)
	}
	a.rnrCode = rnrCodeFor(rnr)
	a.ackEvery = ackEveryFor(a.window)
	a.bulk, a.bulkAckEvery = a.window, a.ackEvery
	return a, nil
}

// rnrTimes is the InfiniBand RNR NAK timer table (microseconds), by code.
var rnrTimes = [32]uint32{655360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920,
	2560, 3840, 5120, 7680, 10240, 15360, 20480, 30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520}

func rnrCodeFor(d time.Duration) uint8 {
	us := uint32(d / time.Microsecond)
	for c := 1; c < 32; c++ {
		if rnrTimes[c] >= us {
			return uint8(c)
		}
	}
	return 0
}

func rnrDuration(code uint8) time.Duration {
	return time.Duration(rnrTimes[code&31]) * time.Microsecond
}

// PostSend posts send work requests. It returns how many were accepted
// before the first error. Requests that fail during execution (bad keys,
// remote errors) report through completions, not here.
//
// In the error state, requests are accepted and flushed at once, as in
// ibverbs; in Reset, Init and ReadyToReceive PostSend returns ErrQPState.
func (qp *QP) PostSend(wrs []SendWR) (int, error) {
	ob := outboxPool.Get().(*outbox)
	qp.mu.Lock()
	n, err := qp.postSendLocked(wrs, ob)
	switch {
	case n > 0 && n == len(wrs) && wrs[n-1].Flags&FlagDefer != 0 && qp.state == StateReadyToSend &&
		len(qp.deferred)+len(ob.pkts) < DeferMax && !ob.readsMemory():
		// Everything this post built waits too, behind the earlier
		// deferred packets (progressSend put those ahead of new ones).
		qp.deferred = append(qp.deferred, ob.pkts...)
		clear(ob.pkts)
		ob.pkts = ob.pkts[:0]
	case len(qp.deferred) > 0 && qp.state == StateReadyToSend:
		// A post without FlagDefer (or a full batch) sends them.
		qp.sendDeferred(ob, 0)
	}
	qp.mu.Unlock()
	ob.flush(qp.port)
	outboxPool.Put(ob)
	return n, err
}

func (qp *QP) postSendLocked(wrs []SendWR, ob *outbox) (int, error) {
	lockcheck.AssertHeld(&qp.mu, "verbs: QP.postSendLocked")
	if err := qp.usableLocked(); err != nil {
		return 0, err
	}
	switch qp.state {
	case StateReadyToSend, StateError:
	default:
		return 0, fmt.Errorf("verbs: QP %d: post send in %v: %w", qp.num, qp.state, ErrQPState)
	}
	r := &qp.req
	n, err := len(wrs), error(nil)
	for i := range wrs {
		wr := &wrs[i]
		if err = qp.validateSend(wr); err != nil {
			n = i
			break
		}
		if r.full() {
			n, err = i, qp.full
			break
		}
		if qp.placed == 0 && wr.Opcode == OpMailboxWrite {
			qp.placed = qp.placeBatch(wrs[i:])
		}
		w := r.push()
		qp.fillWQE(w, wr)
		if !w.local && !w.placed {
			r.pending++
		}
		if qp.state == StateError {
			r.pop()
			qp.completeSend(w, StatusFlushed, 0, true)
		}
	}
	if qp.placed != 0 {
		// placeBatch takes only requests this loop accepts.
		panic(fmt.Sprintf("verbs: QP %d: %d placed mailbox writes not posted", qp.num, qp.placed))
	}
	// What was accepted goes out even when a later request was refused
	// (a full queue): the caller waits for room that only these make.
	if n > 0 && qp.state == StateReadyToSend {
		for r.txSeq < r.tailSeq && r.at(r.txSeq).local {
			r.txSeq++ // executed directly: nothing to send
		}
		// Requests executed directly complete first: a request that
		// failed at post time behind them is then at the head, where
		// progressSend fails the QP with its status. The other way
		// round it waited behind them, and nothing came back to look
		// again: the QP stalled with its queue full of requests.
		qp.completeDone()
		if r.txSeq < r.tailSeq {
			qp.progressSend(time.Now(), ob)
		}
	}
	return n, err
}

func (qp *QP) validateSend(wr *SendWR) error {
	if wr.Opcode < OpSend || wr.Opcode > OpWriteList {
		return fmt.Errorf("verbs: QP %d: %w: opcode %v", qp.num, ErrInvalidWR, wr.Opcode)
	}
	if qp.typ == UC && wr.Opcode.isReadLike() {
		return fmt.Errorf("verbs: QP %d: %w: %v on a UC QP", qp.num, ErrInvalidWR, wr.Opcode)
	}
	if len(wr.SGL) > qp.cfg.MaxSendSGE {
		return fmt.Errorf("verbs: QP %d: %w: %d SGEs, max %d", qp.num, ErrInvalidWR, len(wr.SGL), qp.cfg.MaxSendSGE)
	}
	if wr.Opcode == OpWriteList {
		// One packet, its list copied at post.
		if qp.typ != RC || wr.Flags&FlagInline == 0 || len(wr.Inline) > qp.mtu {
			return fmt.Errorf("verbs: QP %d: %w: a write list is inline, on RC, and at most the MTU (%d bytes; %d given)",
				qp.num, ErrInvalidWR, qp.mtu, len(wr.Inline))
		}
		return nil
	}
	if wr.Flags&FlagInline != 0 {
		if wr.Opcode.isReadLike() {
			return fmt.Errorf("verbs: QP %d: %w: inline %v", qp.num, ErrInvalidWR, wr.Opcode)
		}
		if len(wr.Inline) > qp.cfg.MaxInline {
			return fmt.Errorf("verbs: QP %d: %w: inline data %d bytes, max %d", qp.num, ErrInvalidWR, len(wr.Inline), qp.cfg.MaxInline)
		}
	}
	if wr.Flags&FlagUnordered != 0 && wr.Opcode != OpWrite {
		return fmt.Errorf("verbs: QP %d: %w: only a WRITE may be unordered", qp.num, ErrInvalidWR)
	}
	if wr.Opcode.isAtomic() {
		if len(wr.SGL) > 1 || len(wr.SGL) == 1 && wr.SGL[0].Length != 8 {
			return fmt.Errorf("verbs: QP %d: %w: an atomic takes one 8-byte SGE, or none", qp.num, ErrInvalidWR)
		}
		if wr.RemoteAddr%8 != 0 {
			return fmt.Errorf("verbs: QP %d: %w: atomic remote address %#x not 8-byte aligned", qp.num, ErrInvalidWR, wr.RemoteAddr)
		}
	}
	return nil
}

// fillWQE copies a work request into a send-queue slot, resolving its
// gather list; a local error is recorded and reported when the request
// reaches the head of transmission.
func (qp *QP) fillWQE(w *sendWQE, wr *SendWR) {
	w.reset()
	w.id, w.op, w.flags = wr.ID, wr.Opcode, wr.Flags
	w.signaled = qp.cfg.SignalAll || wr.Flags&FlagSignaled != 0
	w.raddr, w.rkey, w.imm = wr.RemoteAddr, wr.RKey, wr.Imm
	w.compareAdd, w.swap = wr.CompareAdd, wr.Swap
	w.mailbox, w.mboff = wr.Mailbox, wr.MailboxOffset
	if wr.Flags&FlagInline != 0 {
		w.inline = append(w.inline[:0], wr.Inline...)
		w.segs = append(w.segs, w.inline)
		w.length = len(w.inline)
	} else if qp.placed > 0 {
		// Placed already by placeBatch, which resolved the list: only
		// its length matters now.
		for _, s := range wr.SGL {
			w.length += int(s.Length)
		}
	} else {
		need := Access(0)
		if wr.Opcode.isReadLike() {
			need = AccessLocalWrite
		}
		for _, s := range wr.SGL {
			b, st := qp.pd.resolveLocal(s, need)
			if st != StatusSuccess {
				w.status = st
				break
			}
			w.segs = append(w.segs, b)
			w.length += len(b)
		}
	}
	if w.length > 1<<31 {
		w.status = StatusLocalLengthError
	}
	if w.status == StatusSuccess && qp.state == StateReadyToSend {
		qp.direct(w)
	}
	switch {
	case w.local:
		w.npsn, w.acked = 0, true
	case w.placed, w.pulled, wr.Opcode.isAtomic():
		w.npsn = 1
	default:
		w.npsn = qp.npkts(w.length)
	}
	w.firstPSN = qp.req.nextPSN
	qp.req.nextPSN = psn.Add(qp.req.nextPSN, w.npsn)
}

// pullMin is the smallest mailbox write whose payload the target pulls
// from the initiator's memory (shm) instead of receiving it through the
// ring: below it, copying twice costs less than the system call.
const pullMin = 32 << 10

// direct executes w through shared memory when the port offers it (see
// fabric.Accessor): a WRITE, READ or atomic becomes a copy (or a CPU atomic)
// by this process into or out of the peer's registered memory, done
// before PostSend returns; a WRITE with immediate also sends its
// notification. Only when nothing earlier is still to take effect at the
// target, so nothing is overtaken. Whatever the port declines (a key it
// does not know, an out-of-range address, caller memory it cannot reach)
// goes as packets, and the target's engine decides the outcome as usual.
// A mailbox write into a window whose counting state the target shares
// (see Device.ShareMailbox) is placed and counted by this process; other
// large ones leave their payload in place for the target to pull.
func (qp *QP) direct(w *sendWQE) {
	if qp.placed > 0 {
		qp.placed-- // a mailbox write placeBatch placed, with those before it
		w.local = true
		return
	}
	if w.length == 0 && w.op == OpWrite && qp.req.pending == 0 {
		// A zero-length WRITE moves nothing: its only effect is its
		// completion, behind everything posted before it, and all of
		// that has taken effect (or completes first, in order). The
		// fence callers post after direct writes costs no round trip.
		w.local = true
		return
	}
	mem := qp.port.Accessor()
	if mem == nil || w.length == 0 && !w.op.isAtomic() {
		return
	}
	dst, q := qp.remote.GID, fabric.QP{Num: qp.remote.QPN, Secret: qp.remote.Secret}
	if w.op.isMailbox() {
		// placeBatch placed what a window the target shares would take
		// (like a WRITE, only if it overtakes nothing); the rest goes as
		// packets, a large one's payload left for the target to pull.
		w.pulled = qp.typ == RC && w.length >= pullMin && len(w.segs) == 1 && w.flags&FlagInline == 0 && canPull(qp.port.Puller())
		return
	}
	if qp.req.pending != 0 && w.flags&FlagUnordered == 0 {
		return
	}
	switch w.op {
	case OpWrite, OpWriteImm:
		// On UC nothing acknowledges earlier packets: the write waits
		// until the peer has handled them.
		if mem.Write(dst, q, w.rkey, w.raddr, w.segs, qp.typ == UC) == nil {
			w.local, w.placed = w.op == OpWrite, w.op == OpWriteImm
		}
	case OpRead:
		w.local = mem.Read(dst, q, w.rkey, w.raddr, w.segs) == nil
	case OpFetchAdd, OpCompareSwap:
		swapAdd, compare := w.compareAdd, uint64(0)
		if w.op == OpCompareSwap {
			swapAdd, compare = w.swap, w.compareAdd
		}
		old, err := mem.Atomic(dst, q, w.rkey, w.raddr, w.op == OpCompareSwap, swapAdd, compare)
		if err == nil {
			var b [8]byte
			binary.LittleEndian.PutUint64(b[:], old)
			scatter(w.segs, 0, b[:])
			w.local = true
		}
	}
}

// placeBatch places the mailbox writes that start wrs, as many as follow
// one another into one mailbox, into a window the target shares, with
// one MailboxPuts (one look-up and one lock for a strided put's runs; a
// single write is a batch of one), and returns how many it placed: the post's loop then accepts them
// (direct marks them done). It takes only requests that loop accepts: valid,
// with room in the send queue, their gather lists resolved.
func (qp *QP) placeBatch(wrs []SendWR) int {
	r := &qp.req
	mem := qp.port.Accessor()
	if mem == nil || qp.state != StateReadyToSend || r.pending != 0 {
		return 0
	}
	room := r.max - int(r.tailSeq-r.headSeq)
	puts, segs := qp.boxPuts[:0], qp.boxSegs[:0]
	for i := range wrs {
		wr := &wrs[i]
		if i == room || wr.Opcode != OpMailboxWrite || wr.Mailbox != wrs[0].Mailbox || qp.validateSend(wr) != nil {
			break
		}
		start, n := len(segs), 0
		if wr.Flags&FlagInline != 0 {
			// Copied, as post copies inline data: the caller's bytes must
			// not reach the port (an interface), or every caller's inline
			// data would escape to the heap.
			at := len(qp.boxInline)
			qp.boxInline = append(qp.boxInline, wr.Inline...)
			segs, n = append(segs, qp.boxInline[at:len(qp.boxInline):len(qp.boxInline)]), len(wr.Inline)
		} else {
			ok := true
			for _, s := range wr.SGL {
				b, st := qp.pd.resolveLocal(s, 0)
				if st != StatusSuccess {
					ok = false
					break
				}
				segs, n = append(segs, b), n+len(b)
			}
			if !ok {
				break
			}
		}
		if n == 0 {
			break // moves nothing: direct leaves it to the packets
		}
		puts = append(puts, fabric.BoxPut{Offset: wr.MailboxOffset, Src: segs[start:len(segs):len(segs)]})
	}
	k := qp.mailboxPuts(mem, wrs[0].Mailbox, puts)
	clear(segs)
	qp.boxSegs, qp.boxInline = segs[:0], qp.boxInline[:0]
	return k
}

// mailboxPuts places puts (qp.boxPuts) through mem and returns how many
// it placed; it empties qp.boxPuts.
func (qp *QP) mailboxPuts(mem fabric.Accessor, mailbox uint64, puts []fabric.BoxPut) int {
	k := 0
	if len(puts) > 0 {
		k, _ = mem.MailboxPuts(qp.remote.GID, fabric.QP{Num: qp.remote.QPN, Secret: qp.remote.Secret}, mailbox, puts, qp.typ == UC)
	}
	clear(puts)
	qp.boxPuts = puts[:0]
	return k
}

// MailboxPiece is one mailbox write for PlaceMailbox: Src, gathered, lands
// at Offset of the mailbox.
type MailboxPiece struct {
	Offset uint64
	Src    [][]byte
}

// PlaceMailbox performs mailbox writes into mailbox with the CPU, in order,
// when the QP can: its port reaches the target's memory and the target
// shares the window (a shm port), the QP is ready to send, and every
// request posted before has taken effect. It returns how many it placed;
// the caller posts the rest, from the first it did not place, as
// OpMailboxWrite requests. A placed write has taken effect at the target
// when the call returns, counted as a posted one would be; it makes no
// completion, and its memory need not be registered (it is copied, as
// inline data is at post). A strided put so costs a copy per piece and
// one count, not a work request, a completion and a tracked operation per
// piece. Bad input is never placed: the requests the caller posts instead
// report it.
func (qp *QP) PlaceMailbox(mailbox uint64, pieces []MailboxPiece) int {
	mem := qp.port.Accessor()
	if mem == nil || len(pieces) == 0 {
		return 0
	}
	qp.mu.Lock()
	defer qp.mu.Unlock()
	if qp.usableLocked() != nil {
		return 0
	}
	return qp.placePieces(mem, mailbox, pieces)
}

// CanPlace reports whether PlaceMailbox may place writes: the QP's port
// reaches its peers' memory (it may still decline, for the reasons
// PlaceMailbox gives).
func (qp *QP) CanPlace() bool { return qp.port.Accessor() != nil }

// placePieces places pieces into mailbox if nothing posted before is still
// to take effect (mu held), and returns how many it placed.
func (qp *QP) placePieces(mem fabric.Accessor, mailbox uint64, pieces []MailboxPiece) int {
	if qp.state != StateReadyToSend || qp.req.pending != 0 {
		return 0
	}
	puts := qp.boxPuts[:0]
	for _, p := range pieces {
		n := 0
		for _, b := range p.Src {
			n += len(b)
		}
		if n == 0 || len(p.Src) > qp.cfg.MaxSendSGE {
			break // moves nothing, or more than a request may gather
		}
		puts = append(puts, fabric.BoxPut{Offset: p.Offset, Src: p.Src})
	}
	return qp.mailboxPuts(mem, mailbox, puts)
}

func canPull(p fabric.Puller) bool { return p != nil && p.CanPull() }

func (qp *QP) npkts(n int) int {
	if n == 0 {
		return 1
	}
	return (n + qp.mtu - 1) / qp.mtu
}

// PostRecv posts receives to the QP's own receive queue (not allowed with
// an SRQ). Receives may be posted from Init on.
func (qp *QP) PostRecv(wrs []RecvWR) (int, error) {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	if err := qp.usableLocked(); err != nil {
		return 0, err
	}
	if qp.srq != nil {
		return 0, fmt.Errorf("verbs: QP %d: post recv: %w: the QP uses an SRQ", qp.num, ErrInvalidWR)
	}
	if qp.state == StateReset {
		return 0, fmt.Errorf("verbs: QP %d: post recv in %v: %w", qp.num, qp.state, ErrQPState)
	}
	n, err := qp.rq.post(wrs)
	if qp.state == StateError {
		qp.flushRecvLocked()
	}
	return n, err
}

// completeSend reports a send request's outcome. Successful unsignaled
// requests produce no completion.
func (qp *QP) completeSend(w *sendWQE, st Status, vendor uint32, force bool) {
	if st == StatusSuccess && !w.signaled && !force {
		return
	}
	wc := WorkCompletion{WRID: w.id, Status: st, Opcode: w.op.wcOpcode(), QPN: qp.num, VendorErr: vendor}
	if st == StatusSuccess {
		wc.ByteLen = uint32(w.length)
	}
	if qp.errHeld {
		qp.heldWCs = append(qp.heldWCs, wc)
		return
	}
	if !qp.sendCQ.push(wc) && qp.state != StateError {
		qp.toErrorLocked()
	}
}

func (qp *QP) completeRecv(wc WorkCompletion) {
	wc.QPN = qp.num
	if !qp.recvCQ.push(wc) && qp.state != StateError {
		qp.toErrorLocked()
	}
}

// fail completes the request at the head of the queue with st and moves the
// QP to the error state, flushing the rest.
func (qp *QP) fail(st Status, vendor uint32) {
	qp.holdErrors()
	// Requests acknowledged before the failure succeeded, even while their
	// completions waited for an outbox (completeDone): they complete so,
	// and the status goes to the first that was not acknowledged.
	qp.completeAcked()
	if w := qp.req.head(); w != nil {
		qp.req.pop()
		qp.completeSend(w, st, vendor, true)
	}
	qp.toErrorLocked()
}

// toErrorLocked enters the error state and flushes every outstanding work
// request.
func (qp *QP) toErrorLocked() {
	lockcheck.AssertHeld(&qp.mu, "verbs: QP.toErrorLocked")
	if qp.state == StateError {
		return
	}
	qp.holdErrors()
	qp.detachLocked()
	qp.dropDeferred()
	qp.state = StateError
	qp.stopTimerLocked()
	for w := qp.req.head(); w != nil; w = qp.req.head() {
		qp.req.pop()
		qp.completeSend(w, StatusFlushed, 0, true)
	}
	qp.req.init(&qp.cfg)
	qp.flushRecvLocked()
}

// holdErrors makes the send completions that follow wait, as
// completeDone's do, while an outbox still holds first transmissions of
// this QP's requests (mu held): flushed releases them.
func (qp *QP) holdErrors() {
	if qp.errHeld || qp.unflushed.Load() == 0 {
		return
	}
	// The same handshake as completeDone's: held first, then the count.
	qp.held.Store(true)
	qp.errHeld = qp.unflushed.Load() > 0
}

// releaseErrors delivers the completions holdErrors kept (mu held; no
// outbox holds first transmissions any more: completeDone calls it).
func (qp *QP) releaseErrors() {
	if !qp.errHeld {
		return
	}
	qp.errHeld = false
	wcs := qp.heldWCs
	qp.heldWCs = nil
	for i, wc := range wcs {
		if qp.errHeld {
			// A push failed and the QP failed again while an outbox
			// holds its packets (after a Reset): the rest wait again,
			// in order, ahead of what that failure holds.
			qp.heldWCs = append(wcs[i:len(wcs):len(wcs)], qp.heldWCs...)
			return
		}
		if !qp.sendCQ.push(wc) && qp.state != StateError {
			qp.toErrorLocked()
		}
	}
}

func (qp *QP) flushRecvLocked() {
	lockcheck.AssertHeld(&qp.mu, "verbs: QP.flushRecvLocked")
	if qp.srq != nil {
		return
	}
	var w recvWQE
	for qp.rq.take(&w) {
		qp.completeRecv(WorkCompletion{WRID: w.id, Status: StatusFlushed, Opcode: WCRecv})
	}
}

// armTimer makes sure the QP's timer fires no later than at.
func (qp *QP) armTimer(at time.Time) {
	if qp.timerLive && !qp.timerAt.After(at) {
		return // fires earlier; it re-arms itself then
	}
	qp.timerAt, qp.timerLive = at, true
	qp.timer.Reset(time.Until(at))
}

func (qp *QP) stopTimerLocked() {
	lockcheck.AssertHeld(&qp.mu, "verbs: QP.stopTimerLocked")
	qp.timer.Stop()
	qp.timerLive = false
	qp.ackTimer.Stop()
	qp.resp.ackTimerLive, qp.resp.delayed = false, false
}

func (qp *QP) onTimer() {
	ob := outboxPool.Get().(*outbox)
	qp.mu.Lock()
	qp.timerLive = false
	if !qp.closed && qp.state == StateReadyToSend {
		qp.checkTimers(time.Now(), ob)
	}
	qp.mu.Unlock()
	ob.flush(qp.port)
	outboxPool.Put(ob)
}

// newPacket starts a packet to the connected peer.
func (qp *QP) newPacket(op wire.Opcode, p uint32) *wire.Packet {
	pk := wire.Get()
	pk.Src, pk.Dst = qp.dev.gids[qp.gid], qp.remote.GID
	pk.Opcode, pk.DestQP, pk.PSN, pk.Secret, pk.Auth = op, qp.remote.QPN, p, qp.remote.Secret, qp.txMAC
	return pk
}
