package verbs_test

import (
	"context"
	"testing"

	"github.com/rvma/rvma/verbs"
	"github.com/rvma/rvma/verbs/verbstest"
)

// benchPair connects two loop devices.
func benchPair(b *testing.B, size int) (a, t *verbstest.Side) {
	return verbstest.Pair(b, verbstest.Loop(), verbstest.PairConfig{BufSize: max(size, 64)})
}

func BenchmarkWrite(b *testing.B) {
	benchRDMA(b, verbstest.Loop(), verbs.OpWrite, 8, 4096, 65536, 1<<20)
}
func BenchmarkRead(b *testing.B) { benchRDMA(b, verbstest.Loop(), verbs.OpRead, 8, 65536, 1<<20) }

// The same over the udp provider on loopback: every packet is encoded,
// sent, received, decoded and verified, so allocs/op covers the socket
// path too.
func BenchmarkWriteUDP(b *testing.B) { benchRDMA(b, verbstest.UDP(), verbs.OpWrite, 8, 65536, 1<<20) }
func BenchmarkReadUDP(b *testing.B)  { benchRDMA(b, verbstest.UDP(), verbs.OpRead, 8, 65536) }

// benchRDMA posts one signaled WRITE or READ of each size and polls its
// completion per op: the steady-state post + poll path.
func benchRDMA(b *testing.B, env verbstest.Env, op verbs.Opcode, sizes ...int) {
	for _, size := range sizes {
		b.Run(sizeName(size), func(b *testing.B) {
			a, t := verbstest.Pair(b, env, verbstest.PairConfig{BufSize: max(size, 64)})
			wrs := []verbs.SendWR{{Opcode: op, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{a.MR.SGE(0, size)},
				RemoteAddr: t.MR.Addr(), RKey: t.MR.RKey()}}
			run(b, a, wrs, size)
		})
	}
}

func BenchmarkFetchAdd(b *testing.B) {
	a, t := benchPair(b, 8)
	wrs := []verbs.SendWR{{Opcode: verbs.OpFetchAdd, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{a.MR.SGE(0, 8)},
		RemoteAddr: t.MR.Addr(), RKey: t.MR.RKey(), CompareAdd: 1}}
	run(b, a, wrs, 8)
}

func BenchmarkSend(b *testing.B) {
	a, t := benchPair(b, 4096)
	wrs := []verbs.SendWR{{Opcode: verbs.OpSend, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{a.MR.SGE(0, 64)}}}
	rwr := []verbs.RecvWR{{SGL: []verbs.SGE{t.MR.SGE(0, 64)}}}
	twcs := make([]verbs.WorkCompletion, 4)
	wcs := make([]verbs.WorkCompletion, 4)
	ctx := context.Background()
	b.SetBytes(64)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := t.QP.PostRecv(rwr); err != nil {
			b.Fatal(err)
		}
		if _, err := a.QP.PostSend(wrs); err != nil {
			b.Fatal(err)
		}
		if n, err := a.CQ.WaitPoll(ctx, wcs); err != nil || n != 1 {
			b.Fatal(err)
		}
		if n, err := t.CQ.WaitPoll(ctx, twcs); err != nil || n != 1 {
			b.Fatal(err)
		}
	}
}

func run(b *testing.B, a *verbstest.Side, wrs []verbs.SendWR, size int) {
	wcs := make([]verbs.WorkCompletion, 4)
	ctx := context.Background()
	b.SetBytes(int64(size))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := a.QP.PostSend(wrs); err != nil {
			b.Fatal(err)
		}
		n, err := a.CQ.WaitPoll(ctx, wcs)
		if err != nil || n != 1 || wcs[0].Status != verbs.StatusSuccess {
			b.Fatalf("completion %d %v %+v", n, err, wcs[0])
		}
	}
}

func sizeName(n int) string {
	switch {
	case n >= 1<<20:
		return itoa(n>>20) + "MiB"
	case n >= 1<<10:
		return itoa(n>>10) + "KiB"
	}
	return itoa(n) + "B"
}

func itoa(n int) string {
	if n < 10 {
		return string(rune('0' + n))
	}
	return itoa(n/10) + string(rune('0'+n%10))
}
