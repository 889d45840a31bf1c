package rma

import (
	"sync/atomic"
	"unsafe"

	"github.com/rvma/rvma/internal/lockcheck"
	"github.com/rvma/rvma/verbs"
)

// regCache registers origin buffers on first use and keeps them
// registered, as MPI libraries' registration caches do: registering costs
// a key-table update, too much to pay per put. It holds up to regCacheCap
// regions (each the whole capacity of the slice it first saw), evicting
// the oldest; an evicted region is deregistered, which waits for the
// operations that are using it.
type regCache struct {
	pd *verbs.PD // set by newComm, then read-only

	// mu guards the lists. It is taken under a Win's mu (release) or a
	// txState's mu (a split put), and only verbs' locks under it; a
	// registration or an eviction's Deregister runs under it.
	mu   lockcheck.Mutex[regLocks]
	mrs  []*verbs.MR // oldest first
	wins []*verbs.MR // window regions, searched first, never evicted

	// busy counts what may hold SGEs of cached regions that are not
	// posted yet: operations between their first sge and their post
	// (hold, release), requests waiting in a notified window's queue,
	// multipath transfers in flight. A region evicted while it is not
	// zero is retired rather than deregistered, since a request built on
	// it may still be posted (a strided get of 65530 blocks registered
	// new regions as it went and evicted the one its first blocks used:
	// their READs failed at post). Retired regions (under mu) are
	// deregistered when busy drops to zero: nothing can hold them then,
	// since nothing finds them any more.
	busy    atomic.Int64
	retired []*verbs.MR
}

// regLocks is the lock class of registration caches' mu (see
// internal/lockcheck).
type regLocks struct{}

func (regLocks) LockClass() string { return "an rma registration cache's mu" }

const regCacheCap = 1024

func base(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// find returns a region holding b, or nil; r.mu is held. Cached regions
// are searched newest first: the buffer just registered is the likeliest
// to hold the next piece (a C caller's strided calls over one array each
// register the rest of it; oldest first, each looked through a full cache).
func (r *regCache) find(b []byte) *verbs.MR {
	lockcheck.AssertHeld(&r.mu, "rma: a registration is looked up")
	for _, mr := range r.wins {
		if _, ok := within(mr, b); ok {
			return mr
		}
	}
	for i := len(r.mrs) - 1; i >= 0; i-- {
		if _, ok := within(r.mrs[i], b); ok {
			return r.mrs[i]
		}
	}
	return nil
}

// within returns b's offset in mr's memory, if b (not empty) lies in it.
func within(mr *verbs.MR, b []byte) (int, bool) {
	mb := mr.Bytes()
	if len(mb) == 0 {
		return 0, false
	}
	p, s := base(b), base(mb)
	if p >= s && p+uintptr(len(b)) <= s+uintptr(len(mb)) {
		return int(p - s), true
	}
	return 0, false
}

// sge returns an SGE for b, registering b's backing array if needed.
func (r *regCache) sge(b []byte) (verbs.SGE, error) {
	if len(b) == 0 {
		return verbs.SGE{}, nil
	}
	mr, off, err := r.region(b)
	if err != nil {
		return verbs.SGE{}, err
	}
	return mr.SGE(off, len(b)), nil
}

// sgeNear is sge for b (not empty) that first tries mr, the region of a
// previous piece of the same put (nil: none): a put's pieces mostly lie in
// one region, and looking it up is most of what a small piece costs. It
// returns the region it used. The caller holds the cache (hold), so mr
// cannot have been deregistered since it was found.
func (r *regCache) sgeNear(mr *verbs.MR, b []byte) (*verbs.MR, verbs.SGE, error) {
	if mr != nil {
		if off, ok := within(mr, b); ok {
			return mr, mr.SGE(off, len(b)), nil
		}
	}
	mr, off, err := r.region(b)
	if err != nil {
		return nil, verbs.SGE{}, err
	}
	return mr, mr.SGE(off, len(b)), nil
}

// region returns a region holding b (not empty) and b's offset in it,
// registering b's backing array if needed.
func (r *regCache) region(b []byte) (*verbs.MR, int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	mr := r.find(b)
	if mr == nil {
		var err error
		mr, err = r.pd.RegisterMR(b[:cap(b)], verbs.AccessLocalWrite)
		if err != nil {
			return nil, 0, err
		}
		if len(r.mrs) == regCacheCap {
			if r.busy.Load() > 0 {
				r.retired = append(r.retired, r.mrs[0])
			} else {
				r.mrs[0].Deregister()
			}
			r.mrs = r.mrs[1:]
		}
		r.mrs = append(r.mrs, mr)
	}
	return mr, int(base(b) - base(mr.Bytes())), nil
}

// hold marks the start of something that takes SGEs from r and posts
// them later; release marks its end (its requests posted or dropped).
func (r *regCache) hold() { r.busy.Add(1) }

func (r *regCache) release() { r.releaseN(1) }

func (r *regCache) releaseN(n int) {
	if n == 0 || r.busy.Add(-int64(n)) > 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.busy.Load() > 0 {
		return // a newer holder, which cannot have found these
	}
	for _, mr := range r.retired {
		mr.Deregister()
	}
	clear(r.retired)
	r.retired = r.retired[:0]
}

func (r *regCache) addWin(mr *verbs.MR) {
	r.mu.Lock()
	r.wins = append(r.wins, mr)
	r.mu.Unlock()
}

func (r *regCache) removeWin(mr *verbs.MR) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, m := range r.wins {
		if m == mr {
			r.wins = append(r.wins[:i], r.wins[i+1:]...)
			return
		}
	}
}
