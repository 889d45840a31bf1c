package rma

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/internal/testbed"
	"github.com/rvma/rvma/mailbox"
	"github.com/rvma/rvma/multipath"
	"github.com/rvma/rvma/verbs"
)

func randBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

// pathBytes sums the bytes the paths to r carried, and counts the paths
// that carried any.
func pathBytes(st []multipath.Stats) (total uint64, used int) {
	for _, p := range st {
		total += p.Bytes
		if p.Bytes > 0 {
			used++
		}
	}
	return total, used
}

// Large contiguous puts and gets are split over every path and arrive
// intact; small and strided ones take the RC connection; fence orders
// them all.
func TestPathsPutGetFence(t *testing.T) {
	for _, provider := range []string{"loop", "udp", "shm"} {
		t.Run(provider, func(t *testing.T) {
			const n, big = 3, 1 << 20
			// A -race run under load split the 1 MiB over 2 of 3 paths:
			// Proportional's probes can rate a path so low that its share
			// rounds to nothing, and multipath's short default timeouts
			// (20-80 ms, 7 retries) can declare a path whose peer was
			// descheduled dead. Equal shares and patient paths keep this
			// test about rma; the balancer and failover are multipath's.
			patient := multipath.Config{Balancer: multipath.Equal{},
				Connect: verbs.ConnectConfig{Timeout: 200 * time.Millisecond, MaxTimeout: 2 * time.Second}}
			comms := newWorld(t, n, &Config{Provider: provider, Paths: 3, Multipath: patient})
			each(t, comms, func(ctx context.Context, c *Comm) error {
				w, err := c.Allocate(ctx, 2*big+4096, nil)
				if err != nil {
					return err
				}
				next, prev := (c.Rank()+1)%n, (c.Rank()+n-1)%n
				data := randBytes(big)
				small := randBytes(100)
				strided := randBytes(64 << 10)
				if err := w.Fence(ctx, 0); err != nil {
					return err
				}
				if err := w.Put(ctx, data, next, 0); err != nil {
					return err
				}
				if err := w.Put(ctx, small, next, 2*big); err != nil {
					return err
				}
				// Every other 1 KiB block: not contiguous, so not split.
				if err := w.PutLayout(ctx, strided, Layout{}, next, big, Layout{Count: 64, Block: 1024, Stride: 2048}); err != nil {
					return err
				}
				if err := w.Fence(ctx, 0); err != nil {
					return err
				}
				// What prev put here, read back by prev over the paths too.
				got := make([]byte, big)
				req, err := w.Rget(ctx, got, prev, 0)
				if err != nil {
					return err
				}
				if err := req.Wait(ctx); err != nil {
					return err
				}
				if err := w.Fence(ctx, ModeNoSucceed); err != nil {
					return err
				}
				// Own window holds prev's data; got holds prev's window,
				// which holds what prev's prev put. Check both through the
				// collective exchange of the originals.
				all, err := c.Allgather(ctx, data)
				if err != nil {
					return err
				}
				smalls, err := c.Allgather(ctx, small)
				if err != nil {
					return err
				}
				strides, err := c.Allgather(ctx, strided)
				if err != nil {
					return err
				}
				mem := w.Bytes()
				if !bytes.Equal(mem[:big], all[prev]) {
					return fmt.Errorf("rank %d: the split put from %d arrived corrupted", c.Rank(), prev)
				}
				if !bytes.Equal(mem[2*big:2*big+100], smalls[prev]) {
					return fmt.Errorf("rank %d: the small put differs", c.Rank())
				}
				for i := range 64 {
					if !bytes.Equal(mem[big+i*2048:big+i*2048+1024], strides[prev][i*1024:(i+1)*1024]) {
						return fmt.Errorf("rank %d: strided block %d differs", c.Rank(), i)
					}
				}
				if !bytes.Equal(got, all[(prev+n-1)%n]) {
					return fmt.Errorf("rank %d: the split get returned wrong bytes", c.Rank())
				}
				st := c.Paths(next)
				if len(st) != 3 {
					return fmt.Errorf("rank %d: %d paths to %d, want 3", c.Rank(), len(st), next)
				}
				total, used := pathBytes(st)
				if used != 3 || total < big {
					return fmt.Errorf("rank %d: paths carried %d bytes on %d paths, want >= %d on 3", c.Rank(), total, used, big)
				}
				if c.Paths(c.Rank()) != nil {
					return fmt.Errorf("operations to self must not use paths")
				}
				return w.Free(ctx)
			})
		})
	}
}

// Complete's message travels on the RC connection, which does not order
// it behind writes on other paths: the target must still see every byte
// once Wait returns.
func TestPathsPSCW(t *testing.T) {
	comms := newWorld(t, 2, &Config{Paths: 4, Connect: verbs.ConnectConfig{Timeout: time.Second}})
	const big = 4 << 20
	each(t, comms, func(ctx context.Context, c *Comm) error {
		w, err := c.Allocate(ctx, big, nil)
		if err != nil {
			return err
		}
		if c.Rank() == 0 {
			// Paths 1-3 are slow: their writes land well after a message
			// on path 0 (the RC connection's) would.
			for i := 1; i < 4; i++ {
				if err := c.Device().SetFaults(i, verbs.Faults{Delay: 20 * time.Millisecond}); err != nil {
					return err
				}
			}
		}
		for round := range 3 {
			data := bytes.Repeat([]byte{byte(round + 1)}, big)
			if c.Rank() == 0 {
				if err := w.Start(ctx, []int{1}, 0); err != nil {
					return err
				}
				if err := w.Put(ctx, data, 1, 0); err != nil {
					return err
				}
				if err := w.Complete(ctx); err != nil {
					return err
				}
			} else {
				if err := w.Post(ctx, []int{0}, 0); err != nil {
					return err
				}
				if err := w.Wait(ctx); err != nil {
					return err
				}
				if !bytes.Equal(w.Bytes(), data) {
					return fmt.Errorf("round %d: the window is not complete when Wait returns", round)
				}
			}
			if err := c.Barrier(ctx); err != nil {
				return err
			}
		}
		return w.Free(ctx)
	})
}

// A notified window counts the bytes of a split put exactly once: the
// epoch completes when all have arrived, not before. A window that counts
// puts is never split, so one put is one count.
func TestPathsNotified(t *testing.T) {
	comms := newWorld(t, 2, &Config{Paths: 3, Multipath: multipath.Config{Balancer: multipath.Equal{}, // see TestPathsPutGetFence
		Connect: verbs.ConnectConfig{Timeout: 200 * time.Millisecond, MaxTimeout: 2 * time.Second}}})
	const big = 1 << 20
	each(t, comms, func(ctx context.Context, c *Comm) error {
		wb, err := c.Allocate(ctx, big, &WinConfig{Notify: &NotifyConfig{ExpectFrom: map[int]int{0: big}}})
		if err != nil {
			return err
		}
		wo, err := c.Allocate(ctx, big, &WinConfig{Notify: &NotifyConfig{ExpectFrom: map[int]int{0: 2}, Count: mailbox.CountOps}})
		if err != nil {
			return err
		}
		for epoch := 1; epoch <= 3; epoch++ {
			if c.Rank() == 0 {
				data := bytes.Repeat([]byte{byte(epoch)}, big)
				// Four quarter puts, each split over the paths.
				for q := range 4 {
					if err := wb.Put(ctx, data[q*big/4:(q+1)*big/4], 1, q*big/4); err != nil {
						return err
					}
				}
				for h := range 2 {
					if err := wo.Put(ctx, data[h*big/2:(h+1)*big/2], 1, h*big/2); err != nil {
						return err
					}
				}
				if err := wb.FlushAll(ctx); err != nil {
					return err
				}
				if err := wo.FlushAll(ctx); err != nil {
					return err
				}
			} else {
				for _, w := range []*Win{wb, wo} {
					e, err := w.WaitEpoch(ctx)
					if err != nil {
						return err
					}
					if e != uint64(epoch) {
						return fmt.Errorf("epoch %d completed as %d", epoch, e)
					}
					if !bytes.Equal(w.Bytes(), bytes.Repeat([]byte{byte(epoch)}, big)) {
						return fmt.Errorf("epoch %d: window incomplete at completion", epoch)
					}
					if _, done, err := w.TestEpoch(); err != nil || done {
						return fmt.Errorf("epoch %d: a further epoch completed (done %v, err %v): bytes counted twice", epoch, done, err)
					}
				}
			}
			if err := c.Barrier(ctx); err != nil {
				return err
			}
		}
		if c.Rank() == 0 {
			if total, used := pathBytes(c.Paths(1)); used != 3 || total != 3*big {
				return fmt.Errorf("paths carried %d bytes on %d paths; want %d (the byte-counted window's) on 3", total, used, 3*big)
			}
		}
		if err := wo.Free(ctx); err != nil {
			return err
		}
		return wb.Free(ctx)
	})
}

// Puts of consecutive epochs in flight together, on paths of different
// delays: a later epoch's put must not be counted into an earlier epoch's
// buffer (which would complete it early and leave the last one short).
func TestPathsNotifiedRunAhead(t *testing.T) {
	comms := newWorld(t, 2, &Config{Paths: 3, Connect: verbs.ConnectConfig{Timeout: time.Second}})
	const big, epochs = 256 << 10, 6
	each(t, comms, func(ctx context.Context, c *Comm) error {
		w, err := c.Allocate(ctx, epochs*big, &WinConfig{Notify: &NotifyConfig{ExpectFrom: map[int]int{0: big}, Depth: epochs}})
		if err != nil {
			return err
		}
		if c.Rank() == 0 {
			for i := 1; i < 3; i++ {
				if err := c.Device().SetFaults(i, verbs.Faults{Delay: time.Duration(i) * 5 * time.Millisecond}); err != nil {
					return err
				}
			}
			var reqs []*Request
			for e := range epochs {
				// Each epoch: a split put and a small one, into its own
				// part of the window.
				data := bytes.Repeat([]byte{byte(e + 1)}, big)
				r, err := w.Rput(ctx, data[:big-100], 1, e*big)
				if err != nil {
					return err
				}
				r2, err := w.Rput(ctx, data[big-100:], 1, e*big+big-100)
				if err != nil {
					return err
				}
				reqs = append(reqs, r, r2)
			}
			if err := WaitAll(ctx, reqs...); err != nil {
				return err
			}
		} else {
			for e := range epochs {
				if _, err := w.WaitEpoch(ctx); err != nil {
					return fmt.Errorf("epoch %d: %w", e, err)
				}
				if !bytes.Equal(w.Bytes()[e*big:(e+1)*big], bytes.Repeat([]byte{byte(e + 1)}, big)) {
					return fmt.Errorf("epoch %d completed before its bytes arrived", e)
				}
			}
		}
		if err := c.Barrier(ctx); err != nil {
			return err
		}
		return w.Free(ctx)
	})
}

// A put that crosses its epoch's expectation counts whole into the epoch
// it starts in, as it does over one RC connection: it is not split (its
// pieces would be counted into two epochs), and the epoch completes only
// when all of it has arrived.
func TestPathsNotifiedStraddle(t *testing.T) {
	comms := newWorld(t, 2, &Config{Paths: 3, Connect: verbs.ConnectConfig{Timeout: time.Second}})
	const e, put = 1 << 20, 768 << 10
	each(t, comms, func(ctx context.Context, c *Comm) error {
		w, err := c.Allocate(ctx, 4*put, &WinConfig{Notify: &NotifyConfig{ExpectFrom: map[int]int{0: e}}})
		if err != nil {
			return err
		}
		if c.Rank() == 0 {
			for i := 1; i < 3; i++ {
				if err := c.Device().SetFaults(i, verbs.Faults{Delay: time.Duration(i) * 10 * time.Millisecond}); err != nil {
					return err
				}
			}
			for p := range 4 {
				if err := w.Put(ctx, bytes.Repeat([]byte{byte(p + 1)}, put), 1, p*put); err != nil {
					return err
				}
			}
			if err := w.FlushAll(ctx); err != nil {
				return err
			}
		} else {
			for ep := range 2 {
				if _, err := w.WaitEpoch(ctx); err != nil {
					return err
				}
				// Epoch ep holds puts 2ep and 2ep+1, whole.
				for p := 2 * ep; p < 2*ep+2; p++ {
					if !bytes.Equal(w.Bytes()[p*put:(p+1)*put], bytes.Repeat([]byte{byte(p + 1)}, put)) {
						return fmt.Errorf("epoch %d completed before put %d arrived whole", ep, p)
					}
				}
			}
			if _, done, err := w.TestEpoch(); err != nil || done {
				return fmt.Errorf("a third epoch completed (%v, %v)", done, err)
			}
		}
		if err := c.Barrier(ctx); err != nil {
			return err
		}
		return w.Free(ctx)
	})
}

// A path that dies mid-transfer: its part is written again over the
// others, the data arrives intact, and the path shows down.
func TestPathsFailover(t *testing.T) {
	comms := newWorld(t, 2, &Config{Paths: 3, Multipath: multipath.Config{Revive: -1},
		Connect: verbs.ConnectConfig{Timeout: 100 * time.Millisecond, RetryCount: 2}})
	const big = 8 << 20
	data := randBytes(big)
	each(t, comms, func(ctx context.Context, c *Comm) error {
		w, err := c.Allocate(ctx, big, nil)
		if err != nil {
			return err
		}
		if c.Rank() == 0 {
			if err := w.LockAll(ctx); err != nil {
				return err
			}
			// Connect the paths first, then kill path 1 and put.
			if err := w.Put(ctx, data[:1<<20], 1, 0); err != nil {
				return err
			}
			if err := w.FlushAll(ctx); err != nil {
				return err
			}
			if err := c.Device().SetFaults(1, verbs.Faults{Drop: 1}); err != nil {
				return err
			}
			if err := w.Put(ctx, data, 1, 0); err != nil {
				return err
			}
			if err := w.UnlockAll(ctx); err != nil {
				return err
			}
			st := c.Paths(1)
			if st[1].Up || !st[0].Up || !st[2].Up {
				return fmt.Errorf("path states after failover: %+v", st)
			}
		}
		if err := c.Barrier(ctx); err != nil {
			return err
		}
		if c.Rank() == 1 && !bytes.Equal(w.Bytes(), data) {
			return fmt.Errorf("data differs after failover")
		}
		if err := c.Barrier(ctx); err != nil {
			return err
		}
		return w.Free(ctx)
	})
}

func TestPathsConfig(t *testing.T) {
	ctx := context.Background()
	for _, p := range []int{-1, 65} {
		_, err := NewWorld(ctx, 2, &Config{Paths: p})
		require.ErrorIs(t, err, ErrBootstrap, "paths %d", p)
	}
	_, err := NewWorld(ctx, 2, &Config{Devices: []*verbs.Device{nil}})
	require.ErrorIs(t, err, ErrBootstrap)

	c := (&Config{Addr: "10.0.0.1, 10.0.1.1", Paths: 3}).withDefaults()
	require.Equal(t, "udp://10.0.0.1:0,10.0.1.1:0,10.0.0.1:0?mtu=max", c.udpURI())
	c.MTU = 1024
	require.Equal(t, "udp://10.0.0.1:0,10.0.1.1:0,10.0.0.1:0?mtu=1024", c.udpURI())
	require.Equal(t, "10.0.0.1:0", c.cmAddr())
	// The environment counts in Init only (fromEnv), never in NewWorld.
	t.Setenv(EnvPaths, "2")
	require.Equal(t, 1, (&Config{}).withDefaults().Paths)
	env, err := (&Config{}).fromEnv()
	require.NoError(t, err)
	require.Equal(t, 2, env.withDefaults().Paths)
	require.Equal(t, 2, env.withDefaults().Multipath.Paths)
	t.Setenv(EnvPaths, "two")
	_, err = (&Config{}).fromEnv()
	require.ErrorIs(t, err, ErrBootstrap)
	t.Setenv(EnvPaths, "")

	// rvmarun --rc-timeout reaches the ranks as RVMA_RC_TIMEOUT; a value
	// in the Config wins.
	t.Setenv(EnvRCTimeout, "150ms")
	env, err = (&Config{}).fromEnv()
	require.NoError(t, err)
	require.Equal(t, 150*time.Millisecond, env.Connect.Timeout)
	env, err = (&Config{Connect: verbs.ConnectConfig{Timeout: time.Second}}).fromEnv()
	require.NoError(t, err)
	require.Equal(t, time.Second, env.Connect.Timeout)
	t.Setenv(EnvRCTimeout, "soon")
	_, err = (&Config{}).fromEnv()
	require.ErrorIs(t, err, ErrBootstrap)
}

// Over a real namespace testbed with two paths shaped to 100 Mbit/s, the
// ranks' puts go over both and arrive intact; the rate is logged, not
// asserted.
func TestPathsTestbed(t *testing.T) {
	b := testbed.New(t, testbed.Config{Paths: 2, Rates: []string{"100mbit", "100mbit"}})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	open := func(ns string, side func(testbed.Path) netip.Addr) *verbs.Device {
		uri := "udp://"
		for i, p := range b.Paths {
			if i > 0 {
				uri += ","
			}
			uri += netip.AddrPortFrom(side(p), 0).String()
		}
		var d *verbs.Device
		require.NoError(t, b.In(ns, func() (err error) { d, err = verbs.Open(ctx, uri, nil); return }))
		return d
	}
	devs := []*verbs.Device{open(b.NameA, func(p testbed.Path) netip.Addr { return p.A }),
		open(b.NameB, func(p testbed.Path) netip.Addr { return p.B })}
	// The connection managers talk over the root namespace's loopback;
	// the data paths are the devices' sockets, inside the namespaces.
	comms := newWorld(t, 2, &Config{Provider: "udp", Paths: 2, Devices: devs})
	const big = 8 << 20
	data := randBytes(big)
	each(t, comms, func(ctx context.Context, c *Comm) error {
		w, err := c.Allocate(ctx, big, nil)
		if err != nil {
			return err
		}
		if err := w.Fence(ctx, 0); err != nil {
			return err
		}
		if c.Rank() == 0 {
			start := time.Now()
			if err := w.Put(ctx, data, 1, 0); err != nil {
				return err
			}
			if err := w.Flush(ctx, 1); err != nil {
				return err
			}
			el := time.Since(start)
			total, used := pathBytes(c.Paths(1))
			t.Logf("8 MiB put over 2 x 100 Mbit/s: %v, %.0f Mbit/s (paths carried %d bytes on %d)",
				el, float64(big)*8/el.Seconds()/1e6, total, used)
			if used != 2 {
				return fmt.Errorf("%d paths carried the put, want 2", used)
			}
		}
		if err := w.Fence(ctx, ModeNoSucceed); err != nil {
			return err
		}
		if c.Rank() == 1 && !bytes.Equal(w.Bytes(), data) {
			return fmt.Errorf("data differs")
		}
		return w.Free(ctx)
	})
}
