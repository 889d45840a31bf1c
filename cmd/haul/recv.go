package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rvma/rvma/reliability"
	"github.com/rvma/rvma/verbs/cm"
)

// state is what the receiver keeps beside the output (PATH.haul) so that
// an interrupted transfer resumes: the offer it belongs to and the
// regions complete so far.
type state struct {
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
	Region int64  `json:"region"`
	Have   []byte `json:"have"`
}

func statePath(out string) string { return out + ".haul" }

func loadState(out string, off *offer) []byte {
	b, err := os.ReadFile(statePath(out))
	if err != nil {
		return nil
	}
	var st state
	if json.Unmarshal(b, &st) != nil || st.Size != off.Size || st.SHA256 != off.SHA256 || st.Region != off.Region {
		return nil // another file, or another layout: start over
	}
	return st.Have
}

func saveState(out string, off *offer, have []byte) error {
	b := mustJSON(state{Size: off.Size, SHA256: off.SHA256, Region: off.Region, Have: have})
	tmp := statePath(out) + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, statePath(out))
}

func regions(size, region int64) int { return int((size + region - 1) / region) }

func hasRegion(have []byte, i int) bool { return i/8 < len(have) && have[i/8]&(1<<(i%8)) != 0 }

// openOutput creates or reopens the output at its full size. Space is
// reserved up front, so a full disk is an error now rather than a crash
// (SIGBUS) when a chunk lands in the mapping.
func openOutput(out string, off *offer) (*os.File, []byte, error) {
	have := loadState(out, off)
	flags := os.O_RDWR | os.O_CREATE
	if have == nil {
		flags |= os.O_TRUNC
	}
	f, err := os.OpenFile(out, flags, 0o644)
	if err != nil {
		return nil, nil, err
	}
	if err := f.Truncate(off.Size); err != nil {
		f.Close()
		return nil, nil, err
	}
	if off.Size > 0 {
		if err := unix.Fallocate(int(f.Fd()), 0, 0, off.Size); err != nil && !errors.Is(err, unix.EOPNOTSUPP) {
			f.Close()
			if errors.Is(err, unix.ENOSPC) {
				return nil, nil, fmt.Errorf("%s: no space for %d bytes (disk full)", out, off.Size)
			}
			return nil, nil, fmt.Errorf("%s: reserve %d bytes: %w", out, off.Size, err)
		}
	}
	if have == nil {
		have = make([]byte, (regions(off.Size, off.Region)+7)/8)
	}
	return f, have, nil
}

// acceptPaths accepts the sender's further paths, each onto the QP of
// its index.
func acceptPaths(ctx context.Context, ln *cm.Listener, e *endpoint, off *offer, o *common) error {
	done := make([]bool, len(e.qps))
	done[0] = true
	for left := len(e.qps) - 1; left > 0; {
		actx, cancel := context.WithTimeout(ctx, o.peerT)
		req, err := ln.Accept(actx)
		cancel()
		if err != nil {
			return fmt.Errorf("the sender's further paths did not arrive: %w", err)
		}
		var h pathHello
		if json.Unmarshal(req.PrivateData(), &h) != nil || h.SHA256 != off.SHA256 || h.Path < 1 || h.Path >= len(e.qps) || done[h.Path] {
			req.Reject("not a path of this transfer")
			continue
		}
		via, err := o.viaGID(h.Path)
		if err != nil {
			req.Reject("receiver misconfigured")
			return err
		}
		if err := req.Accept(ctx, e.qps[h.Path], &cm.Config{Via: via}); err != nil {
			return fmt.Errorf("path %d: %w", h.Path, err)
		}
		done[h.Path] = true
		left--
	}
	return nil
}

func receive(ctx context.Context, o *recvOpts, stdout, stderr io.Writer) error {
	local, err := netip.ParseAddrPort(o.listen)
	if err != nil {
		return fmt.Errorf("--listen %q: want ip:port: %w", o.listen, err)
	}
	ln, err := cm.Listen(ctx, o.listen)
	if err != nil {
		return err
	}
	defer ln.Close()
	fmt.Fprintf(stderr, "haul: listening on %v\n", ln.Addr())
	req, err := ln.Accept(ctx)
	if err != nil {
		return err
	}
	var off offer
	if err := json.Unmarshal(req.PrivateData(), &off); err != nil || off.Size < 0 || off.Region < 4096 {
		req.Reject("malformed offer")
		return fmt.Errorf("malformed offer from the sender: %q", req.PrivateData())
	}
	f, have, err := openOutput(o.out, &off)
	if err != nil {
		req.Reject(err.Error())
		return err
	}
	defer f.Close()
	n := regions(off.Size, off.Region)
	had := 0
	for i := 0; i < n; i++ {
		if hasRegion(have, i) {
			had++
		}
	}
	if had > 0 {
		fmt.Fprintf(stderr, "haul: resuming %s: %d of %d regions already here\n", o.out, had, n)
	}
	paths := max(off.Paths, 1)
	if paths > 16 {
		req.Reject("too many paths")
		return fmt.Errorf("the sender offers %d paths, at most 16", paths)
	}
	via, err := o.viaGID(0)
	if err != nil {
		req.Reject("receiver misconfigured")
		return err
	}
	if len(o.vias) > 0 && len(o.vias) != paths {
		req.Reject("receiver misconfigured")
		return fmt.Errorf("--via: %d relays, but the sender uses %d paths", len(o.vias), paths)
	}
	cfg := o.relCfg(off.K, 0, max(off.M, 8), reliability.Auto, paths)
	e, err := open(ctx, local, paths, cfg)
	if err != nil {
		req.Reject(err.Error())
		return err
	}
	defer e.close()
	if err := req.Accept(ctx, e.qps[0], &cm.Config{PrivateData: mustJSON(answer{Have: have}), Via: via}); err != nil {
		return err
	}
	if err := acceptPaths(ctx, ln, e, &off, &o.common); err != nil {
		return err
	}
	if e.conn, err = reliability.NewPaths(e.pd, e.qps, e.cq, cfg); err != nil {
		return err
	}
	var mm []byte
	if off.Size > 0 {
		if mm, err = unix.Mmap(int(f.Fd()), 0, int(off.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
			return fmt.Errorf("map %s: %w", o.out, err)
		}
		defer unix.Munmap(mm)
	}
	start := time.Now()
	recvErr := receiveRegions(ctx, e.conn, mm, &off, have, o.out, o.slots)
	if recvErr == nil && off.Size > 0 {
		recvErr = unix.Msync(mm, unix.MS_SYNC)
	}
	elapsed := time.Since(start)
	if o.verbose {
		fmt.Fprintf(stderr, "haul: device counters %+v\n", e.dev.Stats())
	}
	if recvErr != nil {
		kept := 0
		for i := 0; i < n; i++ {
			if hasRegion(have, i) {
				kept++
			}
		}
		return fmt.Errorf("%w; %d of %d regions are kept in %s (run again to resume)", recvErr, kept, n, o.out)
	}
	// The mapping is the file's page cache: hashing it reads what is on disk.
	sum := sha256Hex(mm)
	v := verdict{SHA256: sum, OK: sum == off.SHA256}
	if !v.OK {
		v.Error = "sha256 mismatch"
	}
	if v.OK {
		os.Remove(statePath(o.out))
	}
	// Tell the sender; its receive for the verdict was its first Post.
	s, err := e.conn.Send(ctx, mustJSON(v), nil)
	if err == nil {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err = s.Wait(wctx)
		cancel()
	}
	if err != nil {
		fmt.Fprintf(stderr, "haul: could not tell the sender the verdict: %v\n", err)
	}
	gbps := float64(off.Size) * 8 / elapsed.Seconds() / 1e9
	if o.json {
		fmt.Fprintf(stdout, "%s\n", mustJSON(map[string]any{"bytes": off.Size, "seconds": elapsed.Seconds(), "gbps": gbps, "sha256": sum, "ok": v.OK}))
	} else {
		fmt.Fprintf(stdout, "haul: received %s (%d bytes) in %.3fs, %.3f Gbit/s; sha256 %s %s\n", o.out, off.Size, elapsed.Seconds(), gbps, sum, okWord(v.OK))
	}
	if !v.OK {
		return fmt.Errorf("%s: %s", o.out, v.Error)
	}
	return nil
}

func okWord(ok bool) string {
	if ok {
		return "verified"
	}
	return "MISMATCH"
}

// receiveRegions posts every missing region in order (as many at once as
// the connection has slots) and records each as it completes.
func receiveRegions(ctx context.Context, c *reliability.Conn, mm []byte, off *offer, have []byte, out string, slots int) error {
	n := regions(off.Size, off.Region)
	var pending []*reliability.Recv
	var idx []int
	next := 0
	for {
		for next < n && hasRegion(have, next) {
			next++
		}
		if next < n && len(pending) < slots {
			lo := int64(next) * off.Region
			hi := min(lo+off.Region, off.Size)
			r, err := c.Post(ctx, mm[lo:hi])
			if err != nil {
				return err
			}
			pending, idx = append(pending, r), append(idx, next)
			next++
			continue
		}
		if len(pending) == 0 {
			return nil
		}
		if err := pending[0].Wait(ctx); err != nil {
			return err
		}
		have[idx[0]/8] |= 1 << (idx[0] % 8)
		if err := saveState(out, off, have); err != nil {
			return fmt.Errorf("save progress: %w", err)
		}
		pending, idx = pending[1:], idx[1:]
	}
}

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
