package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/rvma/rvma/epoch"
	"github.com/rvma/rvma/mailbox"
	"github.com/rvma/rvma/verbs"
	"github.com/rvma/rvma/verbs/cm"
)

const finImm = 0xF1F1F1F1

// setup travels in the client's CM request; the server follows it.
type setup struct {
	Test     string        `json:"test"`
	Size     int           `json:"size"`
	Iters    int           `json:"iters"`
	Duration time.Duration `json:"duration"`
	Depth    int           `json:"depth"`
	Warmup   int           `json:"warmup"`
	QPs      int           `json:"qps"`
	Index    int           `json:"index"`
}

// region travels in both directions: where the peer may write or read.
type region struct {
	Addr uint64 `json:"addr"`
	RKey uint32 `json:"rkey"`
	Len  int    `json:"len"`
}

type hello struct {
	Setup  setup  `json:"setup"`
	Region region `json:"region"`
}

// conn is one connected QP with its buffer.
type conn struct {
	dev    *verbs.Device
	win    *mailbox.Window // put tests: this side's window
	raddr  uint64          // put tests: the peer's window address
	qp     *verbs.QP
	cq     *verbs.CQ
	mr     *verbs.MR
	buf    []byte
	remote region
	wcs    []verbs.WorkCompletion
}

type endpoint struct {
	dev *verbs.Device
	pd  *verbs.PD
	tgt *mailbox.Target
}

// Put tests: connection i uses mailbox address windowBase+i on both sides.
const windowBase = 0x52564D41_00000000

func isPut(test string) bool { return test == "put_bw" || test == "put_notify_lat" }

// put_bw's window: buffers of 1 MiB, 2048 posted, all the same memory (as
// rma's notified windows post theirs), so that the destination footprint
// equals write_bw's (which rewrites one 1 MiB region) and the comparison
// measures placement, not the cache: eight distinct 16 MiB buffers made
// put_bw a DRAM benchmark (0.30 of write_bw on loop). The queue is deep
// because the target reposts from a goroutine that can fall behind, and a
// put that finds no buffer waits for the receiver-not-ready timer (32
// posted: 0.23; 128: 0.77; 512 and more: 0.86).
const putBufBytes, putBuffers = 1 << 20, 2048

// putsPerBuffer is how many puts fill one window buffer.
func putsPerBuffer(s setup) int {
	if s.Test != "put_bw" {
		return 1
	}
	return max(1, (putBufBytes)/max(s.Size, 1))
}

// openEndpoint opens a device (noMAC: --no-mac) and a PD.
func openEndpoint(ctx context.Context, uri string, noMAC bool) (*endpoint, error) {
	dev, err := verbs.Open(ctx, uri, &verbs.DeviceConfig{NoMAC: noMAC})
	if err != nil {
		return nil, err
	}
	pd, err := dev.AllocPD()
	if err != nil {
		dev.Close()
		return nil, err
	}
	return &endpoint{dev: dev, pd: pd}, nil
}

// bufLen is the size of one half of a connection's buffer, with room past
// the message for write_lat's aligned marker word. The first half is the
// local source, the second is what the peer writes into (perftest's post
// and poll buffers).
func bufLen(size int) int { return (size+8+7)&^7 + 8 }

func (e *endpoint) newConn(s setup, gid int) (*conn, error) {
	cq, err := e.dev.CreateCQ(verbs.CQConfig{Capacity: 8192})
	if err != nil {
		return nil, err
	}
	qp, err := e.pd.CreateQP(verbs.QPConfig{SendCQ: cq, GID: gid, MaxSendWR: max(2*s.Depth, 64), MaxRecvWR: max(2*s.Depth, 64)})
	if err != nil {
		return nil, err
	}
	// Device memory, as perftest's buffers: on shm it is shared with the
	// peer process, so its WRITEs, READs and atomics are plain copies.
	mr, err := e.pd.AllocMR(2*bufLen(s.Size), verbs.AccessAll)
	if err != nil {
		return nil, err
	}
	buf := mr.Bytes()
	c := &conn{dev: e.dev, qp: qp, cq: cq, mr: mr, buf: buf, wcs: make([]verbs.WorkCompletion, 64),
		raddr: windowBase + uint64(s.Index)}
	if isPut(s.Test) {
		if e.tgt == nil {
			e.tgt = mailbox.NewTarget(e.dev, nil)
		}
		// put_notify_lat: one epoch per put. put_bw: see putBufBytes.
		per, nbuf := putsPerBuffer(s), 16
		if s.Test == "put_bw" {
			nbuf = putBuffers
		}
		c.win, err = e.tgt.Init(c.raddr, mailbox.Config{Threshold: per * max(s.Size, 1), History: 1})
		if err != nil {
			return nil, err
		}
		// Every posted buffer is the same memory (see putBufBytes), device
		// memory: on shm the peer's puts are then placed by the peer.
		mr, err := e.pd.AllocMR(per*max(s.Size, 1), verbs.AccessLocalWrite)
		if err != nil {
			return nil, err
		}
		mem := mr.Bytes()
		for i := 0; i < nbuf; i++ {
			if _, err := c.win.Post(mem); err != nil {
				return nil, err
			}
		}
	}
	return c, nil
}

// region is the half of the buffer the peer writes into and reads from.
func (c *conn) region() region {
	h := c.mr.Len() / 2
	return region{Addr: c.mr.Addr() + uint64(h), RKey: c.mr.RKey(), Len: h}
}

func (s *setup) connectConfig(mtu int) *cm.Config {
	// A short receiver-not-ready timer: send_bw's receiver reposts as it
	// goes, and a 1 ms pause per RNR NAK would measure the timer.
	return &cm.Config{Connect: &verbs.ConnectConfig{MTU: mtu, Window: 256, MinRNRTimer: 20 * time.Microsecond}}
}

// client runs the measuring side; in one-process mode it also starts the
// server side on a loopback listener.
func client(ctx context.Context, o *options) (*Result, error) {
	addr := o.connect
	var serverErr chan error
	if addr == "" && o.provider == "shm" {
		// Shared memory is for processes: the server side runs in a
		// process of its own, so one command measures the real path.
		a, wait, err := spawnServer(ctx, o)
		if err != nil {
			return nil, err
		}
		defer wait()
		addr = a
	}
	if addr == "" {
		ln, err := cm.Listen(ctx, "127.0.0.1:0", nil)
		if err != nil {
			return nil, err
		}
		addr = ln.Addr().String()
		serverErr = make(chan error, 1)
		go func() { serverErr <- serveOn(ctx, o, ln, io.Discard) }()
	}
	ep, err := openEndpoint(ctx, o.device, o.noMAC)
	if err != nil {
		return nil, err
	}
	defer ep.dev.Close()
	s := setup{Test: o.test, Size: o.size, Iters: o.iters, Duration: o.duration, Depth: o.depth, QPs: o.qps}
	if isLat(o.test) {
		s.Warmup = 1000
		if o.iters > 0 {
			s.Warmup = min(1000, max(o.iters/10, 10))
		}
	}
	conns := make([]*conn, o.qps)
	for i := range conns {
		s.Index = i
		c, err := ep.newConn(s, i%len(ep.dev.GIDs()))
		if err != nil {
			return nil, err
		}
		cfg := s.connectConfig(o.mtu)
		cfg.PrivateData, _ = json.Marshal(hello{Setup: s, Region: c.region()})
		res, err := cm.Dial(ctx, addr, c.qp, cfg)
		if err != nil {
			return nil, err
		}
		if err := json.Unmarshal(res.PrivateData, &c.remote); err != nil {
			return nil, fmt.Errorf("server's region: %w", err)
		}
		conns[i] = c
	}
	direct0 := conns[0].dev.Stats().Direct
	r, err := measure(ctx, o, s, conns)
	if err == nil && o.provider == "shm" {
		r.Direct = conns[0].dev.Stats().Direct - direct0
		if ok, why := verbs.CrossMemoryAttach(); ok {
			r.CallerMem = "cross-memory attach (" + why + ")"
		} else {
			r.CallerMem = "through the rings: " + why
		}
	}
	if err == nil {
		for _, c := range conns {
			if err = c.fin(ctx); err != nil {
				break
			}
		}
	}
	if err != nil {
		if serverErr != nil {
			select {
			case serr := <-serverErr:
				return nil, fmt.Errorf("%w (server side: %v)", err, serr)
			case <-time.After(time.Second):
			}
		}
		return nil, err
	}
	if serverErr != nil {
		if err := <-serverErr; err != nil {
			return nil, fmt.Errorf("server side: %w", err)
		}
	}
	r.Provider = o.provider
	return r, nil
}

func serve(ctx context.Context, o *options, log io.Writer) error {
	ln, err := cm.Listen(ctx, o.server, nil)
	if err != nil {
		return err
	}
	fmt.Fprintf(log, "rvma-perf: %s server listening on %s\n", o.test, ln.Addr())
	return serveOn(ctx, o, ln, log)
}

// serveOn accepts one run's connections and plays the passive side.
func serveOn(ctx context.Context, o *options, ln *cm.Listener, log io.Writer) error {
	defer ln.Close()
	ep, err := openEndpoint(ctx, o.device, o.noMAC)
	if err != nil {
		return err
	}
	defer ep.dev.Close()
	var conns []*conn
	var s setup
	for want := 1; len(conns) < want; {
		req, err := ln.Accept(ctx)
		if err != nil {
			return err
		}
		var h hello
		if err := json.Unmarshal(req.PrivateData(), &h); err != nil {
			req.Reject("bad setup: " + err.Error())
			continue
		}
		if h.Setup.Test != o.test {
			req.Reject(fmt.Sprintf("server runs %s, client asked for %s", o.test, h.Setup.Test))
			continue
		}
		s, want = h.Setup, h.Setup.QPs
		c, err := ep.newConn(s, len(conns)%len(ep.dev.GIDs()))
		if err != nil {
			req.Reject(err.Error())
			return err
		}
		c.remote = h.Region
		// The receive for the client's FIN must be posted before the
		// client can send it.
		if err := c.qp.Init(); err != nil {
			return err
		}
		if s.Test != "send_bw" && s.Test != "send_lat" && s.Test != "write_send_lat" {
			if err := c.postRecv(1, 0); err != nil {
				return err
			}
		}
		cfg := s.connectConfig(o.mtu)
		cfg.PrivateData, _ = json.Marshal(c.region())
		if err := req.Accept(ctx, c.qp, cfg); err != nil {
			return err
		}
		conns = append(conns, c)
	}
	var wg sync.WaitGroup
	errs := make([]error, len(conns))
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = c.serverRole(ctx, s)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (c *conn) postRecv(n, size int) error {
	for i := 0; i < n; i++ {
		// Into the second half, what the peer writes: never the source
		// half, which a retransmission may still be reading.
		if _, err := c.qp.PostRecv([]verbs.RecvWR{{SGL: []verbs.SGE{c.mr.SGE(len(c.buf)/2, max(size, 1))}}}); err != nil {
			return err
		}
	}
	return nil
}

// next waits for one completion and fails on an error status.
func (c *conn) next(ctx context.Context) (verbs.WorkCompletion, error) {
	for {
		n, err := c.cq.Poll(c.wcs[:1])
		if err != nil {
			return verbs.WorkCompletion{}, err
		}
		if n == 1 {
			return c.wcs[0], c.wcs[0].Err()
		}
		if err := c.cq.Wait(ctx); err != nil {
			return verbs.WorkCompletion{}, err
		}
	}
}

// waitFIN consumes completions until the client's FIN arrives.
func (c *conn) waitFIN(ctx context.Context) error {
	for {
		wc, err := c.next(ctx)
		if err != nil {
			return err
		}
		if wc.Opcode == verbs.WCRecv && wc.Flags&verbs.WCWithImm != 0 && wc.Imm == finImm {
			return nil
		}
	}
}

func (c *conn) fin(ctx context.Context) error {
	if _, err := c.qp.PostSend([]verbs.SendWR{{Opcode: verbs.OpSendImm, Imm: finImm, Flags: verbs.FlagSignaled}}); err != nil {
		return err
	}
	return c.waitFor(ctx, verbs.WCSend)
}

// waitFor consumes completions until one of opcode op arrives. It skips
// others, which the tests' ping-pongs allow: the peer sends nothing new
// until it has what this side is waiting to complete.
func (c *conn) waitFor(ctx context.Context, op verbs.WCOpcode) error {
	for {
		wc, err := c.next(ctx)
		if err != nil {
			return err
		}
		if wc.Opcode == op {
			return nil
		}
	}
}

func (c *conn) serverRole(ctx context.Context, s setup) error {
	switch s.Test {
	case "write_lat":
		total := s.Warmup + s.Iters
		if s.Iters == 0 {
			total = -1 // until FIN
		}
		for i := 1; total < 0 || i <= total; i++ {
			if !c.pollMarker(ctx, s.Size, i, total < 0) {
				break
			}
			c.setMarker(s.Size, i)
			if err := c.writeTo(s.Size, false); err != nil {
				return err
			}
		}
		return c.waitFIN(ctx)
	case "send_lat":
		return c.echoRecvs(ctx, s.Size, func() error {
			_, err := c.qp.PostSend([]verbs.SendWR{{Opcode: verbs.OpSend, SGL: []verbs.SGE{c.mr.SGE(0, s.Size)}}})
			return err
		})
	case "send_bw":
		if err := c.postRecv(2*s.Depth, s.Size); err != nil {
			return err
		}
		for {
			n, err := c.cq.Poll(c.wcs)
			if err != nil {
				return err
			}
			for _, wc := range c.wcs[:n] {
				if err := wc.Err(); err != nil {
					return err
				}
				if wc.Flags&verbs.WCWithImm != 0 && wc.Imm == finImm {
					return nil
				}
				if err := c.postRecv(1, s.Size); err != nil {
					return err
				}
			}
			if n == 0 {
				if err := c.cq.Wait(ctx); err != nil {
					return err
				}
			}
		}
	case "put_notify_lat", "put_bw":
		// Wait on the window; on FIN (a SEND on the CQ) stop.
		wctx, cancel := context.WithCancel(ctx)
		fin := make(chan error, 1)
		go func() { fin <- c.waitFIN(ctx); cancel() }()
		for {
			rec, err := c.win.Wait(wctx)
			if err != nil {
				if wctx.Err() != nil && ctx.Err() == nil {
					return <-fin
				}
				return err
			}
			// put_notify_lat answers first and reposts after: buffers
			// are posted ahead (16), so reposting is off the path.
			if s.Test == "put_notify_lat" {
				if err := c.putTo(s.Size); err != nil {
					return err
				}
			}
			if _, err := c.win.Post(rec.Data); err != nil {
				return err
			}
		}
	case "write_send_lat", "write_flush_send_lat":
		return c.echoRecvs(ctx, 1, func() error {
			if s.Test == "write_flush_send_lat" {
				return c.writeFlushSend(ctx, s.Size)
			}
			return c.writeSend(s.Size)
		})
	default: // passive target: the client does all the work
		return c.waitFIN(ctx)
	}
}

// echoRecvs answers every receive with reply until the client's FIN.
func (c *conn) echoRecvs(ctx context.Context, size int, reply func() error) error {
	if err := c.postRecv(2, size); err != nil {
		return err
	}
	for {
		wc, err := c.next(ctx)
		if err != nil {
			return err
		}
		if wc.Opcode != verbs.WCRecv {
			continue
		}
		if wc.Flags&verbs.WCWithImm != 0 && wc.Imm == finImm {
			return nil
		}
		if err := c.postRecv(1, size); err != nil {
			return err
		}
		if err := reply(); err != nil {
			return err
		}
	}
}

// putTo puts size bytes into the peer's window, unsignaled (the peer's
// window is the notification).
func (c *conn) putTo(size int) error {
	_, err := c.qp.PostSend([]verbs.SendWR{{Opcode: verbs.OpMailboxWrite, SGL: []verbs.SGE{c.mr.SGE(0, size)},
		Mailbox: c.raddr}})
	return err
}

// writeFlushSend writes size bytes, waits for the write's completion (its
// acknowledgement by the peer), then sends one byte: put + flush + notify.
func (c *conn) writeFlushSend(ctx context.Context, size int) error {
	if err := c.writeTo(size, true); err != nil {
		return err
	}
	if err := c.waitFor(ctx, verbs.WCWrite); err != nil {
		return err
	}
	_, err := c.qp.PostSend([]verbs.SendWR{{Opcode: verbs.OpSend, SGL: []verbs.SGE{c.mr.SGE(0, 1)}}})
	return err
}

// writeSend writes size bytes into the peer's memory, then sends one byte
// that the peer waits for: write-then-notify as the RDMA specification
// allows it (RC delivers the SEND after the WRITE).
func (c *conn) writeSend(size int) error {
	_, err := c.qp.PostSend([]verbs.SendWR{
		{Opcode: verbs.OpWrite, SGL: []verbs.SGE{c.mr.SGE(0, size)}, RemoteAddr: c.remote.Addr, RKey: c.remote.RKey},
		{Opcode: verbs.OpSend, SGL: []verbs.SGE{c.mr.SGE(0, 1)}},
	})
	return err
}

// marker returns the aligned word that holds the last byte of a size-byte
// message; write_lat polls it, as ib_write_lat polls the last byte.
func (c *conn) marker(size int) *uint32 {
	return (*uint32)(unsafe.Pointer(&c.buf[len(c.buf)/2+(size-1)&^3]))
}

func markerByte(i int) byte { return byte(i%255) + 1 }

func (c *conn) setMarker(size, i int) { c.buf[size-1] = markerByte(i) }

// pollMarker spins until the last byte of the message equals iteration i's
// marker. With untilFIN it gives up when the FIN completion arrives.
func (c *conn) pollMarker(ctx context.Context, size, i int, untilFIN bool) bool {
	shift := 8 * uint((size-1)&3)
	want := uint32(markerByte(i))
	p := c.marker(size)
	for spin := 0; ; spin++ {
		if (atomic.LoadUint32(p)>>shift)&0xFF == want {
			return true
		}
		// Drive the device's progress: the packet that changes the marker
		// is then handled in this goroutine, with no hand-off (the loop
		// provider has nothing to do here).
		c.dev.Progress()
		if spin&1023 == 1023 {
			runtime.Gosched() // with one processor, the writer must get to run
			if ctx.Err() != nil {
				return false
			}
			if untilFIN && c.cq.Len() > 0 {
				return false
			}
		}
	}
}

func (c *conn) writeTo(size int, signaled bool) error {
	wr := verbs.SendWR{Opcode: verbs.OpWrite, SGL: []verbs.SGE{c.mr.SGE(0, size)}, RemoteAddr: c.remote.Addr, RKey: c.remote.RKey}
	if signaled {
		wr.Flags = verbs.FlagSignaled
	}
	_, err := c.qp.PostSend([]verbs.SendWR{wr})
	return err
}

// measure runs the client side of a test on every connection.
func measure(ctx context.Context, o *options, s setup, conns []*conn) (*Result, error) {
	if isLat(s.Test) {
		if len(conns) != 1 {
			return nil, errors.New("latency tests use one QP")
		}
		return latency(ctx, s, conns[0])
	}
	var wg sync.WaitGroup
	counts := make([]int, len(conns))
	errs := make([]error, len(conns))
	start := time.Now()
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			counts[i], errs[i] = c.bandwidth(ctx, s)
		}()
	}
	wg.Wait()
	el := time.Since(start).Seconds()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	total := 0
	for _, n := range counts {
		total += n
	}
	return &Result{Test: s.Test, Size: s.Size, Iters: total, QPs: len(conns), Seconds: el,
		Gbps: float64(total) * float64(s.Size) * 8 / el / 1e9, Mops: float64(total) / el / 1e6}, nil
}

// bandwidth keeps depth requests outstanding, signalling one in every
// batch, until the iterations or the duration are done.
func (c *conn) bandwidth(ctx context.Context, s setup) (int, error) {
	batch := min(16, s.Depth)
	wrs := make([]verbs.SendWR, batch)
	for i := range wrs {
		switch s.Test {
		case "write_bw":
			wrs[i] = verbs.SendWR{Opcode: verbs.OpWrite, SGL: []verbs.SGE{c.mr.SGE(0, s.Size)}, RemoteAddr: c.remote.Addr, RKey: c.remote.RKey}
		case "read_bw":
			wrs[i] = verbs.SendWR{Opcode: verbs.OpRead, SGL: []verbs.SGE{c.mr.SGE(0, s.Size)}, RemoteAddr: c.remote.Addr, RKey: c.remote.RKey}
		case "send_bw":
			wrs[i] = verbs.SendWR{Opcode: verbs.OpSend, SGL: []verbs.SGE{c.mr.SGE(0, s.Size)}}
		case "put_bw":
			wrs[i] = verbs.SendWR{Opcode: verbs.OpMailboxWrite, SGL: []verbs.SGE{c.mr.SGE(0, s.Size)}, Mailbox: c.raddr}
		}
	}
	wrs[batch-1].Flags = verbs.FlagSignaled
	maxOut := max(1, s.Depth/batch)
	posted, done, out := 0, 0, 0
	per := putsPerBuffer(s)
	deadline := time.Now().Add(s.Duration)
	for {
		stop := s.Iters > 0 && posted >= s.Iters || s.Iters == 0 && (posted&1023 == 0 || out == maxOut) && time.Now().After(deadline)
		if !stop && out < maxOut {
			if s.Test == "put_bw" { // fill each buffer put by put
				for i := range wrs {
					wrs[i].MailboxOffset = uint64((posted+i)%per) * uint64(s.Size)
				}
			}
			if _, err := c.qp.PostSend(wrs); err != nil {
				return done, err
			}
			posted += batch
			out++
			continue
		}
		if out == 0 {
			return done, nil
		}
		n, err := c.cq.Poll(c.wcs)
		if err != nil {
			return done, err
		}
		for _, wc := range c.wcs[:n] {
			if err := wc.Err(); err != nil {
				return done, err
			}
			out--
			done += batch
		}
		if n == 0 {
			if err := c.cq.Wait(ctx); err != nil {
				return done, err
			}
		}
	}
}

// latency runs warm-up plus measured iterations of one request at a time.
func latency(ctx context.Context, s setup, c *conn) (*Result, error) {
	var lat []time.Duration
	if s.Iters > 0 {
		lat = make([]time.Duration, 0, s.Iters)
	}
	deadline := time.Now().Add(s.Duration + 24*time.Hour)
	var begin time.Time
	var repost epoch.Record // put_notify_lat's buffer to post again
	for i := 1; ; i++ {
		if i == s.Warmup+1 {
			begin = time.Now()
			deadline = begin.Add(s.Duration)
		}
		if i > s.Warmup && (s.Iters > 0 && len(lat) >= s.Iters || s.Iters == 0 && time.Now().After(deadline)) {
			break
		}
		t0 := time.Now()
		var err error
		switch s.Test {
		case "write_lat":
			c.setMarker(s.Size, i)
			if err = c.writeTo(s.Size, false); err == nil && !c.pollMarker(ctx, s.Size, i, false) {
				err = ctx.Err()
			}
		case "send_lat":
			if err = c.postRecv(1, s.Size); err == nil {
				if _, err = c.qp.PostSend([]verbs.SendWR{{Opcode: verbs.OpSend, SGL: []verbs.SGE{c.mr.SGE(0, s.Size)}}}); err == nil {
					err = c.waitFor(ctx, verbs.WCRecv)
				}
			}
		case "put_notify_lat":
			if err = c.putTo(s.Size); err == nil {
				repost, err = c.win.Wait(ctx) // reposted below, after the clock
			}
		case "write_send_lat", "write_flush_send_lat":
			if err = c.postRecv(1, 1); err == nil {
				if s.Test == "write_flush_send_lat" {
					err = c.writeFlushSend(ctx, s.Size)
				} else {
					err = c.writeSend(s.Size)
				}
				if err == nil {
					err = c.waitFor(ctx, verbs.WCRecv)
				}
			}
		case "write_ack_lat":
			// A signaled WRITE and its completion: the remote-completion
			// round trip that MPI's put + flush and fi_write + completion
			// measure.
			if err = c.writeTo(s.Size, true); err == nil {
				_, err = c.next(ctx)
			}
		case "read_lat":
			if _, err = c.qp.PostSend([]verbs.SendWR{{Opcode: verbs.OpRead, Flags: verbs.FlagSignaled,
				SGL: []verbs.SGE{c.mr.SGE(0, s.Size)}, RemoteAddr: c.remote.Addr, RKey: c.remote.RKey}}); err == nil {
				_, err = c.next(ctx)
			}
		case "atomic_lat":
			if _, err = c.qp.PostSend([]verbs.SendWR{{Opcode: verbs.OpFetchAdd, Flags: verbs.FlagSignaled, CompareAdd: 1,
				SGL: []verbs.SGE{c.mr.SGE(0, 8)}, RemoteAddr: c.remote.Addr, RKey: c.remote.RKey}}); err == nil {
				_, err = c.next(ctx)
			}
		}
		if err != nil {
			return nil, err
		}
		if i > s.Warmup {
			d := time.Since(t0)
			switch s.Test {
			case "write_lat", "send_lat", "put_notify_lat", "write_send_lat", "write_flush_send_lat":
				d /= 2 // a ping-pong: report the one-way time, as perftest does
			}
			lat = append(lat, d)
		}
		if repost.Data != nil {
			if _, err := c.win.Post(repost.Data); err != nil {
				return nil, err
			}
			repost = epoch.Record{}
		}
	}
	return latencyResult(s.Test, s.Size, lat, time.Since(begin).Seconds())
}
