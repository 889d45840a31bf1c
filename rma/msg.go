package rma

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rvma/rvma/internal/progress"
	"github.com/rvma/rvma/internal/spin"
	"github.com/rvma/rvma/verbs"
)

// Messages are SENDs of at most chunk bytes (header included) into the
// receive pool that every connection of a Comm shares (an SRQ). A larger
// message travels as fragments posted back to back on one QP, so RC
// ordering reassembles them.
const (
	chunk     = 64 << 10
	hdrLen    = 16
	fragMax   = chunk - hdrLen
	recvSlots = 128
	maxSGE    = 32
	maxMsg    = 1 << 30 // the largest message reassembled; larger ones are dropped
)

// Message kinds.
const (
	kindMsg      = 1 // point-to-point and collective data, matched by (source, tag)
	kindAM       = 2 // an active message for a window (accumulate, fetch-op, strided put)
	kindAMReply  = 3 // its reply
	kindPing     = 4 // a liveness probe from a rank waiting for a message: ignored
	kindDynAM    = 5 // an active message for a dynamic window (dynamic.go); its reply is a kindAMReply
	userTagLimit = 1 << 30
)

// recvPool is the registered memory behind the SRQ's receive slots. Set
// by init, then read-only; a slot's bytes belong to its posted receive,
// then to OnRecv until it reposts the slot.
type recvPool struct {
	mem []byte
	mr  *verbs.MR
	srq *verbs.SRQ
}

func (p *recvPool) init(pd *verbs.PD, srq *verbs.SRQ) error {
	p.mem = make([]byte, recvSlots*chunk)
	mr, err := pd.RegisterMR(p.mem, verbs.AccessLocalWrite)
	if err != nil {
		return err
	}
	p.mr, p.srq = mr, srq
	wrs := make([]verbs.RecvWR, recvSlots)
	for i := range wrs {
		wrs[i] = verbs.RecvWR{ID: uint64(i), SGL: []verbs.SGE{mr.SGE(i*chunk, chunk)}}
	}
	_, err = srq.PostRecv(wrs)
	return err
}

func (p *recvPool) slot(i uint64) []byte { return p.mem[i*chunk : (i+1)*chunk] }

func (p *recvPool) repost(i uint64) {
	p.srq.PostRecv([]verbs.RecvWR{{ID: i, SGL: []verbs.SGE{p.mr.SGE(int(i)*chunk, chunk)}}})
}

// sendBuf is a registered staging buffer for one outgoing fragment: b,
// which lies at off in mr.
type sendBuf struct {
	b   []byte
	mr  *verbs.MR
	off int
}

func (s sendBuf) sge(n int) verbs.SGE { return s.mr.SGE(s.off, n) }

// Send buffers come in two sizes, carved from slabs registered at once:
// a flood of small messages (an accumulate or a get's answer each) may
// wait in a backlog by the thousand, and a 64 KiB chunk each, registered
// one by one, cost a RegisterMR per message (which copies the device's
// key map) and megabytes held for 16 bytes each.
const (
	smallBuf  = 256            // header included
	smallSlab = 256 * smallBuf // 64 KiB: 256 small buffers
	chunkSlab = 4 * chunk      // 256 KiB: 4 chunks
)

// sendPool holds registered staging buffers for outgoing messages.
type sendPool struct {
	mu   sync.Mutex // guards free, made and held; innermost (see Comm)
	free [2][]sendBuf
	made int // buffers carved, free or not
	held int // bytes registered
}

// get returns a buffer of at least n bytes (n <= chunk).
func (s *sendPool) get(pd *verbs.PD, n int) (sendBuf, error) {
	class, size, slab := 1, chunk, chunkSlab
	if n <= smallBuf {
		class, size, slab = 0, smallBuf, smallSlab
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if k := len(s.free[class]); k > 0 {
		b := s.free[class][k-1]
		s.free[class] = s.free[class][:k-1]
		return b, nil
	}
	mem := make([]byte, slab)
	mr, err := pd.RegisterMR(mem, verbs.AccessLocalWrite)
	if err != nil {
		return sendBuf{}, err
	}
	s.made += slab / size
	s.held += slab
	for off := slab - size; off > 0; off -= size {
		s.free[class] = append(s.free[class], sendBuf{b: mem[off : off+size : off+size], mr: mr, off: off})
	}
	return sendBuf{b: mem[:size:size], mr: mr}, nil
}

func (s *sendPool) put(b sendBuf) {
	s.mu.Lock()
	class := 1
	if len(b.b) == smallBuf {
		class = 0
	}
	s.free[class] = append(s.free[class], b)
	s.mu.Unlock()
}

type inboxKey struct {
	src int
	tag uint32
}

// msgState is the receive side's matching state.
type msgState struct {
	// Guarded by the engine's lock: receivers take messages from inbox
	// in Wait conditions, OnRecv adds them in Locked.
	inbox map[inboxKey][][]byte
	// The arrival numbers of the user messages (tags below userTagLimit)
	// in inbox, queue for queue: 1, 2, ... in the order they completed at
	// this rank, which orders messages of different keys for wildcard
	// receives. arrived counts every message put into inbox.
	seqs    map[inboxKey][]uint64
	arrived uint64
	am      map[uint64]*amCall // outstanding active messages by request id
	// amOut counts, per target, the window operations' active messages
	// in am (not the free ones): amCall keeps it below amMax.
	amOut  []int
	nextAM uint64

	// partial is owned by OnRecv, which the poller role runs one
	// completion at a time: no lock.
	partial map[int]*partialMsg // per source: the message being reassembled

	send sendPool // its own lock (taken under the engine's, in OnDone)
}

type partialMsg struct {
	kind byte
	tag  uint32
	buf  []byte
	got  int
}

func (m *msgState) init(size int) {
	m.amOut = make([]int, size)
	m.inbox = map[inboxKey][][]byte{}
	m.seqs = map[inboxKey][]uint64{}
	m.partial = map[int]*partialMsg{}
	m.am = map[uint64]*amCall{}
}

// cqCapacity is each Comm's CQ's capacity (a variable for tests, which
// lower it to overrun it sooner).
var cqCapacity = 1 << 16

// cqDrainAt is the number of completions waiting in the CQ from which a
// post takes them itself: a quarter of its capacity.
func cqDrainAt() int { return cqCapacity / 4 }

// post posts wrs on qp, progressing the device while its send queue is
// full. It waits for no Op, so it may run in the receive handler: where
// completions pile up it takes them, or lets the goroutine polling take
// them (see progress.Engine.Drain).
func (c *Comm) post(qp *verbs.QP, wrs []verbs.SendWR) (int, error) {
	done := 0
	for i := 0; done < len(wrs); i++ {
		n, err := qp.PostSend(wrs[done:])
		done += n
		if err != nil && (!isQueueFull(err) || c.closed()) {
			return done, err
		}
		// Completions pile up when nothing waits (a stream of
		// FetchAndOps with no flush, as MPI allows, or gets of a hundred
		// thousand blocks): take them before the CQ overruns, after every
		// post, also one the full send queue cut short (each of those
		// adds the completions that made room for it: MPICH's getfence1
		// overran the CQ so).
		c.eng.Drain(cqDrainAt())
		if err != nil {
			c.dev.Progress()
			spin.Pause(i)
		}
	}
	return done, nil
}

// sendMsg sends one message of kind to rank dst and returns the Op that
// finishes when every fragment has been acknowledged.
// onSent, if not nil, runs under the engine's lock when the message has
// been acknowledged or has failed.
func (c *Comm) sendMsg(ctx context.Context, dst int, kind byte, tag uint32, data []byte, onSent func(error)) (*progress.Op, error) {
	return c.sendMsgMode(ctx, dst, kind, tag, gather{data}, onSent, false)
}

// sendMsgNoWait is sendMsg for the poller, and for what may run in it:
// where the send queue has no room, the message waits in the peer's
// backlog instead of the caller waiting for room. The poller must not
// wait: the room comes from the peer's acknowledgements, which need
// receive buffers that the peer's poller reposts, and the peer's poller
// may itself be sending to this rank (two ranks answering each other's
// active messages). The Op reports a failure to post later, as a send's.
func (c *Comm) sendMsgNoWait(dst int, kind byte, tag uint32, data []byte, onSent func(error)) (*progress.Op, error) {
	return c.sendMsgMode(context.Background(), dst, kind, tag, gather{data}, onSent, true)
}

// gather is a message's bytes in pieces (a header and the caller's data),
// copied straight into the send buffers rather than joined first.
type gather [][]byte

func (g gather) len() int {
	n := 0
	for _, p := range g {
		n += len(p)
	}
	return n
}

// copyAt fills dst with g's bytes from offset off.
func (g gather) copyAt(dst []byte, off int) {
	for _, p := range g {
		if off >= len(p) {
			off -= len(p)
			continue
		}
		n := copy(dst, p[off:])
		dst, off = dst[n:], 0
		if len(dst) == 0 {
			return
		}
	}
}

// fillFrag writes into b the fragment of a message of size bytes that
// holds n bytes of data from offset off: its header, then the bytes.
func fillFrag(b []byte, kind byte, tag uint32, data gather, size, off, n int) {
	b[0] = kind
	binary.LittleEndian.PutUint32(b[4:], tag)
	binary.LittleEndian.PutUint32(b[8:], uint32(size))
	binary.LittleEndian.PutUint32(b[12:], uint32(off))
	data.copyAt(b[hdrLen:hdrLen+n], off)
}

// sendMsgMode sends data as one message; it copies data before it returns.
func (c *Comm) sendMsgMode(ctx context.Context, dst int, kind byte, tag uint32, data gather, onSent func(error), noWait bool) (*progress.Op, error) {
	qp, err := c.conn(ctx, dst)
	if err != nil {
		return nil, err
	}
	size := data.len()
	nfrag := max(1, (size+fragMax-1)/fragMax)
	if nfrag == 1 && !noWait {
		return c.sendOne(qp, dst, kind, tag, data, size, onSent)
	}
	bufs := make([]sendBuf, 0, nfrag)
	op, base := c.eng.Start(nfrag, func(err error) {
		for _, b := range bufs {
			c.msg.send.put(b)
		}
		if onSent != nil {
			onSent(err)
		}
	})
	wrs := make([]verbs.SendWR, nfrag)
	for i := range nfrag {
		off := i * fragMax
		n := min(fragMax, size-off)
		sb, err := c.msg.send.get(c.pd, hdrLen+n)
		if err != nil {
			c.eng.Posted(op, base, nfrag, 0, err)
			return nil, err
		}
		bufs = append(bufs, sb)
		fillFrag(sb.b, kind, tag, data, size, off, n)
		wrs[i] = verbs.SendWR{ID: base + uint64(i), Opcode: verbs.OpSend, Flags: verbs.FlagSignaled,
			SGL: []verbs.SGE{sb.sge(hdrLen + n)}}
	}
	p := c.peers[dst]
	if noWait {
		c.postNoWait(p, backlogged{qp: qp, op: op, wrs: wrs})
		return op, nil
	}
	p.sendMu.Lock()
	c.flushBacklog(p, true) // the messages before this one go first
	k, err := c.post(qp, wrs)
	c.unlockSend(p)
	if err != nil {
		c.eng.Posted(op, base, nfrag, k, err)
		if k == 0 {
			return nil, opErr("send", dst, err)
		}
	}
	return op, nil
}

// sendJob is a one-fragment message's state while it is sent: pooled, so
// that a small message allocates only its Op (a message on the backlog,
// whose work request outlives the call, takes sendMsgMode's general way).
type sendJob struct {
	c      *Comm
	buf    sendBuf
	onSent func(error)
	done   func(error) // j.finish, bound once: a method value allocates
	wr     [1]verbs.SendWR
	sge    [1]verbs.SGE
	// refs: the send's completion and sendOne's return each let go of j;
	// the message may complete (on the engine's goroutine) while
	// PostSend still reads wr.
	refs atomic.Int32
}

var sendJobs sync.Pool // of *sendJob

func init() {
	// In init: New refers to finish, which puts into the pool.
	sendJobs.New = func() any {
		j := new(sendJob)
		j.done = j.finish
		return j
	}
}

// finish returns j's buffer, lets go of j and tells the caller.
func (j *sendJob) finish(err error) {
	j.c.msg.send.put(j.buf)
	onSent := j.onSent
	j.release()
	if onSent != nil {
		onSent(err)
	}
}

// release returns j to its pool once both its holders let go.
func (j *sendJob) release() {
	if j.refs.Add(-1) == 0 {
		j.c, j.buf, j.onSent, j.wr[0], j.sge[0] = nil, sendBuf{}, nil, verbs.SendWR{}, verbs.SGE{}
		sendJobs.Put(j)
	}
}

// sendOne is sendMsgMode for a message of one fragment, posted now. If
// no send buffer can be had it returns the error without calling onSent
// (its callers handle the error they are returned).
func (c *Comm) sendOne(qp *verbs.QP, dst int, kind byte, tag uint32, data gather, size int, onSent func(error)) (*progress.Op, error) {
	sb, err := c.msg.send.get(c.pd, hdrLen+size)
	if err != nil {
		return nil, err
	}
	j := sendJobs.Get().(*sendJob)
	j.c, j.buf, j.onSent = c, sb, onSent
	j.refs.Store(2)
	op, base := c.eng.Start(1, j.done)
	fillFrag(sb.b, kind, tag, data, size, 0, size)
	// PostSend resolves the list into the buffer's bytes and keeps no
	// reference to the request once it returns.
	j.sge[0] = sb.sge(hdrLen + size)
	j.wr[0] = verbs.SendWR{ID: base, Opcode: verbs.OpSend, Flags: verbs.FlagSignaled, SGL: j.sge[:]}
	p := c.peers[dst]
	p.sendMu.Lock()
	c.flushBacklog(p, true) // the messages before this one go first
	k, err := c.post(qp, j.wr[:])
	c.unlockSend(p)
	j.release()
	if err != nil {
		c.eng.Posted(op, base, 1, k, err)
		if k == 0 {
			return nil, opErr("send", dst, err)
		}
	}
	return op, nil
}

// backlogged is a message whose work requests (their IDs consecutive,
// from wrs[0].ID) are not posted yet, and its Op.
type backlogged struct {
	qp  *verbs.QP
	op  *progress.Op
	wrs []verbs.SendWR
}

// postNoWait posts m behind p's backlog as far as the send queue has
// room, and leaves the rest in the backlog; it never waits, for room nor
// for p.sendMu. m joins the backlog before p.sendMu is tried, so that a
// holder of p.sendMu, which looks at the backlog after it lets go
// (unlockSend), sends m if this goroutine cannot; otherwise m could wait
// for the next probe tick.
func (c *Comm) postNoWait(p *peer, m backlogged) {
	p.queue(m)
	if p.sendMu.TryLock() {
		if !c.flushBacklog(p, false) {
			c.retryBacklogs() // no room: completions make it, or the retry
		}
		c.unlockSend(p)
	}
}

// backlogRetry is how soon a backlog is tried again when the send queue
// had no room for it.
const backlogRetry = 100 * time.Microsecond

// retryBacklogs notes that a backlog waits for room in a send queue, and
// arms a retry: room that unsignalled requests free (a notified window's
// credit writes) completes nothing, so no poll would post the backlog
// before the next probe tick, a second later. A credit answer waited so.
func (c *Comm) retryBacklogs() {
	c.backlogs.Store(true)
	if c.retrying.CompareAndSwap(false, true) {
		time.AfterFunc(backlogRetry, func() {
			c.retrying.Store(false)
			if !c.closed() {
				c.flushBacklogs()
			}
		})
	}
}

// unlockSend lets go of p.sendMu, then posts what joined p's backlog
// meanwhile, if no one else holds the lock (who then will). What the send
// queue has no room for waits for completions (flushBacklogs).
func (c *Comm) unlockSend(p *peer) {
	for {
		p.sendMu.Unlock()
		if !p.backlogged() || !p.sendMu.TryLock() {
			return
		}
		if !c.flushBacklog(p, false) {
			p.sendMu.Unlock()
			c.retryBacklogs()
			return
		}
	}
}

// backlogged reports whether p's backlog holds messages.
func (p *peer) backlogged() bool {
	p.backlogMu.Lock()
	defer p.backlogMu.Unlock()
	return len(p.backlog) > 0
}

// queue appends m to p's backlog.
func (p *peer) queue(m backlogged) {
	p.backlogMu.Lock()
	p.backlog = append(p.backlog, m)
	p.backlogMu.Unlock()
}

// postSome posts what the send queue has room for of m's work requests;
// if not all, it returns the rest and false. A failure other than a full
// queue fails the rest of m's Op.
func (c *Comm) postSome(m backlogged) (backlogged, bool) {
	k, err := m.qp.PostSend(m.wrs)
	switch {
	case err == nil && k == len(m.wrs):
		return m, true
	case err == nil || isQueueFull(err):
		m.wrs = m.wrs[k:]
		return m, false
	}
	c.eng.Posted(m.op, m.wrs[0].ID, len(m.wrs), k, err)
	return m, true
}

// flushBacklog posts p's backlog in order, waiting for room if wait, else
// as far as there is room; it reports whether the backlog is empty.
// p.sendMu is held.
func (c *Comm) flushBacklog(p *peer, wait bool) bool {
	for {
		p.backlogMu.Lock()
		if len(p.backlog) == 0 {
			p.backlogMu.Unlock()
			return true
		}
		m := p.backlog[0]
		p.backlogMu.Unlock()
		done := true
		if wait {
			if k, err := c.post(m.qp, m.wrs); err != nil {
				c.eng.Posted(m.op, m.wrs[0].ID, len(m.wrs), k, err)
			}
		} else if m, done = c.postSome(m); !done {
			p.backlogMu.Lock()
			p.backlog[0] = m
			p.backlogMu.Unlock()
			return false
		}
		p.backlogMu.Lock()
		p.backlog[0] = backlogged{}
		p.backlog = p.backlog[1:]
		p.backlogMu.Unlock()
	}
}

// flushBacklogs posts what the peers' backlogs have room for (in the
// poller after completions freed send queue slots, and at each probe
// tick); it never waits.
func (c *Comm) flushBacklogs() {
	if !c.backlogs.Load() {
		return
	}
	c.backlogs.Store(false)
	for _, p := range c.peers {
		if !p.backlogged() || !p.sendMu.TryLock() {
			continue // its holder posts the backlog when it lets go
		}
		if !c.flushBacklog(p, false) {
			c.retryBacklogs()
		}
		c.unlockSend(p)
	}
}

// onRecv handles one receive completion (in the engine's poller).
func (c *Comm) onRecv(wc *verbs.WorkCompletion) {
	if wc.Status != verbs.StatusSuccess {
		// Flushed receives of a broken connection: the slot returns to the
		// pool unless the device is going away.
		if wc.Status == verbs.StatusFlushed && !c.closed() {
			c.recv.repost(wc.WRID)
		}
		return
	}
	defer c.recv.repost(wc.WRID)
	src, ok := c.peerOf(wc.QPN)
	if !ok || wc.ByteLen < hdrLen {
		return
	}
	b := c.recv.slot(wc.WRID)[:wc.ByteLen]
	kind, tag := b[0], binary.LittleEndian.Uint32(b[4:])
	total, off := int(binary.LittleEndian.Uint32(b[8:])), int(binary.LittleEndian.Uint32(b[12:]))
	frag := b[hdrLen:]
	var whole []byte
	switch {
	case off == 0 && len(frag) == total:
		whole = frag // not copied: handled before the slot is reposted
	default:
		pm := c.msg.partial[src]
		if off == 0 && total > maxMsg {
			c.cfg.Logger.Warn("rma: message too large", "rank", c.rank, "src", src, "bytes", total)
			return
		}
		if off == 0 {
			pm = &partialMsg{kind: kind, tag: tag, buf: make([]byte, total)}
			c.msg.partial[src] = pm
		}
		if pm == nil || off+len(frag) > len(pm.buf) || pm.tag != tag || pm.kind != kind {
			c.cfg.Logger.Warn("rma: fragment out of sequence", "rank", c.rank, "src", src)
			return
		}
		copy(pm.buf[off:], frag)
		pm.got += len(frag)
		if pm.got < len(pm.buf) {
			return
		}
		delete(c.msg.partial, src)
		whole = pm.buf
	}
	switch kind {
	case kindMsg:
		if c.staleTag(tag) {
			return // of a collective a recovery interrupted
		}
		if len(whole) > 0 && &whole[0] == &frag[0] {
			whole = append([]byte(nil), whole...)
		} else if whole == nil {
			whole = []byte{}
		}
		c.eng.Locked(func() {
			k := inboxKey{src, tag}
			c.msg.arrived++
			c.msg.inbox[k] = append(c.msg.inbox[k], whole)
			if tag < userTagLimit {
				c.msg.seqs[k] = append(c.msg.seqs[k], c.msg.arrived)
			}
		})
	case kindAM:
		c.handleAM(src, whole)
	case kindAMReply:
		c.handleAMReply(whole)
	case kindDynAM:
		c.handleDynAM(src, whole)
	}
}

// probeEvery is how long recvMsg waits for a peer before it probes it: a
// receiver alone never learns that its sender died (nothing it sends can
// fail), so after a while it sends something that can.
const probeEvery = time.Second

// wakeProbes counts ticks of probeEvery and wakes the engine's waiters
// at each, so that receives waiting for a silent peer notice that a probe
// is due: one ticker a Comm rather than a timer a receive.
func (c *Comm) wakeProbes() {
	every := probeEvery
	if c.cfg.probeEvery > 0 {
		every = c.cfg.probeEvery
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			c.ticks.Add(1)
			c.flushBacklogs() // room freed by unsignalled requests completes nothing
			c.eng.Wake()
		case <-c.done:
			return
		}
	}
}

// recvMsg waits for the next message from src with tag. While it waits it
// probes src every probeEvery with a ping, so that a dead peer fails the
// connection (RC gives up after its retransmission timeouts) and the wait
// with ErrPeer, in bounded time.
func (c *Comm) recvMsg(ctx context.Context, src int, tag uint32) ([]byte, error) {
	k := inboxKey{src, tag}
	var got []byte
	_, err := c.waitMsg(ctx, src, func() bool {
		if len(c.msg.inbox[k]) == 0 {
			return false
		}
		got = c.msg.pop(k)
		return true
	})
	if err != nil {
		return nil, err
	}
	return got, nil
}

// pop removes and returns the first message of key k (under the engine's
// lock; there is one), and its arrival number if it has one.
func (m *msgState) pop(k inboxKey) []byte {
	q := m.inbox[k]
	got := q[0]
	if len(q) == 1 {
		delete(m.inbox, k)
	} else {
		m.inbox[k] = q[1:]
	}
	if s := m.seqs[k]; len(s) == 1 {
		delete(m.seqs, k)
	} else if len(s) > 1 {
		m.seqs[k] = s[1:]
	}
	return got
}

// waitMsg waits until take (run under the engine's lock) has taken a
// message; src is the rank it waits for, which it probes as recvMsg says,
// or AnySource (no probes: any rank may send). It returns src.
func (c *Comm) waitMsg(ctx context.Context, src int, take func() bool) (int, error) {
	// A rank's death, announced by the launcher, ends the wait.
	ctx, in := c.interruptible(ctx)
	defer in.end()
	var got bool
	broken, probe := false, false
	var err error
	// A probe is due once two ticks of wakeProbes have passed: between
	// probeEvery and twice that, without reading the clock in the wait.
	due := c.ticks.Load() + 2
	for {
		err = c.eng.Wait(ctx, func() bool {
			if take() {
				got = true
				return true
			}
			if src == AnySource {
				return false
			}
			// Nothing more can come over a broken connection.
			broken = c.broken(src)
			probe = !broken && c.ticks.Load() >= due
			return broken || probe
		})
		if err != nil || !probe || got {
			break
		}
		probe, due = false, c.ticks.Load()+2
		if src != c.rank {
			if _, perr := c.sendMsg(ctx, src, kindPing, 0, nil, nil); perr != nil {
				err = fmt.Errorf("%w: %w", ErrPeer, perr)
				break
			}
		}
	}
	if err == nil && broken && !got {
		err = fmt.Errorf("%w: its connection failed", ErrPeer)
	}
	err = in.err(err)
	if err != nil {
		if errors.Is(err, ErrPeer) {
			c.troubled.Store(true)
		}
		return src, opErr("receive", src, err)
	}
	return src, nil
}

// broken reports whether the connection to rank r has failed.
func (c *Comm) broken(r int) bool {
	p := c.peers[r]
	p.mu.Lock()
	qp := p.qp
	p.mu.Unlock()
	return qp != nil && qp.State() == verbs.StateError
}

// Request is a non-blocking operation in flight.
type Request struct {
	op   *progress.Op
	name string
	rank int
}

// Wait blocks until the operation has completed or ctx ends.
func (r *Request) Wait(ctx context.Context) error {
	if err := r.op.Wait(ctx); err != nil {
		return opErr(r.name, r.rank, err)
	}
	return nil
}

// Test reports whether the operation has completed, without blocking.
func (r *Request) Test() (bool, error) {
	done, err := r.op.Test()
	if !done {
		return false, nil
	}
	if err != nil {
		return true, opErr(r.name, r.rank, err)
	}
	return true, nil
}

// WaitAll waits for every request.
func WaitAll(ctx context.Context, reqs ...*Request) error {
	for _, r := range reqs {
		if r == nil {
			continue
		}
		if err := r.Wait(ctx); err != nil {
			return err
		}
	}
	return nil
}

func checkTag(tag int) error {
	if tag < 0 || tag >= userTagLimit {
		return fmt.Errorf("%w: tag %d outside 0..%d", ErrSync, tag, userTagLimit-1)
	}
	return nil
}

// Isend starts sending data to rank dst with a tag (0 <= tag < 2^30). The
// data is copied before Isend returns; the Request completes when the
// destination has it.
func (c *Comm) Isend(ctx context.Context, dst, tag int, data []byte) (*Request, error) {
	if err := c.checkRank("send", dst); err != nil {
		return nil, err
	}
	if err := checkTag(tag); err != nil {
		return nil, opErr("send", dst, err)
	}
	op, err := c.sendMsg(ctx, dst, kindMsg, uint32(tag), data, nil)
	if err != nil {
		return nil, opErr("send", dst, err)
	}
	return &Request{op: op, name: "send", rank: dst}, nil
}

// Send sends data to rank dst and waits until it has arrived.
func (c *Comm) Send(ctx context.Context, dst, tag int, data []byte) error {
	r, err := c.Isend(ctx, dst, tag, data)
	if err != nil {
		return err
	}
	return r.Wait(ctx)
}

// Recv waits for the next message from rank src with tag and returns it
// (messages from one source with one tag arrive in send order). The
// returned slice belongs to the caller.
func (c *Comm) Recv(ctx context.Context, src, tag int) ([]byte, error) {
	if err := c.checkRank("receive", src); err != nil {
		return nil, err
	}
	if err := checkTag(tag); err != nil {
		return nil, opErr("receive", src, err)
	}
	return c.recvMsg(ctx, src, uint32(tag))
}

// AnySource, as RecvMatch's and TryRecvMatch's source, matches every
// rank.
const AnySource = -1

// Message is a message taken by RecvMatch or TryRecvMatch: its data
// (the caller's), source and tag.
type Message struct {
	Data        []byte
	Source, Tag int
}

// Match selects the messages a wildcard receive may take: from Source (or
// AnySource) with a tag t such that t&Mask == Tag&Mask (Mask ^0: exactly
// Tag; 0: any tag) and, unless Before is 0, an arrival number below
// Before (see Arrived).
type Match struct {
	Source, Tag int
	Mask        uint32
	Before      uint64
}

// find returns the key of the earliest-arrived message x matches (under
// the engine's lock).
func (m *msgState) find(x Match) (inboxKey, bool) {
	var best inboxKey
	var bestSeq uint64
	for k, q := range m.seqs {
		if (x.Source != AnySource && k.src != x.Source) || k.tag&x.Mask != uint32(x.Tag)&x.Mask ||
			(x.Before != 0 && q[0] >= x.Before) {
			continue
		}
		if bestSeq == 0 || q[0] < bestSeq {
			best, bestSeq = k, q[0]
		}
	}
	return best, bestSeq != 0
}

// take removes and returns the earliest-arrived message x matches (under
// the engine's lock).
func (m *msgState) take(x Match) (Message, bool) {
	k, ok := m.find(x)
	if !ok {
		return Message{}, false
	}
	return Message{Data: m.pop(k), Source: k.src, Tag: int(k.tag)}, true
}

// peek describes the message take would return, leaving it in place
// (under the engine's lock).
func (m *msgState) peek(x Match) (Envelope, bool) {
	k, ok := m.find(x)
	if !ok {
		return Envelope{}, false
	}
	return Envelope{Source: k.src, Tag: int(k.tag), Len: len(m.inbox[k][0])}, true
}

func (c *Comm) checkMatch(x Match) error {
	if x.Source != AnySource {
		if err := c.checkRank("receive", x.Source); err != nil {
			return err
		}
	}
	if err := checkTag(x.Tag); err != nil {
		return opErr("receive", x.Source, err)
	}
	return nil
}

// RecvMatch waits for the earliest-arrived message x matches (MPI's
// MPI_ANY_SOURCE and MPI_ANY_TAG) and returns it. Messages from one
// source with one tag still come in send order; among the rest, arrival
// order at this rank decides. x.Before is ignored. A receive from any
// source never probes the senders, so it waits for a dead one until ctx
// ends.
func (c *Comm) RecvMatch(ctx context.Context, x Match) (Message, error) {
	if err := c.checkMatch(x); err != nil {
		return Message{}, err
	}
	x.Before = 0
	var got Message
	_, err := c.waitMsg(ctx, x.Source, func() bool {
		var ok bool
		got, ok = c.msg.take(x)
		return ok
	})
	return got, err
}

// TryRecvMatch is RecvMatch without waiting: it drives the connections
// once, then takes the earliest-arrived message x matches if there is one
// (ok false if not).
func (c *Comm) TryRecvMatch(x Match) (m Message, ok bool, err error) {
	if err := c.checkMatch(x); err != nil {
		return Message{}, false, err
	}
	if _, err := c.eng.Progress(); err != nil {
		return Message{}, false, opErr("receive", x.Source, err)
	}
	c.eng.Locked(func() { m, ok = c.msg.take(x) })
	return m, ok, nil
}

// Envelope describes a message that has arrived and was not taken yet
// (ProbeMatch, TryProbeMatch): its source, tag and length in bytes.
type Envelope struct {
	Source, Tag, Len int
}

// ProbeMatch waits until a message x matches has arrived and describes
// the earliest-arrived one, leaving it to be taken (MPI_Probe): a
// RecvMatch with the same Match, or a Recv from its source with its tag,
// that runs next takes that message. x.Before is ignored. Like
// RecvMatch, a probe from any source never probes the senders.
func (c *Comm) ProbeMatch(ctx context.Context, x Match) (Envelope, error) {
	if err := c.checkMatch(x); err != nil {
		return Envelope{}, err
	}
	x.Before = 0
	var got Envelope
	_, err := c.waitMsg(ctx, x.Source, func() bool {
		var ok bool
		got, ok = c.msg.peek(x)
		return ok
	})
	return got, err
}

// TryProbeMatch is ProbeMatch without waiting (MPI_Iprobe): it drives the
// connections once, then describes the earliest-arrived message x
// matches, with an arrival number below x.Before unless that is 0 (ok
// false if there is none).
func (c *Comm) TryProbeMatch(x Match) (e Envelope, ok bool, err error) {
	if err := c.checkMatch(x); err != nil {
		return Envelope{}, false, err
	}
	if _, err := c.eng.Progress(); err != nil {
		return Envelope{}, false, opErr("probe", x.Source, err)
	}
	c.eng.Locked(func() { e, ok = c.msg.peek(x) })
	return e, ok, nil
}

// Arrived returns the arrival number the next message to arrive at this
// rank will have (messages are numbered 1, 2, ... as they arrive,
// collectives' included): as Match.Before it makes a series of
// TryRecvMatch calls see one snapshot, and WaitArrival waits for the
// message with that number.
func (c *Comm) Arrived() uint64 {
	var n uint64
	c.eng.Locked(func() { n = c.msg.arrived + 1 })
	return n
}

// WaitArrival waits until the message numbered n has arrived (see
// Arrived), or ctx ends.
func (c *Comm) WaitArrival(ctx context.Context, n uint64) error {
	if err := c.eng.Wait(ctx, func() bool { return c.msg.arrived >= n }); err != nil {
		return opErr("receive", AnySource, err)
	}
	return nil
}

func isQueueFull(err error) bool { return err != nil && errors.Is(err, verbs.ErrQueueFull) }
