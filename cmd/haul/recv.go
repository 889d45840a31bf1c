package main

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/rvma/rvma/internal/sdrwire"
	"github.com/rvma/rvma/reliability"
	"github.com/rvma/rvma/verbs/cm"
)

// errSenderGone marks a session that ended on the sender's side (it went
// silent, or its connection setup failed): the receiver waits --wait for
// it to come back and resume.
var errSenderGone = errors.New("the sender is gone")

// errSetup marks a session whose connection setup failed: nothing of its
// sender's arrived.
var errSetup = errors.New("its connection setup failed")

// errNoSender is the end of that wait.
var errNoSender = errors.New("no sender came back")

// receiver is one haul recv: the listener's connection requests, the
// output, and a session per sender that connects for it.
type receiver struct {
	o      *recvOpts
	local  netip.AddrPort
	ln     *cm.Listener
	reqs   chan *cm.Request // from acceptLoop
	done   chan struct{}
	wg     sync.WaitGroup
	accErr error // why acceptLoop stopped; read after reqs is closed
	stdout io.Writer
	stderr io.Writer
	log    *slog.Logger
}

func newLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey && len(groups) == 0 {
			return slog.Attr{}
		}
		return a
	}}))
}

func receive(ctx context.Context, o *recvOpts, stdout, stderr io.Writer) error {
	local, err := netip.ParseAddrPort(o.listen)
	if err != nil {
		return fmt.Errorf("--listen %q: want ip:port: %w", o.listen, err)
	}
	if err := checkOut(o.out); err != nil {
		return err
	}
	r := &receiver{o: o, local: local, reqs: make(chan *cm.Request), done: make(chan struct{}),
		stdout: stdout, stderr: stderr, log: newLogger(stderr)}
	// What an earlier run left is checked before listening: a sender's
	// dial does not wait for the hashing.
	resume, err := loadResume(ctx, o.out, r.log)
	if err != nil {
		return err
	}
	if o.key == nil {
		fmt.Fprintf(stderr, "haul: warning: no --key-file: any sender that reaches %s is accepted, and its file becomes %s\n", o.listen, o.out)
	}
	if r.ln, err = cm.Listen(ctx, o.listen, &cm.ListenerConfig{Key: o.key}); err != nil {
		if resume != nil {
			resume.close()
		}
		return err
	}
	r.wg.Add(1)
	go r.acceptLoop(ctx)
	defer r.stop()
	fmt.Fprintf(stderr, "haul: listening on %v\n", r.ln.Addr())
	for {
		req, err := r.next(ctx, -1)
		if err != nil {
			if resume != nil {
				resume.close()
			}
			return err
		}
		// A request this receiver cannot serve is refused, and the next
		// one awaited: the first that can be served claims the output.
		if _, err := r.checkOffer(req); err != nil {
			req.Reject(err.Error())
			r.log.Warn("refused a sender", "from", req.Remote().GID, "err", err)
			continue
		}
		out, err := r.start(req, resume)
		if err != nil {
			return err
		}
		if o.stateHook != nil && !out.hooked {
			out.st.writeAt = o.stateHook(out.st.writeAt)
			out.hooked = true
		}
		again, err := r.serve(ctx, req, out)
		if again {
			// Nothing came from that sender: its claim lapses, and the
			// output waits for the next (resuming if it is the same).
			r.log.Warn("a sender's connection setup failed; waiting for a sender", "err", err)
			resume = out
			continue
		}
		out.close() // after every session: each closes its device first
		return err
	}
}

// acceptLoop hands the listener's requests to the sessions, so that one
// can arrive while a session runs (a restarted sender taking over).
func (r *receiver) acceptLoop(ctx context.Context) {
	defer r.wg.Done()
	defer close(r.reqs)
	for {
		req, err := r.ln.Accept(ctx)
		if err != nil {
			r.accErr = err
			return
		}
		select {
		case r.reqs <- req:
		case <-r.done:
			req.Reject("the receiver is finishing")
			return
		}
	}
}

func (r *receiver) stop() {
	close(r.done)
	r.ln.Close()
	r.wg.Wait()
}

// next waits for the next request, at most wait (forever if negative).
func (r *receiver) next(ctx context.Context, wait time.Duration) (*cm.Request, error) {
	var timeout <-chan time.Time
	if wait >= 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case req, ok := <-r.reqs:
		if !ok {
			return nil, r.accErr
		}
		return req, nil
	case <-timeout:
		return nil, errNoSender
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// parseOffer decodes and checks a sender's offer; it is untrusted input.
func parseOffer(b []byte) (*offer, error) {
	var off offer
	if err := json.Unmarshal(b, &off); err != nil {
		return nil, fmt.Errorf("malformed offer: %w", err)
	}
	if err := checkLayout(off.Size, off.Region); err != nil {
		return nil, fmt.Errorf("bad offer: %w", err)
	}
	switch {
	case !isHexHash(off.Digest):
		return nil, errors.New("bad offer: malformed digest")
	case !isHexHash(off.Manifest):
		return nil, errors.New("bad offer: no region hashes (a haul older than this receiver?)")
	case off.Paths < 0 || off.Paths > 16:
		return nil, fmt.Errorf("bad offer: %d paths, at most 16", off.Paths)
	case off.K < 1 || off.K > 128 || off.M < 0 || off.M > 128 || off.K+max(off.M, 8) > 256:
		return nil, fmt.Errorf("bad offer: k %d, m %d", off.K, off.M)
	case off.Nonce != nil && len(off.Nonce) != sessionNonce:
		return nil, fmt.Errorf("bad offer: a nonce of %d bytes", len(off.Nonce))
	case off.Wire != sdrwire.Version:
		return nil, fmt.Errorf("the sender speaks wire format version %d, this receiver %d: run the same haul release at both ends", max(off.Wire, 2), sdrwire.Version)
	case !knownHashing(off.Hashing):
		return nil, fmt.Errorf("the sender hashes regions as %q, this receiver as %q or %q: run the same haul release at both ends", off.Hashing, hashBlake3, hashChain)
	}
	return &off, nil
}

// checkOffer decodes a sender's offer and checks it against this
// receiver's terms.
func (r *receiver) checkOffer(req *cm.Request) (*offer, error) {
	off, err := parseOffer(req.PrivateData())
	switch {
	case err != nil:
		return nil, err
	case off.Nonce != nil && r.o.key == nil:
		// Unreachable through the CM (a keyed dialer is refused by a
		// listener without a key), but the payload key needs one.
		return nil, errors.New("encryption needs a key, and this receiver has none")
	case off.Nonce == nil && r.o.encrypt:
		return nil, errors.New("this receiver accepts encrypted payloads only (send --encrypt)")
	}
	return off, nil
}

// start takes the first sender's offer and opens the output for it:
// what an earlier run left if it is the same transfer, else a new one.
func (r *receiver) start(req *cm.Request, resume *output) (*output, error) {
	off, err := r.checkOffer(req)
	if err != nil {
		req.Reject(err.Error())
		if resume != nil {
			resume.close()
		}
		return nil, err
	}
	out := resume
	if out != nil && !out.matches(off) {
		r.log.Warn("the state file belongs to another transfer; starting over", "path", statePath(r.o.out))
		out.close()
		out = nil
	}
	if out != nil {
		// Reserved when it was created, unless it was copied sparse since.
		if err := reserve(out.f, off.Size, r.log); err != nil {
			req.Reject(err.Error())
			out.close()
			return nil, err
		}
	}
	if out == nil {
		if out, err = createOutput(r.o.out, off, r.log); err != nil {
			req.Reject(err.Error())
			return nil, err
		}
	}
	if err := out.mapFile(); err != nil {
		req.Reject(err.Error())
		out.close()
		return nil, err
	}
	if had := countRegions(out.have(), out.regions()); had > 0 {
		fmt.Fprintf(r.stderr, "haul: resuming %s: %d of %d regions already here\n", r.o.out, had, out.regions())
	}
	return out, nil
}

// serve runs sessions until the file is complete: after a sender is gone
// it waits --wait for one to resume, and a sender of the same transfer
// that connects during a session takes it over (the old one was
// restarted). If the first session's setup fails, it returns at once with
// again set: any sender may claim the output then.
func (r *receiver) serve(ctx context.Context, req *cm.Request, out *output) (again bool, _ error) {
	for first := true; ; first = false {
		next, err := r.session(ctx, req, out)
		if first && errors.Is(err, errSetup) {
			return true, err
		}
		switch {
		case next != nil:
			fmt.Fprintf(r.stderr, "haul: a sender connected again; resuming with it\n")
			req = next
			continue
		case err == nil:
			return false, nil
		case !errors.Is(err, errSenderGone):
			return false, fmt.Errorf("%w; %s", err, out.kept())
		}
		r.log.Warn("waiting for the sender to resume", "err", err, "wait", r.o.wait)
		gone := err
		if req, err = r.resumer(ctx, out); err != nil {
			return false, fmt.Errorf("%w, and %w; %s", gone, err, out.kept())
		}
	}
}

// resumer waits --wait for a sender of the same transfer, rejecting
// others.
func (r *receiver) resumer(ctx context.Context, out *output) (*cm.Request, error) {
	deadline := time.Now().Add(r.o.wait)
	for {
		req, err := r.next(ctx, max(time.Until(deadline), 0))
		if errors.Is(err, errNoSender) {
			return nil, fmt.Errorf("%w within %v", err, r.o.wait)
		}
		if err != nil {
			return nil, err
		}
		if reason := r.sameTransfer(req, out); reason != "" {
			req.Reject(reason)
			continue
		}
		return req, nil
	}
}

// sameTransfer says why req is not a sender of out's transfer ("" if it is).
func (r *receiver) sameTransfer(req *cm.Request, out *output) string {
	off, err := r.checkOffer(req)
	if err != nil {
		return err.Error()
	}
	if !out.matches(off) {
		return fmt.Sprintf("busy: receiving another file into %s (%d bytes, %s %s, region %d)",
			r.o.out, out.st.st.Size, out.hashing().label(), out.st.st.Digest, out.st.st.Region)
	}
	return ""
}

// session serves one sender. It returns nil once the file is in place
// and verified, an error wrapping errSenderGone if the sender went away,
// another error if the receiver cannot go on, or a request of a new
// sender of the same transfer that takes over.
func (r *receiver) session(ctx context.Context, req *cm.Request, out *output) (*cm.Request, error) {
	// Each sender's offer: a resuming one may differ in paths, coding and
	// encryption.
	off, err := r.checkOffer(req)
	if err != nil {
		req.Reject(err.Error())
		return nil, fmt.Errorf("%w: %v", errSenderGone, err)
	}
	o := r.o
	paths, workers := max(off.Paths, 1), max(off.Workers, 1)
	if len(o.vias) > 0 && len(o.vias) != paths*workers {
		req.Reject("receiver misconfigured")
		return nil, fmt.Errorf("--via: %d relays, but the sender uses %d paths and %d workers (one relay for each path of each worker)", len(o.vias), paths, workers)
	}
	via, err := o.viaGID(0)
	if err != nil {
		req.Reject("receiver misconfigured")
		return nil, err
	}
	cfg := o.relCfg(off.K, 0, max(off.M, 8), reliability.Auto, paths)
	cfg.ChunkDelay = o.chunkDelay
	if o.noWindow {
		cfg.RecvWindow = -1
	}
	// A device per worker: its sockets, CQ and goroutines are its own.
	// The devices go before the caller unmaps the output: closing one
	// waits for its receive handlers, which write into the mapping.
	eps := make([]*endpoint, workers)
	defer func() {
		for _, e := range eps {
			if e != nil {
				e.close()
			}
		}
	}()
	for w := range eps {
		local := r.local
		if w > 0 {
			local = netip.AddrPortFrom(local.Addr(), 0)
		}
		if eps[w], err = open(ctx, local, paths, cfg, o.noMAC()); err != nil {
			req.Reject(err.Error())
			return nil, err
		}
	}
	e := eps[0]
	ans := answer{Have: slices.Clone(out.have()), Hashes: out.needHashes(), Wire: sdrwire.Version, Hashing: off.Hashing}
	var todo []int // the regions the sender will send, as it counts them
	for i := range out.regions() {
		if !hasRegion(ans.Have, i) {
			todo = append(todo, i)
		}
	}
	var pl *payload
	if off.Nonce != nil {
		// The sealed chunks fill the chunks of this end's connection:
		// --chunk, else the path MTU that the connection will have.
		ans.Nonce, ans.Chunk = newNonce(), o.chunk
		if ans.Chunk == 0 {
			ans.Chunk = max(min(e.qps[0].Endpoint().MTU, req.Remote().MTU), 256)
		}
		cfg.Chunk = ans.Chunk
		if pl, err = newPayload(o.key, off.Nonce, ans.Nonce, off.Digest, layout{off.Size, off.Region, ans.Chunk}); err != nil {
			req.Reject("receiver misconfigured: " + err.Error())
			return nil, err
		}
	}
	if err := req.Accept(ctx, e.qps[0], &cm.Config{PrivateData: mustJSON(ans), Via: via}); err != nil {
		return nil, r.senderErr(ctx, err)
	}
	if err := r.acceptPaths(ctx, eps, off); err != nil {
		return nil, r.senderErr(ctx, err)
	}
	conns := make([]*reliability.Conn, workers)
	for w, e := range eps {
		wcfg := cfg
		wcfg.Drops = socketDrops(e.dev.GIDs())
		if e.conn, err = reliability.NewPaths(e.pd, e.qps, e.cq, wcfg); err != nil {
			return nil, err
		}
		conns[w] = e.conn
	}
	sctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	takeover := r.watch(sctx, cancel, out)
	start := time.Now()
	err = receiveRegions(sctx, conns, out, todo, o.slots, pl, o.sealedHook)
	cancel(nil)
	if next := <-takeover; next != nil {
		return next, nil
	}
	if o.verbose {
		for w, e := range eps {
			fmt.Fprintf(r.stderr, "haul: worker %d: device counters %+v\n", w, e.dev.Stats())
		}
	}
	if err != nil {
		if !errors.Is(err, errSenderGone) {
			r.tell(ctx, e.conn, verdict{Error: err.Error()}, pl != nil)
		}
		return nil, err
	}
	return nil, r.conclude(ctx, conns, out, time.Since(start), pl)
}

// senderErr classifies a failed connection setup: the sender's doing
// unless the receiver is stopping.
func (r *receiver) senderErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return err
	}
	return fmt.Errorf("%w: %w: %w", errSenderGone, errSetup, err)
}

// watch hands over to a sender of the same transfer that connects while
// a session runs: a restarted sender, while this session's is gone and
// not yet timed out. It cancels the session then and sends the request
// on the channel it returns (nil if none came before ctx ended).
func (r *receiver) watch(ctx context.Context, cancel context.CancelCauseFunc, out *output) <-chan *cm.Request {
	ch := make(chan *cm.Request, 1)
	go func() {
		for {
			select {
			case <-ctx.Done():
				ch <- nil
				return
			case req, ok := <-r.reqs:
				if !ok {
					ch <- nil
					return
				}
				if reason := r.sameTransfer(req, out); reason != "" {
					req.Reject(reason)
					continue
				}
				cancel(errSenderGone)
				ch <- req
				return
			}
		}
	}()
	return ch
}

// acceptPaths accepts the sender's further paths, each onto the QP of
// its worker and index.
func (r *receiver) acceptPaths(ctx context.Context, eps []*endpoint, off *offer) error {
	paths := len(eps[0].qps)
	done := make([]bool, len(eps)*paths)
	done[0] = true
	for left := len(done) - 1; left > 0; {
		req, err := r.next(ctx, r.o.peerT)
		if err != nil {
			return fmt.Errorf("the sender's further paths did not arrive: %w", err)
		}
		var h pathHello
		if json.Unmarshal(req.PrivateData(), &h) != nil || h.Digest != off.Digest || h.Path < 0 || h.Path >= paths ||
			h.Worker < 0 || h.Worker >= len(eps) || done[h.Worker*paths+h.Path] {
			req.Reject("not a path of this transfer")
			continue
		}
		via, err := r.o.viaGID(h.Worker*paths + h.Path)
		if err != nil {
			req.Reject("receiver misconfigured")
			return err
		}
		if err := req.Accept(ctx, eps[h.Worker].qps[h.Path], &cm.Config{Via: via}); err != nil {
			return fmt.Errorf("worker %d path %d: %w", h.Worker, h.Path, err)
		}
		done[h.Worker*paths+h.Path] = true
		left--
	}
	return nil
}

// conclude verifies the complete file, tells the sender, and on success
// gives the file its name.
func (r *receiver) conclude(ctx context.Context, conns []*reliability.Conn, out *output, elapsed time.Duration, pl *payload) error {
	c := conns[0]
	sum, verr := out.verify()
	v := verdict{Digest: sum, OK: verr == nil}
	if verr == nil {
		if err := out.finish(); err != nil {
			verr = fmt.Errorf("verified, but %w", err)
			v.OK = false
		}
	}
	if verr != nil {
		v.Error = verr.Error()
	}
	r.tell(ctx, c, v, pl != nil)
	size := out.st.st.Size
	gbps := float64(size) * 8 / elapsed.Seconds() / 1e9
	var cpu float64
	var failed int64
	if pl != nil {
		cpu, failed = pl.CPU().Seconds(), pl.failed.Load()
	}
	fl := c.Flow()
	for _, c := range conns[1:] {
		f := c.Flow()
		fl.WindowMin, fl.WindowMax = min(fl.WindowMin, f.WindowMin), max(fl.WindowMax, f.WindowMax)
		fl.Cuts += f.Cuts
		fl.Dropped += f.Dropped
	}
	label := out.hashing().label()
	if r.o.json {
		rep := map[string]any{"bytes": size, "seconds": elapsed.Seconds(), "gbps": gbps, "hash": label, "digest": sum, "ok": v.OK,
			"encrypted": pl != nil, "crypto_cpu_seconds": cpu, "auth_failed_chunks": failed,
			"window_min": fl.WindowMin, "window_max": fl.WindowMax, "window_cuts": fl.Cuts, "socket_drops": fl.Dropped}
		if label == "sha256" {
			rep["sha256"] = sum // as sha256sum prints it
		}
		fmt.Fprintf(r.stdout, "%s\n", mustJSON(rep))
	} else {
		fmt.Fprintf(r.stdout, "haul: received %s (%d bytes) in %.3fs, %.3f Gbit/s; %s %s %s\n", r.o.out, size, elapsed.Seconds(), gbps, label, sum, okWord(v.OK))
		fmt.Fprintf(r.stdout, "haul: flow control: window %s to %s, halved %d times; %d datagrams dropped by the kernel\n",
			mib(fl.WindowMin), mib(fl.WindowMax), fl.Cuts, fl.Dropped)
		fmt.Fprintf(r.stdout, "haul: %s\n", cryptoLine(pl != nil, cpu, "opening",
			fmt.Sprintf("%d chunks failed authentication (never written, fetched again)", failed)))
	}
	if verr != nil {
		return fmt.Errorf("%s: %w", r.o.out, verr)
	}
	return nil
}

// tell sends the sender the verdict (its first Post), waiting a while
// for it to arrive: the sender stops at once on an error rather than
// timing out.
func (r *receiver) tell(ctx context.Context, c *reliability.Conn, v verdict, sealed bool) {
	if len(v.Error) > verdictSize/2 {
		v.Error = v.Error[:verdictSize/2] + "..."
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(r.o.peerT, 10*time.Second))
	defer cancel()
	b := mustJSON(v)
	if sealed {
		// An encrypting sender's buffers take repair requests too.
		b = append(b, make([]byte, fbSize-len(b))...)
	}
	s, err := c.Send(ctx, b, nil)
	if err == nil {
		_, err = s.Wait(ctx)
	}
	if err != nil {
		fmt.Fprintf(r.stderr, "haul: could not tell the sender the verdict: %v\n", err)
	}
}

func okWord(ok bool) string {
	if ok {
		return "verified"
	}
	return "MISMATCH"
}

// receiveRegions receives the regions todo, spread over the workers'
// connections as the sender spreads them (the j-th of todo on connection
// j mod len(conns)), and records each as it completes and checks out. The
// region hashes, if still needed, come first on the first connection. A
// region that does not match its hash stays missing: the run ends with an
// error and the next one fetches it again.
//
// With pl, the regions arrive sealed into staging buffers, and only the
// chunks that verify reach the output; the others are asked for again on
// the first connection once every region has arrived (repairChunks).
func receiveRegions(ctx context.Context, conns []*reliability.Conn, out *output, todo []int, slots int, pl *payload, hook func(uint32, int, []byte)) error {
	hashed := make(chan struct{})
	if !out.needHashes() {
		close(hashed)
	}
	w := len(conns)
	// The staging budget is the workers' together. Plain regions too
	// large for two each within it (files of several TiB have regions of
	// hundreds of MiB) land in the mapping, as they did before staging.
	region := len(out.span(0))
	if pl != nil {
		region = pl.l.sealedLen(0)
	}
	inPlace := pl == nil && 2*w*region > plainStaging
	if !inPlace {
		slots = max(2, min(slots, stagingBudget/w/max(region, 1)))
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type outcome struct {
		failed map[int][]uint32
		bad    int
		err    error
	}
	res := make(chan outcome, w)
	for k, c := range conns {
		var mine []int
		for j := k; j < len(todo); j += w {
			mine = append(mine, todo[j])
		}
		go func() {
			var o outcome
			o.failed, o.bad, o.err = receiveWorker(wctx, c, out, mine, k == 0 && out.needHashes(), hashed, slots, inPlace, pl, hook)
			if o.err != nil {
				cancel() // the others stop: the session ends with this one's error
			}
			res <- o
		}()
	}
	var first error
	failed := map[int][]uint32{}
	bad := 0
	for range conns {
		o := <-res
		if o.err != nil && first == nil {
			first = o.err
		}
		bad += o.bad
		for i, f := range o.failed {
			failed[i] = f
		}
	}
	if first != nil {
		return first
	}
	if len(failed) > 0 {
		b, err := repairChunks(ctx, conns[0], out, pl, failed, hook)
		if err != nil {
			return err
		}
		bad += b
	}
	if bad > 0 {
		return fmt.Errorf("%d regions arrived corrupted (they do not match the sender's hashes); the next run fetches them again", bad)
	}
	return nil
}

// plainStaging is the staging budget of plain regions: stagingBudget, a
// variable so that a test can send regions past it.
var plainStaging = stagingBudget

// receiveWorker is one connection's part of receiveRegions: the region
// hashes first if hashes is set (then it closes hashed), then the regions
// todo in order, as many at once as slots; a region is checked only once
// hashed is closed. With inPlace, plain regions land in the mapping
// rather than staging buffers. It returns the sealed regions with chunks
// to fetch again and how many regions did not match their hash.
func receiveWorker(ctx context.Context, c *reliability.Conn, out *output, todo []int, hashes bool, hashed chan struct{}, slots int, inPlace bool, pl *payload, hook func(uint32, int, []byte)) (map[int][]uint32, int, error) {
	type posted struct {
		r   *reliability.Recv
		idx int    // -1: the region hashes
		buf []byte // the hashes, or the staging buffer
	}
	var pending []posted
	if hashes {
		buf := make([]byte, out.regions()*hashLen)
		rv, err := c.Post(ctx, buf)
		if err != nil {
			return nil, 0, sessionErr(ctx, err)
		}
		pending = append(pending, posted{rv, -1, buf})
	}
	var free [][]byte            // staging buffers to reuse
	failed := map[int][]uint32{} // regions with chunks to ask for again
	next, bad := 0, 0
	for {
		if next < len(todo) && len(pending) < slots {
			i := todo[next]
			// A staging buffer of the first region's size (the largest).
			stage, want := []byte(nil), len(out.span(i))
			if pl != nil {
				want = pl.l.sealedLen(i)
			}
			switch k := len(free); {
			case inPlace:
				stage = out.span(i)
			case k > 0:
				stage, free = free[k-1], free[:k-1]
			case pl != nil:
				stage = make([]byte, pl.l.sealedLen(0))
			default:
				stage = alignedBuf(len(out.span(0)))
			}
			rv, err := c.Post(ctx, stage[:want])
			if err != nil {
				return nil, bad, sessionErr(ctx, err)
			}
			pending = append(pending, posted{rv, i, stage})
			next++
			continue
		}
		if len(pending) == 0 {
			break
		}
		p := pending[0]
		pending = pending[1:]
		if err := p.r.Wait(ctx); err != nil {
			return nil, bad, sessionErr(ctx, err)
		}
		if p.idx < 0 {
			if err := out.setHashes(p.buf); err != nil {
				return nil, bad, err
			}
			close(hashed)
			continue
		}
		select {
		case <-hashed:
		case <-ctx.Done():
			return nil, bad, sessionErr(ctx, ctx.Err())
		}
		var ok bool
		var err error
		if pl != nil {
			sealed := p.buf[:pl.l.sealedLen(p.idx)]
			if hook != nil {
				hook(0, p.idx, sealed)
			}
			f := pl.openRegion(sealed, out.span(p.idx), p.idx)
			free = append(free, p.buf)
			if len(f) > 0 {
				failed[p.idx] = f
				continue
			}
			ok, err = out.complete(p.idx)
		} else if inPlace {
			ok, err = out.complete(p.idx)
		} else {
			ok, err = out.land(p.idx, p.buf[:len(out.span(p.idx))], true)
			free = append(free, p.buf)
		}
		if err != nil {
			return nil, bad, err
		}
		if !ok {
			bad++
		}
	}
	return failed, bad, nil
}

// repairChunks asks the sender again for the chunks that failed their tag
// (failed, by region), in rounds of at most maxRepairChunks: a repair
// request, then the chunks sealed anew for that round land in a buffer
// posted for them. A region is recorded once none of its chunks is
// missing; it returns how many did not match their hash. It gives up
// when a round repairs nothing: the sender's chunks do not verify, and
// sending them again would not help.
func repairChunks(ctx context.Context, c *reliability.Conn, out *output, pl *payload, failed map[int][]uint32, hook func(uint32, int, []byte)) (int, error) {
	var ids []chunkID
	for i, js := range failed {
		for _, j := range js {
			ids = append(ids, chunkID{uint32(i), j})
		}
	}
	slices.SortFunc(ids, func(a, b chunkID) int { return cmp.Or(cmp.Compare(a.region, b.region), cmp.Compare(a.chunk, b.chunk)) })
	bad := 0
	for round := uint32(1); len(ids) > 0; round++ {
		if round > maxRepairRounds {
			return bad, fmt.Errorf("%d chunks still failed authentication after %d repair rounds", len(ids), maxRepairRounds)
		}
		batch := ids[:min(len(ids), maxRepairChunks)]
		// Posted before asking, so that the repair lands at once.
		buf := make([]byte, len(batch)*pl.l.wire)
		rv, err := c.Post(ctx, buf)
		if err != nil {
			return bad, sessionErr(ctx, err)
		}
		req := appendRepair(make([]byte, 0, fbSize), round, batch)
		if _, err := c.Send(ctx, req[:fbSize], nil); err != nil {
			return bad, sessionErr(ctx, err)
		}
		if err := rv.Wait(ctx); err != nil {
			return bad, sessionErr(ctx, err)
		}
		if hook != nil {
			hook(round, -1, buf)
		}
		ok := pl.openRepair(buf, batch, round, out.span)
		var still []chunkID
		for k, id := range batch {
			if !ok[k] {
				still = append(still, id)
			}
		}
		if len(still) == len(batch) {
			return bad, fmt.Errorf("none of the %d chunks of repair round %d passed authentication; the next run fetches their regions again", len(batch), round)
		}
		rest := append(still, ids[len(batch):]...) // still sorted: the batch came first
		left := map[uint32]bool{}
		for _, id := range rest {
			left[id.region] = true
		}
		var whole []int
		for i := range failed {
			if !left[uint32(i)] {
				whole = append(whole, i)
			}
		}
		slices.Sort(whole)
		for _, i := range whole {
			delete(failed, i)
			ok, err := out.complete(i)
			if err != nil {
				return bad, err
			}
			if !ok {
				bad++
			}
		}
		ids = rest
	}
	return bad, nil
}

// sessionErr classifies an error of the connection: the peer silent, or
// the session cancelled by a sender taking over, is the sender's doing.
func sessionErr(ctx context.Context, err error) error {
	switch {
	case errors.Is(context.Cause(ctx), errSenderGone) || errors.Is(err, reliability.ErrPeer):
		return fmt.Errorf("%w: %w", errSenderGone, err)
	case ctx.Err() != nil:
		return fmt.Errorf("receiver interrupted: %w", err)
	}
	return err
}

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
