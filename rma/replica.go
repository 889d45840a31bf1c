package rma

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rvma/rvma/internal/progress"
	"github.com/rvma/rvma/verbs"
)

// Snapshots of a notified window (NotifyConfig.History), and their
// replicas in a buddy rank's memory (NotifyConfig.Replicate): rank r's
// buddy is rank r+1 (modulo the size), which keeps History slots for r,
// each an 8-byte epoch tag and a copy of r's window. After each snapshot r
// writes three RDMA WRITEs on its RC connection to the buddy: the slot's
// tag to 0, the copy, the tag to the epoch plus one (0 is an empty slot,
// and epoch 0 is the initial state). RC places them in order, so a tag
// that names an epoch means its copy is whole; the buddy does nothing
// (one-sided), and reports the tags it holds when the ranks recover.

// snapshot is one retained epoch of a window.
type snapshot struct {
	epoch uint64
	mem   []byte
	off   int          // mem's offset in the replicas' snapMR
	repl  *progress.Op // the replica WRITEs from mem in flight, if any
}

// replicas is a notified window's replica state (owned as snaps is).
type replicas struct {
	snapMR *verbs.MR   // the snapshots' memory, registered so that it can be written to the buddy
	wardMR *verbs.MR   // this rank's slots for its ward's snapshots
	wardMM []byte      // wardMR's memory when mapped here (allocNIC)
	ward   replicaDesc // wardMR's layout
	to     replicaDesc // the buddy's slots for this rank's snapshots
}

// replicaDesc is where a buddy keeps its ward's replicas, as it publishes
// it: slots of slot bytes each.
type replicaDesc struct {
	addr  uint64
	rkey  uint32
	slot  uint64
	slots uint32
}

const replicaDescLen = 8 + 4 + 8 + 4

func (d replicaDesc) encode() []byte {
	b := binary.LittleEndian.AppendUint64(nil, d.addr)
	b = binary.LittleEndian.AppendUint32(b, d.rkey)
	b = binary.LittleEndian.AppendUint64(b, d.slot)
	return binary.LittleEndian.AppendUint32(b, d.slots)
}

func decodeReplicaDesc(b []byte) (replicaDesc, error) {
	if len(b) != replicaDescLen {
		return replicaDesc{}, fmt.Errorf("%w: bad replica description", ErrDatatype)
	}
	return replicaDesc{addr: binary.LittleEndian.Uint64(b), rkey: binary.LittleEndian.Uint32(b[8:]),
		slot: binary.LittleEndian.Uint64(b[12:]), slots: binary.LittleEndian.Uint32(b[20:])}, nil
}

func (r *replicas) free() {
	if r.snapMR != nil {
		r.snapMR.Deregister()
	}
	if r.wardMR != nil {
		r.wardMR.Deregister()
	}
	if r.wardMM != nil {
		unix.Munmap(r.wardMM)
	}
	*r = replicas{}
}

// allocSnapshots makes the snapshots' buffers up front when they are
// replicated (registered memory); otherwise takeBuffer makes them.
func (n *notifyState) allocSnapshots() error {
	size := len(n.w.mem)
	if !n.cfg.Replicate || size == 0 {
		return nil
	}
	mr, err := n.w.c.pd.AllocMR(n.cfg.History*size, verbs.AccessAll)
	if err != nil {
		return err
	}
	n.repl.snapMR = mr
	for i := range n.cfg.History {
		n.free = append(n.free, &snapshot{mem: mr.Bytes()[i*size : (i+1)*size], off: i * size})
	}
	return nil
}

// takeBuffer returns a buffer for the next snapshot: a free one, a new
// one, or the oldest snapshot's once its replica has left.
func (n *notifyState) takeBuffer(ctx context.Context) (*snapshot, error) {
	if k := len(n.free); k > 0 {
		s := n.free[k-1]
		n.free = n.free[:k-1]
		return n.settle(ctx, s)
	}
	if len(n.snaps) < n.cfg.History {
		return &snapshot{mem: make([]byte, len(n.w.mem))}, nil
	}
	s := n.snaps[0]
	n.snaps = n.snaps[1:]
	return n.settle(ctx, s)
}

// settle waits until s's replica WRITEs have read it (long done: the
// buffer comes back History snapshots later). Their failure is the
// buddy's connection's, which the application learns of otherwise.
func (n *notifyState) settle(ctx context.Context, s *snapshot) (*snapshot, error) {
	if s.repl != nil {
		if err := s.repl.Wait(ctx); err != nil && ctx.Err() != nil {
			return nil, err
		}
		s.repl = nil
	}
	s.epoch = 0
	return s, nil
}

// buddy is the rank that keeps this rank's replicas, or -1.
func (n *notifyState) buddy() int {
	c := n.w.c
	if !n.cfg.Replicate || c.size == 1 {
		return -1
	}
	return (c.rank + 1) % c.size
}

// replicate writes s to the buddy's slot for its epoch, without waiting.
func (n *notifyState) replicate(s *snapshot) {
	b := n.buddy()
	to := n.repl.to
	if b < 0 || to.slots == 0 {
		return
	}
	c := n.w.c
	qp, err := c.conn(c.bg, b)
	if err != nil {
		return // the buddy is gone: Recover learns that its replicas are
	}
	base := to.addr + (s.epoch/uint64(n.cfg.Every))%uint64(to.slots)*to.slot
	var zero, tag [8]byte
	binary.LittleEndian.PutUint64(tag[:], s.epoch+1)
	// Unordered: on shared memory the three are copies made at once,
	// in order, rather than waiting behind this epoch's puts to the
	// buddy (they concern other memory); where they go as packets (or
	// the copy is refused, which then refuses all three) they leave in
	// order, and RC places them in order.
	const un = verbs.FlagUnordered
	wrs := []verbs.SendWR{{Opcode: verbs.OpWrite, Flags: verbs.FlagInline | un, Inline: zero[:], RemoteAddr: base, RKey: to.rkey}}
	if len(s.mem) > 0 {
		wrs = append(wrs, verbs.SendWR{Opcode: verbs.OpWrite, Flags: un, SGL: []verbs.SGE{n.repl.snapMR.SGE(s.off, len(s.mem))},
			RemoteAddr: base + 8, RKey: to.rkey})
	}
	wrs = append(wrs, verbs.SendWR{Opcode: verbs.OpWrite, Flags: verbs.FlagInline | un, Inline: tag[:], RemoteAddr: base, RKey: to.rkey})
	op, id := c.eng.Start(len(wrs), nil)
	for i := range wrs {
		wrs[i].ID = id + uint64(i)
		wrs[i].Flags |= verbs.FlagSignaled
	}
	k, err := c.post(qp, wrs)
	if err != nil {
		c.eng.Posted(op, id, len(wrs), k, err)
	}
	s.repl = op
}

// exchangeReplicas (collective, in window creation and Recover) makes
// this rank's slots for its ward if it has none, and learns where its
// buddy keeps its own.
func (n *notifyState) exchangeReplicas(ctx context.Context) error {
	c := n.w.c
	if !n.cfg.Replicate || c.size == 1 {
		return nil
	}
	if n.repl.wardMR == nil {
		ward := (c.rank - 1 + c.size) % c.size
		slot := 8 + (n.w.remote[ward].size+7)&^7
		mr, mm, err := c.allocNIC(int(slot) * n.cfg.History)
		if err != nil {
			return err
		}
		n.repl.wardMR, n.repl.wardMM = mr, mm
		n.repl.ward = replicaDesc{addr: mr.Addr(), rkey: mr.RKey(), slot: slot, slots: uint32(n.cfg.History)}
	}
	all, err := c.Allgather(ctx, n.repl.ward.encode())
	if err != nil {
		return err
	}
	n.repl.to, err = decodeReplicaDesc(all[n.buddy()])
	return err
}

// wardEpochs are the epochs of the ward's replicas this rank holds whole.
func (n *notifyState) wardEpochs() []uint64 {
	mr := n.repl.wardMR
	if mr == nil {
		return nil
	}
	var es []uint64
	mem := mr.Bytes()
	for i := range uint64(n.repl.ward.slots) {
		p := (*uint64)(unsafe.Pointer(&mem[i*n.repl.ward.slot]))
		if t := atomic.LoadUint64(p); t != 0 {
			es = append(es, t-1)
		}
	}
	return es
}

// retained is what this rank can restore of the window, for Recover.
func (w *Win) retained(fresh bool) winRetained {
	n := w.notify
	wr := winRetained{id: w.id, kind: 'p'}
	if n == nil || n.cfg.History == 0 {
		return wr
	}
	wr.kind = 'h'
	if n.cfg.Replicate {
		wr.kind = 'r'
		wr.ward = n.wardEpochs()
	}
	if !fresh {
		for _, s := range n.snaps {
			wr.own = append(wr.own, s.epoch)
		}
	}
	return wr
}

// restoreFromBuddy (a respawned rank, in Recover) reads the replica of
// epoch e from the buddy into the window, which is then at epoch e.
func (n *notifyState) restoreFromBuddy(ctx context.Context, e uint64) error {
	c, w := n.w.c, n.w
	b, to := n.buddy(), n.repl.to
	if b < 0 || to.slots == 0 {
		return fmt.Errorf("%w: no buddy keeps window %d", ErrLost, w.id)
	}
	tmp, err := c.pd.AllocMR(8+len(w.mem), verbs.AccessAll)
	if err != nil {
		return err
	}
	defer tmp.Deregister()
	base := to.addr + (e/uint64(n.cfg.Every))%uint64(to.slots)*to.slot
	if err := c.rdma(ctx, b, []verbs.SendWR{{Opcode: verbs.OpRead, SGL: []verbs.SGE{tmp.SGE(0, 8+len(w.mem))},
		RemoteAddr: base, RKey: to.rkey}}); err != nil {
		return err
	}
	if got := binary.LittleEndian.Uint64(tmp.Bytes()); got != e+1 {
		return fmt.Errorf("%w: rank %d's replica of window %d holds tag %d, not epoch %d's", ErrLost, b, w.id, got, e)
	}
	if err := n.abandon(); err != nil {
		return err
	}
	n.quiesce(0, func() { copy(w.mem, tmp.Bytes()[8:]) })
	s, err := n.takeBuffer(ctx)
	if err != nil {
		return err
	}
	copy(s.mem, w.mem)
	s.epoch = e
	n.snaps = append(n.snaps, s)
	n.mu.Lock()
	n.epoch = e
	n.mu.Unlock()
	n.grant(true)
	w.resetTx()
	return nil
}
