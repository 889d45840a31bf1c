package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rvma/rvma/internal/sdrwire"
	"github.com/rvma/rvma/reliability"
	"github.com/rvma/rvma/verbs/cm"
)

// report is the sender's final account.
type report struct {
	Bytes     int64    `json:"bytes"`
	Seconds   float64  `json:"seconds"`
	Gbps      float64  `json:"gbps"`
	Scheme    string   `json:"scheme"`
	Ideal     float64  `json:"ideal_seconds"`
	Predicted float64  `json:"predicted_seconds"`
	Hash      string   `json:"hash"`             // the digest's scheme: blake3 or sha256
	Digest    string   `json:"digest"`           // the file's, in hex
	SHA256    string   `json:"sha256,omitempty"` // the digest again, when it is the file's SHA-256
	OK        bool     `json:"ok"`
	Overhead  float64  `json:"wire_overhead"`
	Repaired  int      `json:"repaired_chunks"`
	Timeouts  int      `json:"timeouts"`
	RTTms     float64  `json:"rtt_ms"`
	Loss      float64  `json:"chunk_loss"`
	Resumed   int64    `json:"resumed_bytes"`
	Paths     int      `json:"paths"`
	PathBytes []uint64 `json:"path_bytes"` // chunk bytes sent per path, repairs included
	Workers   int      `json:"workers"`
	// WorkerBytes is the chunk bytes each worker's connection sent,
	// repairs included.
	WorkerBytes []uint64 `json:"worker_bytes"`
	Encrypted   bool     `json:"encrypted"`
	CryptoCPU   float64  `json:"crypto_cpu_seconds"` // sealing the payload, on all threads
	AuthFailed  int      `json:"auth_failed_chunks"` // sealed chunks the receiver found forged or corrupted, sent again
	// Repeats is the payload bytes sent again (selective repeat), over
	// the payload: the part of the wire overhead that loss, or a
	// receiver that reports late, costs.
	Repeats    float64    `json:"repeat_overhead"`
	Probe      *probeRep  `json:"probe,omitempty"`
	Rate       rateRep    `json:"rate"`
	Flow       flowRep    `json:"flow"`
	Decisions  []decision `json:"decisions"`
	repairWire int64
	warning    string
	schemeMix  string
	verdictErr string
}

func send(ctx context.Context, o *sendOpts, stdout, stderr io.Writer) error {
	mm, size, unmap, err := mapFile(o.path)
	if err != nil {
		return err
	}
	defer unmap()
	region, err := pickRegion(o.region, size)
	if err != nil {
		return err
	}
	sum, hashes := o.hashing.file(mm, region)
	local, err := localFor(o.to)
	if err != nil {
		return fmt.Errorf("peer %s unreachable: %w", o.to, err)
	}
	cfg := o.relCfg(o.k, o.m, 8, o.scheme, o.paths)
	// A device per worker: its sockets, CQ and goroutines are its own.
	eps := make([]*endpoint, o.workers)
	defer func() {
		for _, e := range eps {
			if e != nil {
				e.close()
			}
		}
	}()
	for w := range eps {
		if eps[w], err = open(ctx, local, o.paths, cfg, o.noMAC()); err != nil {
			return err
		}
	}
	off := offer{Name: filepath.Base(o.path), Size: size, Digest: sum, Region: region, Manifest: sha256Hex(hashes),
		K: o.k, M: max(o.m, 8), Wire: sdrwire.Version, Hashing: o.hashing.name()}
	if o.paths > 1 {
		off.Paths = o.paths
	}
	if o.workers > 1 {
		off.Workers = o.workers
	}
	if o.encrypt {
		off.Nonce = newNonce()
	}
	var ans answer
	for w, e := range eps {
		for i := range o.paths {
			via, err := o.viaGID(w*o.paths + i)
			if err != nil {
				return err
			}
			pd := mustJSON(pathHello{Path: i, Worker: w, Digest: sum})
			if w == 0 && i == 0 {
				pd = mustJSON(off)
			}
			dctx, cancel := context.WithTimeout(ctx, o.peerT)
			res, err := cm.Dial(dctx, o.to, e.qps[i], &cm.Config{PrivateData: pd, Via: via, Key: o.key})
			cancel()
			if err != nil {
				return o.dialErr(w*o.paths+i, err)
			}
			if w == 0 && i == 0 {
				if err := json.Unmarshal(res.PrivateData, &ans); err != nil {
					return fmt.Errorf("malformed answer from the receiver: %w", err)
				}
			}
		}
	}
	if ans.Wire != sdrwire.Version {
		return fmt.Errorf("the receiver at %s speaks wire format version %d, this sender %d: run the same haul release at both ends", o.to, max(ans.Wire, 2), sdrwire.Version)
	}
	if ans.Hashing != off.Hashing {
		return fmt.Errorf("the receiver at %s checks regions as %q, this sender hashed them as %q: run the same haul release at both ends", o.to, ans.Hashing, off.Hashing)
	}
	var pl *payload
	if o.encrypt {
		if ans.Nonce == nil {
			return fmt.Errorf("the receiver at %s does not encrypt (a haul older than --encrypt?)", o.to)
		}
		if pl, err = newPayload(o.key, off.Nonce, ans.Nonce, sum, layout{size, region, ans.Chunk}); err != nil {
			return fmt.Errorf("the receiver's answer: %w", err)
		}
	}
	conns := make([]*reliability.Conn, len(eps))
	for w, e := range eps {
		if e.conn, err = reliability.NewPaths(e.pd, e.qps, e.cq, cfg); err != nil {
			return err
		}
		conns[w] = e.conn
	}
	c := conns[0]
	// The receiver's messages (the verdict; with encryption, repair
	// requests first) land in the buffers posted here, one at a time.
	fbuf := make([]byte, verdictSize)
	if pl != nil {
		fbuf = make([]byte, fbSize)
	}
	fb, err := c.Post(ctx, fbuf)
	if err != nil {
		return err
	}
	for _, c := range conns {
		if err := ready(ctx, c, fb, o.peerT); err != nil {
			return err
		}
	}
	var probe *probeRep
	if o.probes > 0 && !settled(fb) {
		// Every worker's connection probes (its model and rate start
		// from it); the report has the first's.
		prs := make([]reliability.ProbeResult, len(conns))
		errs := make([]error, len(conns))
		var wg sync.WaitGroup
		for w, c := range conns {
			wg.Go(func() { prs[w], errs[w] = c.Probe(ctx, o.probes) })
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil && !settled(fb) {
			return fmt.Errorf("probing the path: %w", err)
		}
		pr := prs[0]
		probe = &probeRep{Sent: pr.Sent, Echoed: pr.Echoed, Loss: pr.Loss, RTTms: float64(pr.Median.Microseconds()) / 1e3,
			Seconds: pr.Duration.Seconds(), DispersionMbps: pr.Dispersion * 8 / 1e6, SendMbps: pr.SendRate * 8 / 1e6}
		if o.verbose {
			fmt.Fprintf(stderr, "haul: probe: %v\n", pr)
		}
	}
	if ans.Hashes && len(hashes) > 0 {
		// The receiver's first posted buffer: it checks each region with them.
		if _, err := c.Send(ctx, hashes, nil); err != nil {
			return err
		}
	}

	n := regions(size, region)
	var todo []int
	var todoBytes int64
	for i := 0; i < n; i++ {
		if !hasRegion(ans.Have, i) {
			todo = append(todo, i)
			todoBytes += min(region, size-int64(i)*region)
		}
	}
	rep := report{Bytes: size, Hash: o.hashing.label(), Digest: sum, Resumed: size - todoBytes, Encrypted: pl != nil, Probe: probe, Workers: o.workers}
	plain := func(i int) []byte {
		lo := int64(i) * region
		return mm[lo:min(lo+region, size)]
	}
	// Plain regions are all queued at once (they are the file's own
	// mapping); sealed ones need a buffer each, so a few are in flight.
	window := len(todo)
	if pl != nil {
		window = max(2, pl.l.staging(o.slots)/o.workers)
	}
	prog := newProgress(stderr, todoBytes)
	start := time.Now()
	wctx, stopWorkers := context.WithCancel(ctx)
	defer stopWorkers()
	done := make(chan sentRegion, len(todo))
	for w, c := range conns {
		// The j-th region to send goes on worker j mod workers, as the
		// receiver posts them.
		var mine []int
		for j := w; j < len(todo); j += o.workers {
			mine = append(mine, todo[j])
		}
		go sendRegions(wctx, c, mine, window, plain, pl, done)
	}
	var results []reliability.SendResult
	var offsets []int64 // of each result's region in the file
	tick := time.NewTicker(prog.every)
	defer tick.Stop()
	doneBytes := int64(0)
	repaired := 0
	early := fb.Done() // a verdict before the end: the receiver stopped
	var verified <-chan time.Time
regions:
	for range todo {
		var d sentRegion
	wait:
		for {
			select {
			case <-verified:
				// The receiver verified the whole file and may be gone:
				// the acknowledgements still missing were lost, and
				// nobody would answer their repeats.
				stopWorkers()
				doneBytes = todoBytes
				break regions
			case <-early:
				early = nil
				var v verdict
				if fb.Wait(ctx) != nil || isRepair(fbuf) {
					// The connection failed (so do the sends, with the
					// reason), or chunks to send again after the regions.
					continue
				}
				if json.Unmarshal(bytes.TrimRight(fbuf, "\x00"), &v) == nil && v.OK {
					// It has everything; the last completions are on their
					// way, unless their acknowledgements were lost.
					verified = time.After(verifiedGrace)
					continue
				}
				prog.end()
				return fmt.Errorf("after %d of %d bytes, the receiver stopped: %s", doneBytes+rep.Resumed, size, v.Error)
			case d = <-done:
				break wait
			case <-tick.C:
				prog.update(doneBytes, repaired, time.Since(start))
			case <-ctx.Done():
				prog.end()
				return ctx.Err()
			}
		}
		if d.err != nil {
			prog.end()
			return fmt.Errorf("after %d of %d bytes: %w", doneBytes+rep.Resumed, size, d.err)
		}
		r := d.r
		results = append(results, r)
		offsets = append(offsets, int64(d.region)*region)
		if o.verbose {
			fmt.Fprintf(stderr, "msg %d: tx %d retx %d timeouts %d decoded %d dur %v\n", r.Seq, r.Transmissions, r.Retransmissions, r.Timeouts, r.Decoded, r.Duration)
		}
		doneBytes += int64(r.Bytes)
		repaired += r.Retransmissions + r.Decoded
	}
	elapsed := time.Since(start)
	prog.update(doneBytes, repaired, elapsed)
	prog.end()

	// What the receiver says next: chunks to send again (encrypted
	// payloads only), then its verdict.
	wait := o.peerT + time.Duration(float64(size)/1e9*float64(time.Second))
	var v verdict
	for round := uint32(1); ; round++ {
		vctx, cancel := context.WithTimeout(ctx, wait)
		err = fb.Wait(vctx)
		cancel()
		if err != nil {
			rep.verdictErr = fmt.Sprintf("no verdict from the receiver: %v", err)
			break
		}
		if pl == nil || !isRepair(fbuf) {
			if err := json.Unmarshal(bytes.TrimRight(fbuf, "\x00"), &v); err != nil {
				rep.verdictErr = fmt.Sprintf("malformed verdict: %v", err)
			} else if !v.OK {
				rep.verdictErr = "receiver: " + v.Error
			}
			break
		}
		w, k, err := o.repair(ctx, stderr, c, pl, fbuf, round, plain)
		if err != nil {
			return err
		}
		rep.AuthFailed += k
		rep.repairWire += w
		elapsed = time.Since(start) // the repairs are part of the transfer
		fbuf = make([]byte, fbSize)
		if fb, err = c.Post(ctx, fbuf); err != nil {
			return err
		}
	}
	if pl != nil {
		rep.CryptoCPU = pl.CPU().Seconds()
	}
	rep.OK = v.OK && v.Digest == sum
	if rep.Hash == "sha256" {
		rep.SHA256 = sum
	}
	summarise(&rep, results, offsets, conns, o, todoBytes, elapsed, start)
	if o.json {
		fmt.Fprintf(stdout, "%s\n", mustJSON(rep))
	} else {
		fmt.Fprintf(stdout, "haul: sent %s: %d bytes in %.3fs, %.3f Gbit/s goodput (ideal %.3fs at %.0f Mbit/s and %.1f ms RTT: %.2fx)\n",
			o.path, todoBytes, rep.Seconds, rep.Gbps, rep.Ideal, rep.Rate.IdealMbps, rep.RTTms, rep.Seconds/rep.Ideal)
		if rep.Probe != nil {
			fmt.Fprintf(stdout, "haul: probe: %d of %d echoed (loss %.2g a packet), RTT %.1f ms, %.3fs; sent at %.0f Mbit/s, echoes dispersed at %.0f Mbit/s\n",
				rep.Probe.Echoed, rep.Probe.Sent, rep.Probe.Loss, rep.Probe.RTTms, rep.Probe.Seconds, rep.Probe.SendMbps, rep.Probe.DispersionMbps)
		}
		printRate(stdout, &rep.Rate)
		if f := rep.Flow; f.WindowMax > 0 {
			fmt.Fprintf(stdout, "haul: flow control: the receiver's window %s to %s (shrank %d times); waited for it %.3fs\n",
				mib(f.WindowMin), mib(f.WindowMax), f.Cuts, f.Waited)
		} else {
			fmt.Fprintf(stdout, "haul: flow control: the receiver advertised no window\n")
		}
		fmt.Fprintf(stdout, "haul: scheme %s\n", rep.schemeMix)
		for _, d := range rep.Decisions {
			fmt.Fprintf(stdout, "haul:   at %.3fs, byte %d: %s (%s)\n", d.T, d.Byte, d.Scheme, d.Reason)
		}
		fmt.Fprintf(stdout, "haul: wire overhead %.1f%% (repeats %.1f%%), %d chunks repaired, chunk loss %.2g; model predicted %.3fs, measured %.3fs (%+.0f%%)\n",
			100*(rep.Overhead-1), 100*rep.Repeats, rep.Repaired, rep.Loss, rep.Predicted, rep.Seconds, 100*(rep.Seconds/rep.Predicted-1))
		if rep.warning != "" {
			fmt.Fprintf(stdout, "haul: warning: %s\n", rep.warning)
		}
		if rep.Resumed > 0 {
			fmt.Fprintf(stdout, "haul: resumed: %d bytes were already at the receiver\n", rep.Resumed)
		}
		if rep.Paths > 1 {
			fmt.Fprintf(stdout, "haul: %d paths carried %v bytes\n", rep.Paths, rep.PathBytes)
		}
		if rep.Workers > 1 {
			fmt.Fprintf(stdout, "haul: %d workers carried %v bytes\n", rep.Workers, rep.WorkerBytes)
		}
		fmt.Fprintf(stdout, "haul: %s\n", cryptoLine(rep.Encrypted, rep.CryptoCPU, "sealing",
			fmt.Sprintf("%d chunks sent again after failing authentication at the receiver", rep.AuthFailed)))
		fmt.Fprintf(stdout, "haul: %s %s %s\n", rep.Hash, sum, okWord(rep.OK))
	}
	if !rep.OK {
		if rep.verdictErr == "" {
			rep.verdictErr = rep.Hash + " mismatch"
		}
		return errors.New(rep.verdictErr)
	}
	return nil
}

// verifiedGrace is how long the sender waits for its last completions
// after the receiver's verdict says it has the whole file verified.
const verifiedGrace = time.Second

// sentRegion is a region's send, completed or failed.
type sentRegion struct {
	r      reliability.SendResult
	region int
	err    error
}

// sendRegions sends the regions todo on c in order, window at a time,
// and reports each on done as it completes: one worker's part of a
// transfer. It stops at the first failure, which it reports, or when ctx
// ends. With pl, each region is sealed into a buffer of its own first.
func sendRegions(ctx context.Context, c *reliability.Conn, todo []int, window int, plain func(int) []byte, pl *payload, done chan<- sentRegion) {
	type inflight struct {
		s      *reliability.Send
		buf    []byte // sealed copy, reused when the send completes
		region int
	}
	var fly []inflight
	var free [][]byte
	left := int64(0)
	for _, i := range todo {
		left += int64(len(plain(i)))
	}
	next := 0
	for next < len(todo) || len(fly) > 0 {
		for next < len(todo) && len(fly) < window {
			i := todo[next]
			next++
			data, buf := plain(i), []byte(nil)
			if pl != nil {
				if k := len(free); k > 0 {
					buf, free = free[k-1], free[:k-1]
				} else {
					buf = make([]byte, pl.l.sealedLen(0))
				}
				pl.sealRegion(buf, data, i)
				data = buf[:pl.l.sealedLen(i)]
			}
			s, err := c.Send(ctx, data, &reliability.SendOptions{Stream: left})
			if err != nil {
				done <- sentRegion{region: i, err: err}
				return
			}
			left -= int64(len(plain(i)))
			fly = append(fly, inflight{s, buf, i})
		}
		select {
		case <-fly[0].s.Done():
		case <-ctx.Done():
			return
		}
		f := fly[0]
		fly = fly[1:]
		r, err := f.s.Wait(ctx)
		if err != nil {
			done <- sentRegion{region: f.region, err: err}
			return
		}
		if f.buf != nil {
			free = append(free, f.buf)
		}
		r.Bytes = len(plain(f.region)) // not the sealed length
		done <- sentRegion{r: r, region: f.region}
	}
}

// dialErr explains a failed connection setup, the key's part in it first.
func (o *sendOpts) dialErr(path int, err error) error {
	var rej *cm.RejectError
	switch {
	case errors.As(err, &rej):
		hint := ""
		switch r := rej.Reason; {
		case strings.Contains(r, "no MAC"):
			hint = " (it requires a key: give this end its --key-file)"
		case strings.Contains(r, "listener has no key"):
			hint = " (it was started without --key-file)"
		case strings.Contains(r, cm.ErrAuth.Error()):
			hint = " (the keys differ: give both ends the same --key-file)"
		}
		return fmt.Errorf("the receiver at %s refused: %s%s", o.to, rej.Reason, hint)
	case errors.Is(err, cm.ErrAuth):
		return fmt.Errorf("the receiver at %s could not prove that it holds the key; nothing was sent: %w", o.to, err)
	case path > 0:
		return fmt.Errorf("peer %s: path %d: %w", o.to, path, err)
	}
	return fmt.Errorf("peer %s unreachable: %w", o.to, err)
}

// repair answers a repair request (in fbuf, from the receiver, which
// holds the key: it is checked all the same, since the sender seals only
// chunks of the file, each once per round): it sends the chunks named,
// sealed for this round, as one message, and returns its wire bytes and
// how many chunks it carried.
func (o *sendOpts) repair(ctx context.Context, stderr io.Writer, c *reliability.Conn, pl *payload, fbuf []byte, round uint32, plain func(int) []byte) (int64, int, error) {
	got, ids, err := parseRepair(fbuf)
	if err == nil && got != round {
		err = fmt.Errorf("%w: round %d, expected %d", errRepair, got, round)
	}
	if err == nil {
		err = pl.l.check(ids)
	}
	if err != nil {
		return 0, 0, fmt.Errorf("the receiver: %w", err)
	}
	if o.verbose {
		fmt.Fprintf(stderr, "haul: repair round %d: %d chunks failed authentication at the receiver\n", round, len(ids))
	}
	buf := make([]byte, len(ids)*pl.l.wire)
	pl.sealRepair(buf, ids, round, plain)
	s, err := c.Send(ctx, buf, nil)
	if err != nil {
		return 0, 0, err
	}
	r, err := s.Wait(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("repair round %d: %w", round, err)
	}
	return r.WireBytes, len(ids), nil
}

// cryptoLine says in a report whether the payload was encrypted, and if
// so the CPU time it cost and what became of the chunks that failed
// authentication.
func cryptoLine(on bool, cpu float64, doing, failed string) string {
	if !on {
		return "payload not encrypted"
	}
	return fmt.Sprintf("payload encrypted (AES-256-GCM, under this session's own key): %.3fs CPU %s; %s", cpu, doing, failed)
}

// probeRep is the probe train's account in the report.
type probeRep struct {
	Sent    int     `json:"sent"`
	Echoed  int     `json:"echoed"`
	Loss    float64 `json:"loss"` // per packet, one way
	RTTms   float64 `json:"rtt_ms"`
	Seconds float64 `json:"seconds"` // before the transfer's clock starts, as the connection setup
	// DispersionMbps is the rate the echoes came back at: the path's
	// bottleneck if below --rate (the train is paced at --rate).
	DispersionMbps float64 `json:"dispersion_mbps"`
	SendMbps       float64 `json:"send_mbps"` // the rate the train went out at
}

// flowRep is flow control's account in the report: the receiver's
// window as the sender saw it, and how long the sender waited for it.
type flowRep struct {
	WindowMin int64   `json:"window_min"` // bytes; 0: no window
	WindowMax int64   `json:"window_max"`
	Cuts      int     `json:"window_cuts"` // times it shrank
	Waited    float64 `json:"waited_seconds"`
}

// mib spells a byte count in MiB.
func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// decision is one of the model's choices in the report: when (seconds
// from the transfer's start), from which byte of the file on, and why.
type decision struct {
	T         float64 `json:"t"`
	Byte      int64   `json:"byte"`
	Scheme    string  `json:"scheme"`
	ChunkLoss float64 `json:"chunk_loss"`
	RTTms     float64 `json:"rtt_ms"`
	Left      int64   `json:"left_bytes"`
	Reason    string  `json:"reason"`
}

// repeatWarn is the share of the payload sent again above which the
// report warns: loss that high, or a receiver that reports late (a
// receiver that cannot keep up, or a rate above the path's), costs the
// path that much more than the payload.
const repeatWarn = 0.03

func schemeName(s reliability.Scheme, k, m int) string {
	if s == reliability.EC && m > 0 {
		return fmt.Sprintf("ec(%d,%d)", k, m)
	}
	return "sr"
}

// summarise fills the report's figures from the sends and the model.
// offsets are the file offsets of the results' regions.
func summarise(rep *report, results []reliability.SendResult, offsets []int64, conns []*reliability.Conn, o *sendOpts, todo int64, elapsed time.Duration, start time.Time) {
	c := conns[0] // the model's view and the rate are the first worker's
	rep.Seconds = elapsed.Seconds()
	rep.Gbps = float64(todo) * 8 / rep.Seconds / 1e9
	l := c.Link()
	rep.RTTms = float64(l.RTT.Microseconds()) / 1e3
	rep.Loss = l.Loss
	rep.Rate = rateReport(c, o, start)
	rep.Ideal = float64(todo)/(rep.Rate.IdealMbps*1e6/8) + l.RTT.Seconds()
	rep.Paths, rep.PathBytes = o.paths, make([]uint64, len(c.PathBytes()))
	for _, c := range conns {
		var sum uint64
		for p, b := range c.PathBytes() {
			rep.PathBytes[p] += b
			sum += b
		}
		rep.WorkerBytes = append(rep.WorkerBytes, sum)
	}
	fl := c.Flow()
	rep.Flow = flowRep{WindowMin: fl.PeerMin, WindowMax: fl.PeerMax, Cuts: fl.PeerCuts, Waited: fl.Waited.Seconds()}
	byScheme := map[string]int64{}
	var wire, repeats int64
	rep.Decisions = []decision{}
	last := ""
	for i, r := range results {
		wire += r.WireBytes
		repeats += int64(r.Retransmissions) * int64(r.Chunk)
		rep.Repaired += r.Retransmissions + r.Decoded
		rep.Timeouts += r.Timeouts
		// Each decision holds from its chunk to the next one's; the
		// bytes are the plain ones (a sealed region's chunks are scaled).
		n := (r.Bytes + r.Chunk - 1) / max(r.Chunk, 1)
		for j, d := range r.Decisions {
			end := n
			if j+1 < len(r.Decisions) {
				end = r.Decisions[j+1].Chunk
			}
			name := schemeName(d.Scheme, d.K, d.M)
			byScheme[name] += int64(min(end, n)-min(d.Chunk, n)) * int64(r.Chunk)
			if name == last {
				continue
			}
			last = name
			rep.Decisions = append(rep.Decisions, decision{T: max(d.At.Sub(start).Seconds(), 0), Byte: offsets[i] + int64(d.Chunk)*int64(r.Chunk),
				Scheme: name, ChunkLoss: d.Loss, RTTms: float64(d.RTT.Microseconds()) / 1e3, Left: d.Remaining, Reason: d.Reason})
		}
	}
	wire += rep.repairWire
	if todo > 0 {
		rep.Overhead = float64(wire) / float64(todo)
		rep.Repeats = float64(repeats) / float64(todo)
	}
	if rep.Repeats > repeatWarn {
		why := "the receiver reports late (it cannot keep up, or --rate is above the path's)"
		if o.auto {
			why = "the receiver reports late (it cannot keep up), or the path dropped what the rate controller sent before it backed off"
		}
		if rep.Rate.Stalls > 0 {
			why = fmt.Sprintf("the path went down (for %.1fs at the longest): what was in flight then was sent again", rep.Rate.LongestStall)
		}
		rep.warning = fmt.Sprintf("%.1f%% of the payload was sent again (%d timeouts): the loss is high, or %s",
			100*rep.Repeats, rep.Timeouts, why)
	}
	var names []string
	for k := range byScheme {
		names = append(names, k)
	}
	sort.Slice(names, func(i, j int) bool { return byScheme[names[i]] > byScheme[names[j]] })
	var mix []string
	for _, k := range names {
		mix = append(mix, fmt.Sprintf("%s for %d bytes", k, min(byScheme[k], todo)))
	}
	rep.schemeMix = strings.Join(mix, ", ")
	if len(names) > 0 {
		rep.Scheme = names[0]
	}
	// The model's prediction for this transfer, with the link as measured
	// (rate as configured, RTT from pings, loss from probes and data),
	// for the scheme of most bytes.
	if len(results) > 0 {
		r := results[0]
		m := 0
		if rep.Scheme != "sr" {
			fmt.Sscanf(rep.Scheme, "ec(%d,%d)", new(int), &m)
		}
		rep.Predicted = c.Predict(todo, r.Chunk, o.k, m).Seconds()
	}
}

// settled says whether the receiver's verdict is in already.
func settled(fb *reliability.Recv) bool {
	select {
	case <-fb.Done():
		return true
	default:
		return false
	}
}

// pickRegion is --region, or by default 16 MiB, larger for files that
// would need more than maxRegions of them.
func pickRegion(flag, size int64) (int64, error) {
	if flag != 0 {
		if n := regions(size, flag); n > maxRegions {
			return 0, fmt.Errorf("--region %d: %d regions, at most %d: use a larger --region", flag, n, maxRegions)
		}
		return flag, nil
	}
	const mib = 1 << 20
	r := max(16*mib, (size+maxRegions-1)/maxRegions)
	r = (r + mib - 1) / mib * mib
	if r > maxRegion {
		return 0, fmt.Errorf("a file of %d bytes is too large: at most %d regions of %d bytes", size, maxRegions, int64(maxRegion))
	}
	return r, nil
}

// ready waits for the first round trip, or for the verdict: a receiver
// with nothing to fetch (an empty file, all of it there) may have
// concluded and gone before a ping was answered.
func ready(ctx context.Context, c *reliability.Conn, vr *reliability.Recv, timeout time.Duration) error {
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	go func() {
		select {
		case <-vr.Done():
			cancel()
		case <-rctx.Done():
		}
	}()
	err := c.Ready(rctx)
	select {
	case <-vr.Done():
		return nil
	default:
	}
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("no answer from the receiver: %w", err)
	}
	return err
}

// mapFile maps the regular file at path for reading (nil for an empty
// one) and returns its size and what unmaps and closes it.
func mapFile(path string) ([]byte, int64, func(), error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, nil, err // names the file and says why (no such file, permission)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, nil, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, 0, nil, fmt.Errorf("%s: not a regular file", path)
	}
	size := fi.Size()
	var mm []byte
	if size > 0 {
		if mm, err = unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED); err != nil {
			f.Close()
			return nil, 0, nil, fmt.Errorf("map %s: %w", path, err)
		}
	}
	return mm, size, func() {
		if mm != nil {
			unix.Munmap(mm)
		}
		f.Close()
	}, nil
}
