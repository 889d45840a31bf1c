package cm_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/rvma/rvma/verbs"
	"github.com/rvma/rvma/verbs/cm"
)

// rcQP opens a device on an in-process fabric and returns it with a PD, a
// CQ and an RC queue pair in Reset, ready for Dial or Request.Accept.
func rcQP(fabric string) (*verbs.Device, *verbs.PD, *verbs.CQ, *verbs.QP) {
	dev, err := verbs.Open(context.Background(), "loop://"+fabric, nil)
	if err != nil {
		panic(err)
	}
	pd, _ := dev.AllocPD()
	cq, _ := dev.CreateCQ(verbs.CQConfig{})
	qp, err := pd.CreateQP(verbs.QPConfig{Type: verbs.RC, SendCQ: cq})
	if err != nil {
		panic(err)
	}
	return dev, pd, cq, qp
}

// An authenticated connection, and the target's buffer address and rkey
// handed to the initiator in the reply's private data: the listener
// accepts with PrivateData = (raddr, rkey), Dial returns it in
// Result.PrivateData, and the initiator writes into the target's memory.
// Both sides hold the same key (at least 16 bytes): a dialer without it is
// rejected before the listener's application sees the request, and a
// reply without a valid MAC is refused by the dialer.
func ExampleDial() {
	ctx := context.Background()
	key := []byte("this job's shared key, 32 bytes.")

	// Target: a listener with the key, and memory the initiator may write.
	devT, pdT, _, qpT := rcQP("cm-example-dial")
	defer devT.Close()
	ln, err := cm.Listen(ctx, "127.0.0.1:0", &cm.ListenerConfig{Key: key})
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	dst := make([]byte, 64)
	dstMR, _ := pdT.RegisterMR(dst, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	accepted := make(chan error, 1)
	go func() {
		req, err := ln.Accept(ctx)
		if err != nil {
			accepted <- err
			return
		}
		fmt.Printf("target: request from %q\n", req.PrivateData())
		// The reply carries what the initiator needs: address and rkey.
		ref := binary.BigEndian.AppendUint64(nil, dstMR.Addr())
		ref = binary.BigEndian.AppendUint32(ref, dstMR.RKey())
		accepted <- req.Accept(ctx, qpT, &cm.Config{PrivateData: ref})
	}()

	// Initiator: Dial with the same key; the reply's private data holds
	// the target's (raddr, rkey).
	devI, pdI, cqI, qpI := rcQP("cm-example-dial")
	defer devI.Close()
	res, err := cm.Dial(ctx, ln.Addr().String(), qpI, &cm.Config{Key: key, PrivateData: []byte("rank 1")})
	if err != nil {
		panic(err)
	}
	if err := <-accepted; err != nil {
		panic(err)
	}
	raddr := binary.BigEndian.Uint64(res.PrivateData)
	rkey := binary.BigEndian.Uint32(res.PrivateData[8:])

	src := []byte("hello through the connection manager")
	srcMR, _ := pdI.RegisterMR(src, 0)
	if _, err := qpI.PostSend([]verbs.SendWR{{
		ID: 1, Opcode: verbs.OpWrite, Flags: verbs.FlagSignaled,
		SGL: []verbs.SGE{srcMR.SGE(0, len(src))}, RemoteAddr: raddr, RKey: rkey,
	}}); err != nil {
		panic(err)
	}
	wcs := make([]verbs.WorkCompletion, 1)
	if _, err := cqI.WaitPoll(ctx, wcs); err != nil {
		panic(err)
	}
	fmt.Println("initiator:", qpI.State(), wcs[0].Opcode, wcs[0].Status, wcs[0].ByteLen)
	fmt.Printf("target: %s\n", dst[:len(src)])
	// Output:
	// target: request from "rank 1"
	// initiator: RTS RDMA_WRITE success 36
	// target: hello through the connection manager
}

// A dialer without the listener's key never reaches the application: its
// request is rejected, and Dial fails with ErrRejected.
func ExampleListenerConfig() {
	ctx := context.Background()
	dev, _, _, qp := rcQP("cm-example-key")
	defer dev.Close()
	ln, err := cm.Listen(ctx, "127.0.0.1:0", &cm.ListenerConfig{Key: []byte("this job's shared key, 32 bytes.")})
	if err != nil {
		panic(err)
	}
	defer ln.Close()

	_, err = cm.Dial(ctx, ln.Addr().String(), qp, &cm.Config{Key: []byte("some other job's key, 32 bytes..")})
	fmt.Println(errors.Is(err, cm.ErrRejected), qp.State() == verbs.StateReadyToSend)
	// Output: true false
}

// The listener's application refuses a request, with a reason that the
// dialer receives in a *RejectError.
func ExampleRequest_Reject() {
	ctx := context.Background()
	devT, _, _, qpT := rcQP("cm-example-reject")
	defer devT.Close()
	dev, _, _, qp := rcQP("cm-example-reject")
	defer dev.Close()
	ln, err := cm.Listen(ctx, "127.0.0.1:0", nil)
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	go func() {
		req, err := ln.Accept(ctx)
		if err != nil {
			return
		}
		if string(req.PrivateData()) == "job 7" {
			req.Accept(ctx, qpT, nil)
		} else {
			req.Reject("not a rank of this job")
		}
	}()

	_, err = cm.Dial(ctx, ln.Addr().String(), qp, &cm.Config{PrivateData: []byte("job 8")})
	var rej *cm.RejectError
	if errors.As(err, &rej) {
		fmt.Println("rejected:", rej.Reason)
	}
	// Output: rejected: not a rank of this job
}
