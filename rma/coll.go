package rma

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
)

// Collectives: every rank calls them in the same order. Each call takes a
// fresh internal tag, so consecutive collectives never mix.

func (c *Comm) collTag() uint32 {
	return 1<<31 | (c.collSeq.Add(1)&0x1ffffff)<<5
}

// Barrier returns once every rank has entered it (dissemination: log2(size)
// rounds of one message each).
func (c *Comm) Barrier(ctx context.Context) error {
	_, err := c.disseminate(ctx, "barrier", noRank)
	return err
}

const noRank = math.MaxUint32

// agree is a barrier that also spreads failure: each rank passes the
// error its part of a collective call ended with, and every rank learns
// whether any failed. It returns nil if none did or only this rank did (the
// caller has its own error), else ErrRemote naming the lowest failed rank,
// so that no rank waits for one that left the call early.
func (c *Comm) agree(ctx context.Context, op string, mine error) error {
	low := uint32(noRank)
	if mine != nil {
		low = uint32(c.rank)
	}
	low, err := c.disseminate(ctx, op, low)
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
// rank has heard, directly or not, from the 2^k ranks before it.
func (c *Comm) disseminate(ctx context.Context, op string, low uint32) (_ uint32, err error) {
	defer func() {
		if err != nil || low != noRank {
			c.troubled.Store(true)
		}
	}()
	tag := c.collTag()
	for k, round := 1, uint32(0); k < c.size; k, round = k*2, round+1 {
		to, from := (c.rank+k)%c.size, (c.rank-k+c.size)%c.size
		sent, err := c.sendMsg(ctx, to, kindMsg, tag|round, binary.LittleEndian.AppendUint32(nil, low), nil)
		if err != nil {
			return 0, opErr(op, to, err)
		}
		m, err := c.recvMsg(ctx, from, tag|round)
		if err != nil {
			return 0, opErr(op, from, err)
		}
		if len(m) == 4 {
			low = min(low, binary.LittleEndian.Uint32(m))
		}
		if err := sent.Wait(ctx); err != nil {
			return 0, opErr(op, to, err)
		}
	}
	return low, nil
}

// Bcast copies root's buf into every rank's buf (binomial tree). All ranks
// pass buffers of the same length.
func (c *Comm) Bcast(ctx context.Context, root int, buf []byte) error {
	if err := c.checkRank("bcast", root); err != nil {
		return err
	}
	tag := c.collTag()
	vr := (c.rank - root + c.size) % c.size // rank relative to root
	mask := 1
	for mask < c.size {
		if vr&mask != 0 {
			src := (vr - mask + root) % c.size
			m, err := c.recvMsg(ctx, src, tag)
			if err != nil {
				return opErr("bcast", src, err)
			}
			if len(m) != len(buf) {
				return opErr("bcast", src, fmt.Errorf("%w: %d bytes received into %d", ErrDatatype, len(m), len(buf)))
			}
			copy(buf, m)
			break
		}
		mask <<= 1
	}
	mask >>= 1
	var reqs []*Request
	for ; mask > 0; mask >>= 1 {
		if vr+mask < c.size {
			dst := (vr + mask + root) % c.size
			op, err := c.sendMsg(ctx, dst, kindMsg, tag, buf, nil)
			if err != nil {
				return opErr("bcast", dst, err)
			}
			reqs = append(reqs, &Request{op: op, name: "bcast", rank: dst})
		}
	}
	return WaitAll(ctx, reqs...)
}

// Allgather returns every rank's contribution, indexed by rank.
// Contributions may differ in length.
func (c *Comm) Allgather(ctx context.Context, mine []byte) ([][]byte, error) {
	tag := c.collTag()
	out := make([][]byte, c.size)
	out[c.rank] = append([]byte(nil), mine...)
	if c.size == 1 {
		return out, nil
	}
	// Gather at rank 0, which then broadcasts the concatenation.
	var all []byte
	if c.rank != 0 {
		op, err := c.sendMsg(ctx, 0, kindMsg, tag, mine, nil)
		if err != nil {
			return nil, opErr("allgather", 0, err)
		}
		if err := op.Wait(ctx); err != nil {
			return nil, opErr("allgather", 0, err)
		}
	} else {
		for r := 1; r < c.size; r++ {
			m, err := c.recvMsg(ctx, r, tag)
			if err != nil {
				return nil, opErr("allgather", r, err)
			}
			out[r] = m
		}
		for _, m := range out {
			all = binary.LittleEndian.AppendUint32(all, uint32(len(m)))
			all = append(all, m...)
		}
	}
	// Broadcast the length first, then the bytes.
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(all)))
	if err := c.Bcast(ctx, 0, n[:]); err != nil {
		return nil, err
	}
	if c.rank != 0 {
		all = make([]byte, binary.LittleEndian.Uint64(n[:]))
	}
	if err := c.Bcast(ctx, 0, all); err != nil {
		return nil, err
	}
	if c.rank != 0 {
		for r := range c.size {
			if len(all) < 4 {
				return nil, opErr("allgather", 0, fmt.Errorf("%w: short gather", ErrDatatype))
			}
			l := int(binary.LittleEndian.Uint32(all))
			all = all[4:]
			if l > len(all) {
				return nil, opErr("allgather", 0, fmt.Errorf("%w: short gather", ErrDatatype))
			}
			out[r] = all[:l:l]
			all = all[l:]
		}
	}
	return out, nil
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
// them locally in rank order.
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
