package rma

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/rvma/rvma/internal/progress"
)

// Collectives: every rank calls them in the same order. Each call takes a
// fresh internal tag, so consecutive collectives never mix.

func (c *Comm) collTag() uint32 {
	return 1<<31 | c.tagGen() | (c.collSeq.Add(1)&0x1fffff)<<5
}

// Barrier returns once every rank has entered it (dissemination: log2(size)
// rounds of one message each). If a rank died (its connection failed), it
// fails on every rank with ErrPeer naming the lowest dead rank, in bounded
// time, rather than waiting for it.
func (c *Comm) Barrier(ctx context.Context) error {
	_, err := c.disseminate(ctx, "barrier", noRank, false)
	return err
}

const noRank = math.MaxUint32

// agree is a barrier that also spreads failure: each rank passes the
// error its part of a collective call ended with, and every rank learns
// whether any failed. It returns nil if none did or only this rank did (the
// caller has its own error), else ErrRemote naming the lowest failed rank,
// so that no rank waits for one that left the call early (ErrPeer, as
// Barrier, if a rank died).
func (c *Comm) agree(ctx context.Context, op string, mine error) error {
	low := uint32(noRank)
	if mine != nil {
		low = uint32(c.rank)
	}
	low, err := c.disseminate(ctx, op, low, false)
	switch {
	case err != nil:
		return err
	case low == noRank || int(low) == c.rank:
		return nil
	}
	return opErr(op, int(low), ErrRemote)
}

// disseminate runs a dissemination barrier whose messages carry the lowest
// value seen, and returns the lowest value of all ranks: after round k a
// rank has heard, directly or not, from the 2^k ranks before it. Messages
// also carry the lowest rank found dead: a rank whose partner of a round
// is dead (a send or receive fails with ErrPeer) goes on with the next
// rounds and tells the rest, so every rank finishes and fails with
// ErrPeer naming it instead of waiting for a message that never comes.
//
// closing is Close's barrier, after which the ranks tear down. Its rounds
// do not wait for their sends' acknowledgements, and a send that fails
// once every message has been received is no failure: the rank it went to
// received it in that round and may already be gone, with the
// acknowledgement lost on the way (the last-ACK problem every transport
// has at close). Waiting per round would hold back the next partner for
// as long as RC retries toward a rank that left.
func (c *Comm) disseminate(ctx context.Context, op string, low uint32, closing bool) (_ uint32, err error) {
	defer func() {
		if err != nil || low != noRank {
			c.troubled.Store(true)
		}
	}()
	var hb *hostBarrier
	if !closing { // Close's barrier keeps to messages (see closing above)
		if hb, err = c.hostBarrier(ctx); err != nil {
			return 0, opErr(op, -1, err)
		}
	}
	if hb != nil {
		low, err = hb.run(ctx, c, op, low)
	} else {
		low, err = c.disseminateMsgs(ctx, op, low, closing)
	}
	return low, err
}

// disseminateMsgs is disseminate over messages.
func (c *Comm) disseminateMsgs(ctx context.Context, op string, low uint32, closing bool) (uint32, error) {
	f := collFailure{dead: noRank}
	tag := c.collTag()
	var msg [8]byte
	var pending []*progress.Op // closing: sends not yet waited for
	for k, round := 1, uint32(0); k < c.size; k, round = k*2, round+1 {
		to, from := (c.rank+k)%c.size, (c.rank-k+c.size)%c.size
		binary.LittleEndian.PutUint32(msg[:], low)
		binary.LittleEndian.PutUint32(msg[4:], f.dead)
		sent, err := c.sendMsg(ctx, to, kindMsg, tag|round, msg[:], nil)
		if err != nil {
			if err := f.lost(ctx, op, to, err); err != nil {
				return 0, err
			}
		}
		m, err := c.recvMsg(ctx, from, tag|round)
		switch {
		case err != nil:
			if err := f.lost(ctx, op, from, err); err != nil {
				return 0, err
			}
		case len(m) == 8:
			low = min(low, binary.LittleEndian.Uint32(m))
			f.heard(binary.LittleEndian.Uint32(m[4:]))
		}
		if sent != nil && closing {
			pending = append(pending, sent)
		} else if sent != nil {
			if err := sent.Wait(ctx); err != nil {
				if err := f.lost(ctx, op, to, err); err != nil {
					return 0, err
				}
			}
		}
	}
	if err := f.err(op); err != nil {
		return 0, err
	}
	for _, sent := range pending {
		if err := sent.Wait(ctx); err != nil {
			c.cfg.Logger.Debug("rma: a closing barrier's message was not acknowledged", "rank", c.rank, "err", err)
		}
	}
	return low, nil
}

// Bcast copies root's buf into every rank's buf (binomial tree). All ranks
// pass buffers of the same length. A rank whose parent in the tree is dead,
// or sent a length other than its own, passes that on to its subtree
// instead of data, so every rank returns in bounded time: with ErrPeer
// naming the dead rank, or ErrDatatype.
func (c *Comm) Bcast(ctx context.Context, root int, buf []byte) error {
	if err := c.checkRank("bcast", root); err != nil {
		return err
	}
	tag := c.collTag()
	vr := (c.rank - root + c.size) % c.size // rank relative to root
	f := collFailure{dead: noRank}
	var mismatch error
	var msg []byte // what this rank passes on: a status byte, then buf or the dead rank
	if vr == 0 {
		msg = append([]byte{blocksOK}, buf...)
	}
	mask := 1
	for mask < c.size {
		if vr&mask != 0 {
			src := (vr - mask + root) % c.size
			m, err := c.recvMsg(ctx, src, tag)
			switch {
			case err != nil:
				if err := f.lost(ctx, "bcast", src, err); err != nil {
					return err
				}
			case len(m) == 5 && m[0] == blocksFailed:
				f.heard(binary.LittleEndian.Uint32(m[1:]))
			case len(m) >= 1 && m[0] == blocksMismatch:
				mismatch = opErr("bcast", src, fmt.Errorf("%w: the broadcast's lengths differ", ErrDatatype))
			case len(m) != len(buf)+1 || m[0] != blocksOK:
				mismatch = opErr("bcast", src, fmt.Errorf("%w: %d bytes received into %d", ErrDatatype, max(len(m)-1, 0), len(buf)))
			default:
				copy(buf, m[1:])
				msg = m
			}
			break
		}
		mask <<= 1
	}
	switch {
	case f.dead != noRank:
		msg = binary.LittleEndian.AppendUint32([]byte{blocksFailed}, f.dead)
	case mismatch != nil:
		msg = []byte{blocksMismatch}
	}
	mask >>= 1
	var reqs []*Request
	for ; mask > 0; mask >>= 1 {
		if vr+mask < c.size {
			dst := (vr + mask + root) % c.size
			op, err := c.sendMsg(ctx, dst, kindMsg, tag, msg, nil)
			if err != nil {
				if err := f.lost(ctx, "bcast", dst, err); err != nil {
					return err
				}
				continue
			}
			reqs = append(reqs, &Request{op: op, name: "bcast", rank: dst})
		}
	}
	for _, r := range reqs {
		if err := r.Wait(ctx); err != nil {
			if err := f.lost(ctx, "bcast", r.rank, err); err != nil {
				return err
			}
		}
	}
	if err := f.err("bcast"); err != nil {
		return err
	}
	return mismatch
}

// Allgather returns every rank's contribution, indexed by rank, the same
// on every rank. Contributions may differ in length.
//
// No rank funnels the others (gathering at rank 0 connected it to every
// rank and swamped it at scale): each rank takes ceil(log2 size) rounds of
// one message sent and one received, so it connects to O(log size) peers,
// a subset of Barrier's (rank ± 2^k), which Fence, Free and Close connect
// anyway. With a power-of-two size, recursive doubling: round k swaps the
// 2^k blocks gathered so far with rank XOR 2^k, one partner a round.
// Otherwise Bruck's algorithm in its dissemination form: round k sends the
// min(2^k, size-2^k) blocks gathered so far to rank+2^k and receives as
// many from rank-2^k (blocks are stored by rank: no final rotation).
// These are MPICH's choices for short contributions, and Allgather's
// callers (window descriptions, Allreduce) pass tens of bytes. The ring
// MPICH takes for long ones would cost size-1 rounds here, and picking by
// length would need an agreement first, as each rank knows only its own.
//
// A rank that finds a partner dead (ErrPeer) goes on with the rounds,
// sending in place of its blocks the lowest rank it knows dead, so that
// every rank finishes (none waits for a message that never comes) and
// fails with ErrPeer naming that rank, as Barrier does.
func (c *Comm) Allgather(ctx context.Context, mine []byte) (_ [][]byte, err error) {
	tag := c.collTag()
	out := make([][]byte, c.size)
	out[c.rank] = append([]byte{}, mine...)
	defer func() {
		if err != nil {
			c.troubled.Store(true) // peers may never come: bound Close
		}
	}()
	f := collFailure{dead: noRank}
	pow2 := c.size&(c.size-1) == 0
	for d, round := 1, uint32(0); d < c.size; d, round = d*2, round+1 {
		if pow2 {
			// Both partners hold aligned groups of d ranks.
			peer := c.rank ^ d
			err = c.swapBlocks(ctx, tag|round, peer, c.blocks(c.rank&^(d-1), d, 1), peer, c.blocks(peer&^(d-1), d, 1), out, &f)
		} else {
			// A rank holds itself and the ranks before it.
			n := min(d, c.size-d)
			to, from := (c.rank+d)%c.size, (c.rank-d+c.size)%c.size
			err = c.swapBlocks(ctx, tag|round, to, c.blocks(c.rank, n, -1), from, c.blocks(from, n, -1), out, &f)
		}
		if err != nil {
			return nil, err
		}
	}
	if err := f.err("allgather"); err != nil {
		return nil, err
	}
	return out, nil
}

// collFailure is what a rank knows, during a collective, of ranks found
// dead: the lowest, and the first error that showed one.
type collFailure struct {
	dead  uint32
	first error
}

// lost records that r failed with e if e says r is dead, and returns nil
// so that the collective goes on; any other error (this rank's own
// context ended) it returns, for the collective to stop.
func (f *collFailure) lost(ctx context.Context, op string, r int, e error) error {
	if !errors.Is(e, ErrPeer) || ctx.Err() != nil {
		return opErr(op, r, e)
	}
	f.dead = min(f.dead, uint32(r))
	f.first = cmp.Or(f.first, e)
	return nil
}

// heard records a rank that a partner reported dead.
func (f *collFailure) heard(r uint32) { f.dead = min(f.dead, r) }

// err is the collective's error: ErrPeer naming the lowest dead rank.
func (f *collFailure) err(op string) error {
	if f.dead == noRank {
		return nil
	}
	return opErr(op, int(f.dead), fmt.Errorf("%w: rank %d failed (%w)", ErrPeer, f.dead, cmp.Or(f.first, ErrPeer)))
}

// blocks lists n ranks from first on, step apart, modulo size.
func (c *Comm) blocks(first, n, step int) []int {
	rs := make([]int, n)
	for i := range rs {
		rs[i] = ((first+i*step)%c.size + c.size) % c.size
	}
	return rs
}

// Allgather and Bcast messages start with a status byte: the data follow,
// or the lowest rank the sender knows dead.
const (
	blocksOK       = 0
	blocksFailed   = 1
	blocksMismatch = 2 // Bcast: a length differed above this rank
)

// swapBlocks is one round of Allgather: it sends the contributions of
// ranks send to dst and stores those of ranks recv, received from src;
// once a rank is known dead (f), it sends that instead. A dead partner
// is recorded in f, not returned. It waits for its send even when the
// receive failed, so that no Op outlives the call (unless ctx has ended:
// the Op then finishes on its own and only returns its staging buffers).
func (c *Comm) swapBlocks(ctx context.Context, tag uint32, dst int, send []int, src int, recv []int, out [][]byte, f *collFailure) error {
	msg := []byte{blocksOK}
	if f.dead != noRank {
		msg = binary.LittleEndian.AppendUint32([]byte{blocksFailed}, f.dead)
	} else {
		for _, r := range send {
			msg = binary.LittleEndian.AppendUint32(msg, uint32(len(out[r])))
			msg = append(msg, out[r]...)
		}
	}
	sent, err := c.sendMsg(ctx, dst, kindMsg, tag, msg, nil)
	if err != nil {
		if err := f.lost(ctx, "allgather", dst, err); err != nil {
			return err
		}
		sent = nil
	}
	m, err := c.recvMsg(ctx, src, tag)
	switch {
	case err != nil:
		err = f.lost(ctx, "allgather", src, err)
	case len(m) == 5 && m[0] == blocksFailed:
		f.heard(binary.LittleEndian.Uint32(m[1:]))
	case len(m) == 0 || m[0] != blocksOK:
		err = opErr("allgather", src, fmt.Errorf("%w: allgather message of status %v", ErrDatatype, m[:min(len(m), 1)]))
	case f.dead == noRank:
		if err = decodeBlocks(m[1:], recv, out); err != nil {
			err = opErr("allgather", src, err)
		}
	}
	if sent != nil {
		if werr := sent.Wait(ctx); werr != nil && err == nil {
			err = f.lost(ctx, "allgather", dst, werr)
		}
	}
	return err
}

// decodeBlocks stores the length-prefixed contributions of ranks that m
// holds, in order, into out. They alias m, which belongs to the caller.
func decodeBlocks(m []byte, ranks []int, out [][]byte) error {
	for _, r := range ranks {
		if len(m) < 4 || uint64(binary.LittleEndian.Uint32(m)) > uint64(len(m)-4) {
			return fmt.Errorf("%w: allgather message short at rank %d's block", ErrDatatype, r)
		}
		l := int(binary.LittleEndian.Uint32(m))
		out[r], m = m[4:4+l:4+l], m[4+l:]
	}
	if len(m) != 0 {
		return fmt.Errorf("%w: allgather message has %d bytes too many", ErrDatatype, len(m))
	}
	return nil
}

// ReduceOp is the reduction of Allreduce.
type ReduceOp uint8

// Reductions.
const (
	ReduceSum ReduceOp = iota + 1
	ReduceMin
	ReduceMax
)

// AllreduceInt64 replaces vals, on every rank, by the element-wise
// reduction over all ranks' vals (same length everywhere).
func (c *Comm) AllreduceInt64(ctx context.Context, op ReduceOp, vals []int64) error {
	return allreduce(ctx, c, op, vals, func(v int64) uint64 { return uint64(v) }, func(u uint64) int64 { return int64(u) })
}

// AllreduceFloat64 is AllreduceInt64 over float64. The reduction is taken
// in rank order, so every rank gets the same bits.
func (c *Comm) AllreduceFloat64(ctx context.Context, op ReduceOp, vals []float64) error {
	return allreduce(ctx, c, op, vals, math.Float64bits, math.Float64frombits)
}

// allreduce gathers every rank's values (as 8-byte words) and reduces
// them locally in rank order, whatever order Allgather received them in.
func allreduce[T int64 | float64](ctx context.Context, c *Comm, op ReduceOp, vals []T, enc func(T) uint64, dec func(uint64) T) error {
	b := make([]byte, 8*len(vals))
	for i, v := range vals {
		binary.LittleEndian.PutUint64(b[8*i:], enc(v))
	}
	all, err := c.Allgather(ctx, b)
	if err != nil {
		return err
	}
	for r, m := range all {
		if len(m) != len(b) {
			return opErr("allreduce", r, fmt.Errorf("%w: %d values against %d", ErrDatatype, len(m)/8, len(vals)))
		}
		for i := range vals {
			x := dec(binary.LittleEndian.Uint64(m[8*i:]))
			switch {
			case r == 0:
				vals[i] = x
			case op == ReduceSum:
				vals[i] += x
			case op == ReduceMin:
				vals[i] = min(vals[i], x)
			case op == ReduceMax:
				vals[i] = max(vals[i], x)
			}
		}
	}
	return nil
}
