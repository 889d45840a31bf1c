package reliability_test

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/rvma/rvma/reliability"
	"github.com/rvma/rvma/verbs"
)

// end is one side of a connection: its device and its reliability.Conn.
type end struct {
	dev  *verbs.Device
	conn *reliability.Conn
}

// pair opens two devices on an in-process fabric with a 4 KiB MTU, gives
// each a UC queue pair shaped by reliability.QPConfig, connects the two
// (by hand here; across hosts cm.Dial and Request.Accept do it, UC
// included), and starts a reliability.Conn on each, with cfg.
func pair(fabric string, cfg reliability.Config) (a, b end) {
	ctx := context.Background()
	var pds [2]*verbs.PD
	var cqs [2]*verbs.CQ
	var qps [2]*verbs.QP
	var devs [2]*verbs.Device
	for i := range devs {
		dev, err := verbs.Open(ctx, "loop://"+fabric+"?mtu=4096", nil)
		if err != nil {
			panic(err)
		}
		devs[i] = dev
		pds[i], _ = dev.AllocPD()
		cqs[i], _ = dev.CreateCQ(verbs.CQConfig{Capacity: 2 * reliability.DefaultRecvDepth})
		if qps[i], err = pds[i].CreateQP(reliability.QPConfig(cqs[i], cfg)); err != nil {
			panic(err)
		}
	}
	qps[0].Connect(qps[1].Endpoint(), nil)
	qps[1].Connect(qps[0].Endpoint(), nil)
	var ends [2]end
	for i := range ends {
		conn, err := reliability.New(pds[i], qps[i], cqs[i], cfg)
		if err != nil {
			panic(err)
		}
		ends[i] = end{devs[i], conn}
	}
	return ends[0], ends[1]
}

func (e end) close() {
	e.conn.Close()
	e.dev.Close()
}

// A message over an unreliable-connected QP: the receiver posts a buffer,
// the sender's Send lands in it chunk by chunk, and both Waits return once
// the receiver's bitmap is full. The application never handles an address
// or an rkey: the receiver registers each posted buffer afresh and sends
// its keys to the sender itself (the clear-to-send in its status). The
// receiver learns no length from the sender: a message fills its posted
// buffer exactly (a longer one fails with ErrTooLarge, and a shorter one
// leaves the receive incomplete until Recv.Take ends it).
func ExampleNew() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sender, receiver := pair("reliability-example-new", reliability.Config{})
	defer sender.close()
	defer receiver.close()

	data := bytes.Repeat([]byte("long-haul RDMA, "), 4<<10) // 64 KiB
	buf := make([]byte, len(data))
	recv, err := receiver.conn.Post(ctx, buf)
	if err != nil {
		panic(err)
	}
	send, err := sender.conn.Send(ctx, data, &reliability.SendOptions{Scheme: reliability.SR})
	if err != nil {
		panic(err)
	}
	res, err := send.Wait(ctx)
	if err != nil {
		panic(err)
	}
	if err := recv.Wait(ctx); err != nil {
		panic(err)
	}
	fmt.Printf("sent %d bytes by %v in chunks of %d\n", res.Bytes, res.Scheme, res.Chunk)
	fmt.Printf("received %d of %d chunks, intact: %v\n",
		recv.Bitmap().Count(), recv.Stats().Chunks, bytes.Equal(buf, data))
	// Output:
	// sent 65536 bytes by sr in chunks of 4096
	// received 16 of 16 chunks, intact: true
}

// Erasure coding on a lossy link: every stripe of K data chunks is
// followed by M parity chunks, the receiver rebuilds what was lost from
// them, and selective repeat repairs the rest. With 5% of the packets
// dropped both ways, every byte still arrives.
func ExampleConn_Send() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sender, receiver := pair("reliability-example-send", reliability.Config{})
	defer sender.close()
	defer receiver.close()
	for _, e := range []end{sender, receiver} {
		e.dev.SetFaults(-1, verbs.Faults{Drop: 0.05, Seed: 1})
	}

	data := bytes.Repeat([]byte("erasure-coded!! "), 16<<10) // 256 KiB: 64 chunks
	buf := make([]byte, len(data))
	recv, err := receiver.conn.Post(ctx, buf)
	if err != nil {
		panic(err)
	}
	send, err := sender.conn.Send(ctx, data, &reliability.SendOptions{Scheme: reliability.EC, M: 4})
	if err != nil {
		panic(err)
	}
	res, err := send.Wait(ctx)
	if err != nil {
		panic(err)
	}
	if err := recv.Wait(ctx); err != nil {
		panic(err)
	}
	fmt.Printf("%v with stripes of %d+%d: %d bytes, intact: %v\n",
		res.Scheme, res.K, res.M, res.Bytes, bytes.Equal(buf, data))
	// Output: ec with stripes of 32+4: 262144 bytes, intact: true
}

// The completion-time model behind Scheme Auto, asked directly: for 64 MiB
// over a 10 Gbit/s link with a 20 ms round trip, selective repeat wins on
// a clean link, and erasure coding once chunks are lost.
func ExampleChoose() {
	rtt := 20 * time.Millisecond
	for _, loss := range []float64{0, 0.01} {
		link := reliability.Link{Rate: 10e9 / 8, RTT: rtt, Loss: loss}
		best, _ := reliability.Choose(link, 64<<20, 4096, 32, []int{1, 2, 4, 8}, rtt, rtt/4)
		fmt.Printf("chunk loss %v: %v, K=%d M=%d\n", loss, best.Scheme, best.K, best.M)
	}
	// Output:
	// chunk loss 0: sr, K=0 M=0
	// chunk loss 0.01: ec, K=32 M=4
}
