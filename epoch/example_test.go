package epoch_test

import (
	"context"
	"fmt"

	"github.com/rvma/rvma/epoch"
	"github.com/rvma/rvma/mailbox"
	"github.com/rvma/rvma/verbs"
)

// A mailbox window keeps an epoch.History of its completed buffers
// (mailbox.Config.History): here the last 2 of 3 steps, each step one
// put that completes an epoch. Window.Records reads the history back,
// most recent first, each record with its buffer.
func Example() {
	ctx := context.Background()
	devA, _ := verbs.Open(ctx, "loop://epoch-example", nil)
	defer devA.Close()
	devB, _ := verbs.Open(ctx, "loop://epoch-example", nil)
	defer devB.Close()
	pdA, _ := devA.AllocPD()
	pdB, _ := devB.AllocPD()
	cqA, _ := devA.CreateCQ(verbs.CQConfig{})
	cqB, _ := devB.CreateCQ(verbs.CQConfig{})
	qpA, _ := pdA.CreateQP(verbs.QPConfig{SendCQ: cqA})
	qpB, _ := pdB.CreateQP(verbs.QPConfig{SendCQ: cqB})
	qpA.Connect(qpB.Endpoint(), nil)
	qpB.Connect(qpA.Endpoint(), nil)

	// Target: mailbox 5, an epoch per 6 bytes, the last 2 retained.
	win, err := mailbox.NewTarget(devB, nil).Init(5, mailbox.Config{Threshold: 6, History: 2})
	if err != nil {
		panic(err)
	}
	// Initiator: three steps.
	src := []byte("step-1step-2step-3")
	mr, _ := pdA.RegisterMR(src, 0)
	in := mailbox.NewInitiator(qpA, cqA)
	for step := 0; step < 3; step++ {
		win.Post(make([]byte, 6))
		if err := in.Put(ctx, 5, 0, mr.SGE(6*step, 6)); err != nil {
			panic(err)
		}
		if _, err := win.Wait(ctx); err != nil {
			panic(err)
		}
	}

	for _, r := range win.Records(10) {
		fmt.Printf("epoch %d: %d bytes in %d put: %s\n", r.Epoch, r.Bytes, r.Ops, r.Data)
	}
	// Output:
	// epoch 2: 6 bytes in 1 put: step-3
	// epoch 1: 6 bytes in 1 put: step-2
}

// A History on its own: a bounded ring of records, newest last. Add hands
// back the record it evicts once full, whose buffer is the caller's again.
func ExampleNew() {
	h := epoch.New(2)
	for e := uint64(0); e < 3; e++ {
		buf := []byte(fmt.Sprintf("data of epoch %d", e))
		if old, ok := h.Add(epoch.Record{Epoch: e, Bytes: len(buf), Data: buf}); ok {
			fmt.Printf("evicted epoch %d: %s\n", old.Epoch, old.Data)
		}
	}
	last, _ := h.At(1)
	fmt.Println(h.Len(), "of", h.Cap(), "retained; the last is epoch", last.Epoch)
	// Output:
	// evicted epoch 0: data of epoch 0
	// 2 of 2 retained; the last is epoch 2
}

// Rewind after a failure: Rewind(k) returns the record k epochs back, the
// state to restart from, and drops the k most recent records (that one
// included); their buffers are the caller's again. Asking for more than
// is retained fails with ErrNotRetained.
func ExampleHistory_Rewind() {
	h := epoch.New(4)
	for e := uint64(0); e < 4; e++ {
		h.Add(epoch.Record{Epoch: e, Data: []byte(fmt.Sprintf("state %d", e))})
	}
	// Epoch 3 went wrong: restart from epoch 2's state.
	r, dropped, err := h.Rewind(2)
	if err != nil {
		panic(err)
	}
	fmt.Printf("restart from epoch %d (%s); dropped %d records; %d retained\n", r.Epoch, r.Data, len(dropped), h.Len())
	_, _, err = h.Rewind(3)
	fmt.Println(err)
	// Output:
	// restart from epoch 2 (state 2); dropped 2 records; 2 retained
	// epoch: not retained: 3 epochs back, 2 retained
}
