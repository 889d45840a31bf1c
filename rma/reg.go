package rma

import (
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
}

// regLocks is the lock class of registration caches' mu (see
// internal/lockcheck).
type regLocks struct{}

func (regLocks) LockClass() string { return "an rma registration cache's mu" }

const regCacheCap = 1024

func base(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// find returns a region holding b, or nil; r.mu is held.
func (r *regCache) find(b []byte) *verbs.MR {
	lockcheck.AssertHeld(&r.mu, "rma: a registration is looked up")
	p, n := base(b), uintptr(len(b))
	for _, list := range [][]*verbs.MR{r.wins, r.mrs} {
		for _, mr := range list {
			mb := mr.Bytes()
			if len(mb) == 0 {
				continue
			}
			s := base(mb)
			if p >= s && p+n <= s+uintptr(len(mb)) {
				return mr
			}
		}
	}
	return nil
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
			r.mrs[0].Deregister()
			r.mrs = r.mrs[1:]
		}
		r.mrs = append(r.mrs, mr)
	}
	return mr, int(base(b) - base(mr.Bytes())), nil
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
