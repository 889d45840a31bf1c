package reliability

import (
	"context"
	"fmt"
	"time"

	"github.com/rvma/rvma/internal/sdrwire"
	"github.com/rvma/rvma/verbs"
)

// Recv is a posted receive buffer: the destination of one message.
type Recv struct {
	c      *Conn
	seq    uint64
	buf    []byte
	mr     *verbs.MR
	par    []byte
	parMR  *verbs.MR
	chunk  int
	n      int // data chunks
	k, mx  int // stripe data chunks, parity slots per stripe
	bm     *Bitmap
	pbm    *Bitmap
	cnt    []uint16 // chunks present per stripe, data and parity
	dcnt   []uint16 // data chunks present per stripe
	high   int      // one more than the highest data chunk seen
	skip   int      // data positions high jumped over: first sends lost
	stats  RecvStats
	done   bool
	doneCh chan struct{}
	err    error

	lastStatus time.Duration
	dirty      bool // changed since the last status
	doneSent   int  // completion statuses sent
}

// RecvStats describes a receive.
type RecvStats struct {
	Chunks     int  // data chunks in the buffer
	Arrived    int  // distinct chunks that arrived, data and parity
	Decoded    int  // data chunks rebuilt from parity
	Duplicates int  // chunks that arrived again
	Partial    bool // taken with chunks missing
}

// Post offers buf as the destination of the next message from the peer,
// waiting while all Slots are busy. buf must not be touched until the
// receive completes (Wait returns or Done is closed); chunks land in it
// directly.
func (c *Conn) Post(ctx context.Context, buf []byte) (*Recv, error) {
	chunk := c.cfg.Chunk
	n := (len(buf) + chunk - 1) / chunk
	if n == 0 {
		return nil, fmt.Errorf("%w: empty buffer", ErrConfig)
	}
	k, mx := c.cfg.K, c.cfg.MaxParity
	stripes := (n + k - 1) / k
	if n+stripes*mx > maxChunks {
		return nil, fmt.Errorf("%w: %d bytes is %d chunks of %d with parity, more than %d", ErrTooLarge, len(buf), n+stripes*mx, chunk, maxChunks)
	}
	var seq uint64
	err := c.wait(ctx, func() bool {
		if c.err != nil {
			return true
		}
		seq = c.post
		r := c.slots[seq%uint64(c.cfg.Slots)]
		return r == nil || r.done
	})
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return nil, c.err
	}
	slot := int(seq % uint64(c.cfg.Slots))
	need := stripes * mx * chunk
	if cap(c.parity[slot]) < need {
		c.parity[slot] = make([]byte, need)
	}
	r := &Recv{c: c, seq: seq, buf: buf, par: c.parity[slot][:need], chunk: chunk, n: n, k: k, mx: mx,
		bm: NewBitmap(n), pbm: NewBitmap(stripes * mx), cnt: make([]uint16, stripes), dcnt: make([]uint16, stripes),
		doneCh: make(chan struct{}), stats: RecvStats{Chunks: n}}
	// Fresh registrations per message: the old keys die with the old
	// message, so its late packets are refused by the NIC.
	if r.mr, err = c.pd.RegisterMR(buf, verbs.AccessLocalWrite|verbs.AccessRemoteWrite); err != nil {
		return nil, err
	}
	if r.parMR, err = c.pd.RegisterMR(r.par, verbs.AccessLocalWrite|verbs.AccessRemoteWrite); err != nil {
		r.mr.Deregister()
		return nil, err
	}
	c.post++
	c.slots[slot] = r
	c.sendStatusLocked(r, c.now())
	return r, nil
}

// Seq is the message's sequence number (the n-th Post is n).
func (r *Recv) Seq() uint64 { return r.seq }

// Bitmap is the live bitmap of data chunks that are in place; chunks
// rebuilt from parity are set when they are.
func (r *Recv) Bitmap() *Bitmap { return r.bm }

// Done is closed when the receive completes.
func (r *Recv) Done() <-chan struct{} { return r.doneCh }

// Wait blocks until every chunk is in place, the receive was taken, or the
// connection failed.
func (r *Recv) Wait(ctx context.Context) error {
	select {
	case <-r.doneCh:
	case <-ctx.Done():
		return ctx.Err()
	}
	r.c.mu.Lock()
	defer r.c.mu.Unlock()
	return r.err
}

// Take completes the receive now, with whatever has arrived (partial
// completion): the bitmap says which chunks are valid, the sender is told
// to stop, and late chunks are refused.
func (r *Recv) Take() {
	c := r.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if r.done {
		return
	}
	r.stats.Partial = !r.bm.Full()
	r.finishLocked(true)
}

// Stats returns the receive's counters.
func (r *Recv) Stats() RecvStats {
	r.c.mu.Lock()
	defer r.c.mu.Unlock()
	return r.stats
}

func (r *Recv) finishLocked(tell bool) {
	if r.done {
		return
	}
	r.done = true
	r.mr.Deregister()
	r.parMR.Deregister()
	c := r.c
	for c.floor < c.post {
		s := c.slots[c.floor%uint64(c.cfg.Slots)]
		if s == nil || s.seq != c.floor || !s.done {
			break
		}
		c.floor++
	}
	close(r.doneCh)
	if tell {
		c.sendStatusLocked(r, c.now())
	}
	c.broadcastLocked()
}

// statusDue says whether the slot's status should go out now: soon after
// a change, at least every RTT/2 while pending, and a few times after
// completion (the sender also asks with a query).
func (r *Recv) statusDue(now, rtt, tick time.Duration) bool {
	since := now - r.lastStatus
	if r.done {
		return r.doneSent < 4 && since >= rtt/2
	}
	return (r.dirty && since >= tick) || since >= rtt/2
}

func (c *Conn) sendStatusLocked(r *Recv, now time.Duration) {
	m := &sdrwire.Message{Type: sdrwire.TypeStatus, Seq: r.seq, Floor: c.floor,
		Chunk: uint32(r.chunk), K: uint16(r.k), MaxM: uint16(r.mx), Len: uint64(len(r.buf)),
		RKey: r.mr.RKey(), Addr: r.mr.Addr(), ParRKey: r.parMR.RKey(), ParAddr: r.parMR.Addr(), ParLen: uint64(len(r.par)),
		Arrived: uint32(r.stats.Arrived), Decoded: uint32(r.stats.Decoded), Window: c.rw.advertised(&c.cfg)}
	if r.done {
		m.Flags = sdrwire.FlagComplete
		if r.stats.Partial {
			m.Flags |= sdrwire.FlagTaken
		}
		r.doneSent++
	} else {
		cum := r.bm.NextClear(0)
		m.Cum, m.Highest, m.Skipped = uint32(cum), uint32(r.high), uint32(r.skip)
		if cum < r.high {
			words := min(sdrwire.MaxWords, (r.high-cum+63)/64)
			m.Words = c.scratch.words[:words]
			r.bm.Slice(cum, m.Words)
		}
	}
	r.lastStatus, r.dirty = now, false
	c.sendCtlLocked(m)
}

type rxScratch struct {
	words  [sdrwire.MaxWords]uint64
	shards [][]byte
	zero   []byte
	last   []byte
}

// onChunkLocked records a chunk written with immediate imm.
func (c *Conn) onChunkLocked(imm uint32, now time.Duration) {
	id, idx := imm>>idxBits, int(imm&(maxChunks-1))
	r := c.slots[int(uint64(id)%uint64(c.cfg.Slots))]
	if r == nil || r.done || uint32(r.seq%(1<<idBits)) != id {
		return // a late chunk of an old message: its keys are gone, nothing landed
	}
	before := r.stats.Arrived
	full := r.onChunk(idx)
	if r.stats.Arrived > before {
		c.rw.rx += int64(r.chunk)
	}
	if full {
		r.finishLocked(true)
	}
}

// onChunk is the receive state machine: it sets the chunk's bit, rebuilds
// a stripe once enough of it is present, and reports completion.
func (r *Recv) onChunk(idx int) bool {
	var s int
	switch {
	case idx < r.n:
		if !r.bm.Set(idx) {
			r.stats.Duplicates++
			return false
		}
		s = idx / r.k
		r.dcnt[s]++
		if idx >= r.high {
			r.skip += idx - r.high
			r.high = idx + 1
		}
	case idx-r.n < r.pbm.Len():
		if !r.pbm.Set(idx - r.n) {
			r.stats.Duplicates++
			return false
		}
		s = (idx - r.n) / r.mx
	default:
		return false
	}
	r.stats.Arrived++
	r.cnt[s]++
	r.dirty = true
	kk := min(r.k, r.n-s*r.k)
	if int(r.dcnt[s]) < kk && int(r.cnt[s]) >= kk {
		r.decode(s, kk)
	}
	return r.bm.Full()
}

// decode rebuilds stripe s's missing data chunks in place from its parity,
// holding remote writes back meanwhile: a duplicate of a chunk it reads or
// rebuilds may be landing.
func (r *Recv) decode(s, kk int) {
	r.mr.Exclusive(func([]byte) {
		r.parMR.Exclusive(func([]byte) { r.decodeLocked(s, kk) })
	})
}

func (r *Recv) decodeLocked(s, kk int) {
	sc := &r.c.scratch
	c := r.chunk
	if len(sc.shards) < r.k+r.mx {
		sc.shards = make([][]byte, r.k+r.mx)
	}
	if len(sc.zero) < c {
		sc.zero = make([]byte, c)
		sc.last = make([]byte, c)
	}
	sh := sc.shards[:r.k+r.mx]
	lastMissing := -1
	for i := 0; i < r.k; i++ {
		idx := s*r.k + i
		switch {
		case i >= kk:
			sh[i] = sc.zero[:c] // past the end: the sender coded zeros
		case (idx+1)*c > len(r.buf): // the short last chunk, padded
			last := sc.last[:c]
			clear(last)
			if r.bm.Test(idx) {
				copy(last, r.buf[idx*c:])
				sh[i] = last
			} else {
				sh[i], lastMissing = last[:0], idx
			}
		case r.bm.Test(idx):
			sh[i] = r.buf[idx*c : (idx+1)*c]
		default:
			sh[i] = r.buf[idx*c : idx*c : (idx+1)*c] // rebuilt in place
		}
	}
	for j := 0; j < r.mx; j++ {
		p := s*r.mx + j
		if r.pbm.Test(p) {
			sh[r.k+j] = r.par[p*c : (p+1)*c]
		} else {
			sh[r.k+j] = nil
		}
	}
	if err := r.c.dec.ReconstructData(sh); err != nil {
		r.c.log.Warn("reliability: stripe decode failed", "seq", r.seq, "stripe", s, "err", err)
		return
	}
	if lastMissing >= 0 {
		copy(r.buf[lastMissing*c:], sh[lastMissing-s*r.k])
	}
	for i := 0; i < kk; i++ {
		if r.bm.Set(s*r.k + i) {
			r.stats.Decoded++
		}
	}
	r.dcnt[s] = uint16(kk)
}
