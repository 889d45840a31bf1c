package verbs_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/rvma/rvma/verbs"
)

// A queue pair on each of two devices, connected by hand (package cm does
// this over TCP), an RDMA WRITE and its completion.
func Example() {
	ctx := context.Background()
	open := func() (*verbs.Device, *verbs.PD, *verbs.CQ, *verbs.QP) {
		dev, _ := verbs.Open(ctx, "loop://example", nil)
		pd, _ := dev.AllocPD()
		cq, _ := dev.CreateCQ(verbs.CQConfig{})
		qp, _ := pd.CreateQP(verbs.QPConfig{Type: verbs.RC, SendCQ: cq})
		return dev, pd, cq, qp
	}
	devA, pdA, cqA, qpA := open()
	defer devA.Close()
	devB, pdB, _, qpB := open()
	defer devB.Close()
	if err := qpA.Connect(qpB.Endpoint(), nil); err != nil {
		panic(err)
	}
	if err := qpB.Connect(qpA.Endpoint(), nil); err != nil {
		panic(err)
	}

	src := []byte("hello, remote memory")
	srcMR, _ := pdA.RegisterMR(src, 0)
	dst := make([]byte, 64)
	dstMR, _ := pdB.RegisterMR(dst, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)

	_, err := qpA.PostSend([]verbs.SendWR{{
		ID: 1, Opcode: verbs.OpWrite, Flags: verbs.FlagSignaled,
		SGL:        []verbs.SGE{srcMR.SGE(0, len(src))},
		RemoteAddr: dstMR.Addr(), RKey: dstMR.RKey(),
	}})
	if err != nil {
		panic(err)
	}
	wcs := make([]verbs.WorkCompletion, 1)
	if _, err := cqA.WaitPoll(ctx, wcs); err != nil {
		panic(err)
	}
	fmt.Println(wcs[0].Opcode, wcs[0].Status, wcs[0].ByteLen)
	fmt.Println(string(dst[:len(src)]))
	// Output:
	// RDMA_WRITE success 20
	// hello, remote memory
}

// Fetch-and-add on a counter in another device's memory.
func ExampleOpcode_fetchAdd() {
	ctx := context.Background()
	devA, _ := verbs.Open(ctx, "loop://example-atomic", nil)
	defer devA.Close()
	devB, _ := verbs.Open(ctx, "loop://example-atomic", nil)
	defer devB.Close()
	pdA, _ := devA.AllocPD()
	pdB, _ := devB.AllocPD()
	cq, _ := devA.CreateCQ(verbs.CQConfig{})
	cqB, _ := devB.CreateCQ(verbs.CQConfig{})
	qpA, _ := pdA.CreateQP(verbs.QPConfig{SendCQ: cq})
	qpB, _ := pdB.CreateQP(verbs.QPConfig{SendCQ: cqB})
	qpA.Connect(qpB.Endpoint(), nil)
	qpB.Connect(qpA.Endpoint(), nil)

	counter := make([]byte, 8)
	binary.NativeEndian.PutUint64(counter, 100)
	counterMR, _ := pdB.RegisterMR(counter, verbs.AccessLocalWrite|verbs.AccessRemoteAtomic)
	result := make([]byte, 8)
	resultMR, _ := pdA.RegisterMR(result, verbs.AccessLocalWrite)

	qpA.PostSend([]verbs.SendWR{{
		Opcode: verbs.OpFetchAdd, Flags: verbs.FlagSignaled, CompareAdd: 5,
		SGL:        []verbs.SGE{resultMR.SGE(0, 8)},
		RemoteAddr: counterMR.Addr(), RKey: counterMR.RKey(),
	}})
	wcs := make([]verbs.WorkCompletion, 1)
	cq.WaitPoll(ctx, wcs)
	fmt.Println("fetched", binary.NativeEndian.Uint64(result), "now", binary.NativeEndian.Uint64(counter))
	// Output: fetched 100 now 105
}

// Injected faults: RC still delivers exactly once.
func ExampleDevice_SetFaults() {
	ctx := context.Background()
	devA, _ := verbs.Open(ctx, "loop://example-faults", nil)
	defer devA.Close()
	devB, _ := verbs.Open(ctx, "loop://example-faults", nil)
	defer devB.Close()
	devA.SetFaults(-1, verbs.Faults{Drop: 0.2, Duplicate: 0.2, Seed: 42})

	pdA, _ := devA.AllocPD()
	pdB, _ := devB.AllocPD()
	cqA, _ := devA.CreateCQ(verbs.CQConfig{})
	cqB, _ := devB.CreateCQ(verbs.CQConfig{})
	qpA, _ := pdA.CreateQP(verbs.QPConfig{SendCQ: cqA})
	qpB, _ := pdB.CreateQP(verbs.QPConfig{SendCQ: cqB})
	cfg := &verbs.ConnectConfig{Timeout: time.Millisecond}
	qpA.Connect(qpB.Endpoint(), cfg)
	qpB.Connect(qpA.Endpoint(), cfg)

	counter := make([]byte, 8)
	counterMR, _ := pdB.RegisterMR(counter, verbs.AccessLocalWrite|verbs.AccessRemoteAtomic)
	result := make([]byte, 8)
	resultMR, _ := pdA.RegisterMR(result, verbs.AccessLocalWrite)
	wcs := make([]verbs.WorkCompletion, 1)
	for i := 0; i < 100; i++ {
		qpA.PostSend([]verbs.SendWR{{Opcode: verbs.OpFetchAdd, Flags: verbs.FlagSignaled, CompareAdd: 1,
			SGL: []verbs.SGE{resultMR.SGE(0, 8)}, RemoteAddr: counterMR.Addr(), RKey: counterMR.RKey()}})
		cqA.WaitPoll(ctx, wcs)
	}
	fmt.Println("counter:", binary.NativeEndian.Uint64(counter))
	// Output: counter: 100
}
