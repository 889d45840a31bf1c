package mailbox_test

import (
	"context"
	"fmt"

	"github.com/rvma/rvma/mailbox"
	"github.com/rvma/rvma/verbs"
)

// connect opens two loop devices with a connected RC QP pair and returns
// the initiator's PD, QP and send CQ.
func connect(fabric string) (a, b *verbs.Device, pa *verbs.PD, qa *verbs.QP, cqa *verbs.CQ) {
	ctx := context.Background()
	a, _ = verbs.Open(ctx, "loop://"+fabric, nil)
	b, _ = verbs.Open(ctx, "loop://"+fabric, nil)
	pa, _ = a.AllocPD()
	pb, _ := b.AllocPD()
	cqa, _ = a.CreateCQ(verbs.CQConfig{})
	cqb, _ := b.CreateCQ(verbs.CQConfig{})
	qa, _ = pa.CreateQP(verbs.QPConfig{SendCQ: cqa})
	qb, _ := pb.CreateQP(verbs.QPConfig{SendCQ: cqb})
	qa.Connect(qb.Endpoint(), nil)
	qb.Connect(qa.Endpoint(), nil)
	return a, b, pa, qa, cqa
}

// The target side: a window on mailbox address 42 that completes an epoch
// when 8 bytes have arrived, and the initiator side: two puts of 4 bytes
// to mailbox 42 at offsets 4 and 0. The target never told the initiator an
// address or a key, and needs no message besides the data to know the
// epoch is complete.
func Example() {
	ctx := context.Background()
	devA, devB, pd, qp, cq := connect("mailbox-example")
	defer devA.Close()
	defer devB.Close()

	// Target.
	target := mailbox.NewTarget(devB, nil)
	win, _ := target.Init(42, mailbox.Config{Threshold: 8})
	win.Post(make([]byte, 8))

	// Initiator: the source must be registered in the QP's PD.
	src := []byte("rvmaput!")
	mr, _ := pd.RegisterMR(src, 0)
	in := mailbox.NewInitiator(qp, cq)
	if err := in.Put(ctx, 42, 4, mr.SGE(4, 4)); err != nil {
		panic(err)
	}
	if err := in.Put(ctx, 42, 0, mr.SGE(0, 4)); err != nil {
		panic(err)
	}

	rec, err := win.Wait(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Printf("epoch %d complete: %d bytes in %d puts: %s\n", rec.Epoch, rec.Bytes, rec.Ops, rec.Data)
	// Output: epoch 0 complete: 8 bytes in 2 puts: rvmaput!
}

// Rewind to the last completed epoch after a failed step.
func ExampleWindow_Rewind() {
	ctx := context.Background()
	devA, devB, pd, qp, cq := connect("mailbox-rewind")
	defer devA.Close()
	defer devB.Close()
	win, _ := mailbox.NewTarget(devB, nil).Init(7, mailbox.Config{Threshold: 5, History: 2})
	for i := 0; i < 3; i++ {
		win.Post(make([]byte, 5))
	}
	src := []byte("step1step2oops")
	mr, _ := pd.RegisterMR(src, 0)
	in := mailbox.NewInitiator(qp, cq)
	step := func(off, n int, complete bool) {
		if err := in.Put(ctx, 7, 0, mr.SGE(off, n)); err != nil {
			panic(err)
		}
		if complete {
			if _, err := win.Wait(ctx); err != nil {
				panic(err)
			}
		}
	}
	step(0, 5, true)   // step 1 completes
	step(5, 5, true)   // step 2 completes
	step(10, 4, false) // step 3 fails half way
	win.Abandon()

	rec, err := win.Rewind(1)
	if err != nil {
		panic(err)
	}
	fmt.Printf("restart from epoch %d: %s\n", rec.Epoch, rec.Data)
	// Output: restart from epoch 1: step2
}
