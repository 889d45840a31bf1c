package rma

import (
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/rvma/rvma/verbs"
)

// When every rank shares this host (shm), barriers run through words in
// the ranks' memory, as MPI libraries' shared-memory barriers do: a round
// of the dissemination is a store into the partner's word and a spin on
// one's own, with no message, no acknowledgement and no progress engine.
// Over messages, a round on shm takes a send, its acknowledgement and a
// receive through the rings: rma_barrier_lat, 2 ranks on their own cores,
// 3.1-3.7 us that way against 0.16-0.18 this way (docs/PERFORMANCE.md).
//
// Each rank's words: a wake word and a count of sleepers (a waiter that spun
// long enough blocks on the wake word, and the writer wakes it), a gone
// word per round (its partner closed), then per parity of the barrier's number and per round a slot of two words, the
// value (lowest failed rank, lowest dead rank) and the barrier's number,
// stored in that order. A partner can be at most one barrier ahead (it
// cannot finish the next without this rank), so two parities suffice.
//
// The choice is made once per Comm, at its first barrier, and the same on
// every rank: the ranks exchange their words' keys (Allgather), map their
// partners' words, and agree (a barrier over messages) that all could. A
// rank that is a respawned incarnation, or a Comm that recovered, keeps
// to messages, which carry the recovery's generation.
type hostBarrier struct {
	mu     sync.Mutex   // one barrier at a time (collectives are called in order)
	state  atomic.Int32 // hbUntried, hbIniting, hbOn, hbOff, hbBroken
	mr     *verbs.MR
	words  []uint64         // this rank's (see nwords)
	to     []*verbs.Mapping // per round: the partner written to, its words
	from   []*verbs.Mapping // per round: the partner heard from (for its liveness)
	n      uint64           // barriers run
	rounds int
	err    error // hbBroken: why (set before the state)
}

const (
	hbUntried = iota
	hbIniting
	hbOn
	hbOff
	hbBroken
)

// Word indexes in a rank's words, after the wake word and the sleepers
// (wordwait.go).
const hbGone = 2

// hostBarrier returns the Comm's host barrier when its barriers run
// through memory, else nil. The first call decides, in the Comm's first
// barrier (collectives are called in the same order on every rank, so it
// is the same call everywhere): an Allgather and a barrier over messages,
// on every rank, eligible or not. If they fail, this rank cannot know
// what the others chose: the error is returned, and every later barrier
// returns it too (a collective that failed leaves the Comm failed, as
// MPI's errors are fatal), until Recover.
func (c *Comm) hostBarrier(ctx context.Context) (*hostBarrier, error) {
	hb := &c.hb
	switch hb.state.Load() {
	case hbOn:
		return hb, nil
	case hbIniting, hbOff:
		return nil, nil
	case hbBroken:
		return nil, hb.err
	}
	if c.size == 1 || c.inc > 0 {
		// A respawned rank's first collective is in Recover, where the
		// survivors keep to messages.
		hb.state.Store(hbOff)
		return nil, nil
	}
	hb.state.Store(hbIniting)
	on, err := hb.setUp(ctx, c)
	switch {
	case err != nil:
		hb.err = fmt.Errorf("%w: the Comm's first barrier failed, so its ranks may disagree on how barriers run: %w", ErrSync, err)
		hb.state.Store(hbBroken)
		return nil, hb.err
	case on:
		hb.state.Store(hbOn)
		return hb, nil
	}
	hb.state.Store(hbOff)
	return nil, nil
}

// disable makes the Comm's barriers run over messages from now on
// (Recover: a respawned rank's words are new, and messages carry the
// recovery's generation).
func (hb *hostBarrier) disable() { hb.state.Store(hbOff) }

// setUp allocates this rank's words, exchanges keys, maps the partners'
// words and agrees with every rank that all could. Every rank takes part
// in its two collectives, eligible or not.
func (hb *hostBarrier) setUp(ctx context.Context, c *Comm) (bool, error) {
	for k := 1; k < c.size; k *= 2 {
		hb.rounds++
	}
	// Where ranks share cores (spin.Scarce: rvmarun's setting) the wait
	// gives the core to the kernel every round (await): halo3d's fence
	// variant, 4 ranks on 2 cores, 79-91 us an iteration over messages
	// and 20-29 through the words exchange only, 842-1132 and 812-996 with
	// its stencil (docs/PERFORMANCE.md). Waits that slept at once when
	// they had been long made the stencil's 975-1370.
	eligible := shmPort(c.dev) >= 0
	var mine [16]byte // rkey, pid, addr
	if eligible {
		mr, err := c.pd.AllocMR(8*hb.nwords(), verbs.AccessAll)
		if err == nil {
			hb.mr = mr
			hb.words = u64s(mr.Bytes())
			binary.LittleEndian.PutUint32(mine[0:], mr.RKey())
			binary.LittleEndian.PutUint32(mine[4:], uint32(os.Getpid()))
			binary.LittleEndian.PutUint64(mine[8:], mr.Addr())
		} else {
			eligible = false
		}
	}
	all, err := c.Allgather(ctx, mine[:])
	if err == nil && eligible {
		eligible = hb.mapPartners(ctx, c, all)
	}
	verdict := uint32(noRank) // every rank could: the lowest is none
	if !eligible {
		verdict = uint32(c.rank)
	}
	if err == nil {
		verdict, err = c.disseminateMsgs(ctx, "barrier", verdict, false)
	}
	if err != nil || verdict != noRank {
		hb.to, hb.from = nil, nil
		if hb.mr != nil {
			hb.mr.Deregister()
			hb.mr, hb.words = nil, nil
		}
		return false, err
	}
	return true, nil
}

// nwords is the length of a rank's words: the wake word, the sleeping
// flag, a gone word per round (its partner of the round closed), and the
// slots.
func (hb *hostBarrier) nwords() int { return hbGone + hb.rounds + 4*hb.rounds }

// slot is the index of the slot of round k for barriers of parity par.
func (hb *hostBarrier) slot(par, k int) int { return hbGone + hb.rounds + 2*(par*hb.rounds+k) }

// close, at the Comm's teardown, tells each partner waiting on this rank
// that it will not come (its gone word of that round), and makes later
// barriers go over messages, which report the closed Comm.
func (hb *hostBarrier) close() {
	if !hb.state.CompareAndSwap(hbOn, hbOff) {
		return
	}
	for k, m := range hb.to {
		to := u64s(m.Bytes())
		atomic.StoreUint64(&to[hbGone+k], 1)
		wake(to)
	}
}

// mapPartners maps the words of each round's partners: those written to,
// and those heard from (only to see whether their process is gone). A
// partner in this process (a world of goroutines) is not mapped: its death
// is a closed Comm, which its words would not show.
func (hb *hostBarrier) mapPartners(ctx context.Context, c *Comm, all [][]byte) bool {
	pid := uint32(os.Getpid())
	mapAt := func(r int, access verbs.Access) *verbs.Mapping {
		b := all[r]
		if len(b) != 16 || binary.LittleEndian.Uint32(b[4:]) == pid || binary.LittleEndian.Uint64(b[8:]) == 0 {
			return nil
		}
		qp, err := c.conn(ctx, r)
		if err != nil {
			return nil
		}
		m, err := qp.Map(binary.LittleEndian.Uint32(b), binary.LittleEndian.Uint64(b[8:]), 8*hb.nwords(), access)
		if err != nil || !m.Usable() {
			return nil
		}
		return m
	}
	for k := 1; k < c.size; k *= 2 {
		to, from := mapAt((c.rank+k)%c.size, verbs.AccessRemoteWrite|verbs.AccessRemoteRead), mapAt((c.rank-k+c.size)%c.size, verbs.AccessRemoteRead)
		if to == nil || from == nil {
			return false
		}
		hb.to, hb.from = append(hb.to, to), append(hb.from, from)
	}
	return true
}

// run is disseminate through the words: it returns the lowest value of
// all ranks, or ErrPeer naming the lowest rank found dead (a rank whose
// partner died goes on with its rounds and passes that on, as over
// messages).
func (hb *hostBarrier) run(ctx context.Context, c *Comm, op string, low uint32) (uint32, error) {
	hb.mu.Lock()
	defer hb.mu.Unlock()
	ictx, in := c.interruptible(ctx)
	defer in.end()
	hb.n++
	seq, par := hb.n, int(hb.n%2)
	f := collFailure{dead: noRank}
	for k := range hb.rounds {
		slot := hb.slot(par, k)
		to := u64s(hb.to[k].Bytes())
		atomic.StoreUint64(&to[slot], uint64(low)|uint64(f.dead)<<32)
		atomic.StoreUint64(&to[slot+1], seq)
		wakeSleepers(to)
		from := (c.rank - 1<<k + c.size) % c.size
		switch err := hb.await(ictx, c, slot, k); {
		case err == errGone:
			f.dead = min(f.dead, uint32(from))
			f.first = cmp.Or(f.first, error(errGone))
		case err != nil:
			return 0, opErr(op, from, in.err(err))
		default:
			v := atomic.LoadUint64(&hb.words[slot])
			low = min(low, uint32(v))
			f.heard(uint32(v >> 32))
		}
	}
	if err := f.err(op); err != nil {
		return 0, err
	}
	return low, nil
}

// errGone: the partner is gone.
var errGone = errPeerGone{}

type errPeerGone struct{}

func (errPeerGone) Error() string { return "it is gone (its process, or its Comm closed)" }
func (errPeerGone) Unwrap() error { return ErrPeer }

// await waits until this barrier's value is in slot (awaitWords: the
// wait gives the core away every round where ranks share cores: see
// setUp). It returns errGone if the partner is gone, or ctx's error.
func (hb *hostBarrier) await(ctx context.Context, c *Comm, slot, k int) error {
	seq := &hb.words[slot+1]
	want := hb.n
	return awaitWords(c, hb.words, func() bool { return atomic.LoadUint64(seq) >= want }, func() (bool, error) {
		if err := ctx.Err(); err != nil {
			return false, err
		}
		if hb.gone(k) {
			return false, errGone
		}
		return false, nil
	}, true)
}

// gone reports whether round k's partner is gone: its process, or its
// Comm (it closed).
func (hb *hostBarrier) gone(k int) bool {
	return hb.from[k].PeerGone() || atomic.LoadUint64(&hb.words[hbGone+k]) != 0
}

// u64s is b (8-byte aligned: registered or mapped memory) as words.
func u64s(b []byte) []uint64 { return unsafe.Slice((*uint64)(unsafe.Pointer(&b[0])), len(b)/8) }
