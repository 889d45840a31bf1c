//go:build linux

package verbs_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/internal/shmfab"
	"github.com/rvma/rvma/mailbox"
	"github.com/rvma/rvma/verbs"
	"github.com/rvma/rvma/verbs/cm"
	"github.com/rvma/rvma/verbs/verbstest"
)

// TestMain runs the helper processes of the shm tests (see shmChild).
func TestMain(m *testing.M) {
	if role := os.Getenv("RVMA_VERBS_CHILD"); role != "" {
		if err := shmChild(role); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestSHMDirect checks that on shm a WRITE, READ or atomic is executed by
// the initiator in the target's memory, with the target's engine seeing no
// packet, and that everything the direct path declines still gets the
// right outcome through packets.
func TestSHMDirect(t *testing.T) {
	cmaOK, why := shmfab.CMA()
	t.Logf("cross-memory attach: %v (%s)", cmaOK, why)
	for _, tc := range []struct {
		name    string
		env     verbstest.Env
		direct  bool // WRITE and READ go direct
		atomics bool // atomics go direct
	}{
		{"alloc", verbstest.SHMAlloc(), true, true},
		{"caller", verbstest.SHM(), cmaOK, false},
		{"packets", verbstest.SHMPackets(), false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := verbstest.Pair(t, tc.env, verbstest.PairConfig{})
			// count reports the direct operations and the packets b's
			// engine received during f.
			count := func(f func()) (direct, rx uint64) {
				d0, r0 := a.Dev.Stats().Direct, b.Dev.Stats().RxPackets
				f()
				return a.Dev.Stats().Direct - d0, b.Dev.Stats().RxPackets - r0
			}
			for i := range 1000 {
				a.Buf[i] = byte(i*7 + 1)
			}
			direct, rx := count(func() {
				a.Post(t, verbs.SendWR{ID: 1, Opcode: verbs.OpWrite, Flags: verbs.FlagSignaled,
					SGL: []verbs.SGE{a.MR.SGE(0, 600), a.MR.SGE(600, 400)}, RemoteAddr: b.MR.Addr() + 4096, RKey: b.MR.RKey()})
				wc := a.Wait(t)
				require.Equal(t, verbs.StatusSuccess, wc.Status)
				require.Equal(t, uint32(1000), wc.ByteLen)
			})
			require.Equal(t, a.Buf[:1000], b.Buf[4096:5096])
			if tc.direct {
				require.Equal(t, uint64(1), direct)
				require.Zero(t, rx, "a direct WRITE sends no packet")
			} else {
				require.Zero(t, direct)
				require.NotZero(t, rx)
			}

			copy(b.Buf[8192:], "read me back")
			direct, _ = count(func() {
				a.Post(t, verbs.SendWR{ID: 2, Opcode: verbs.OpRead, Flags: verbs.FlagSignaled,
					SGL: []verbs.SGE{a.MR.SGE(2000, 12)}, RemoteAddr: b.MR.Addr() + 8192, RKey: b.MR.RKey()})
				require.Equal(t, verbs.StatusSuccess, a.Wait(t).Status)
			})
			require.Equal(t, "read me back", string(a.Buf[2000:2012]))
			require.Equal(t, tc.direct, direct == 1)

			binary.NativeEndian.PutUint64(b.Buf[16384:], 40)
			direct, _ = count(func() {
				a.Post(t, verbs.SendWR{ID: 3, Opcode: verbs.OpFetchAdd, Flags: verbs.FlagSignaled, CompareAdd: 2,
					SGL: []verbs.SGE{a.MR.SGE(3000, 8)}, RemoteAddr: b.MR.Addr() + 16384, RKey: b.MR.RKey()})
				require.Equal(t, verbs.StatusSuccess, a.Wait(t).Status)
				a.Post(t, verbs.SendWR{ID: 4, Opcode: verbs.OpCompareSwap, Flags: verbs.FlagSignaled, CompareAdd: 42, Swap: 7,
					SGL: []verbs.SGE{a.MR.SGE(3008, 8)}, RemoteAddr: b.MR.Addr() + 16384, RKey: b.MR.RKey()})
				require.Equal(t, verbs.StatusSuccess, a.Wait(t).Status)
				a.Post(t, verbs.SendWR{ID: 5, Opcode: verbs.OpCompareSwap, Flags: verbs.FlagSignaled, CompareAdd: 42, Swap: 9,
					SGL: []verbs.SGE{a.MR.SGE(3016, 8)}, RemoteAddr: b.MR.Addr() + 16384, RKey: b.MR.RKey()})
				require.Equal(t, verbs.StatusSuccess, a.Wait(t).Status)
			})
			require.Equal(t, uint64(40), binary.LittleEndian.Uint64(a.Buf[3000:]), "fetch-and-add returns the old value")
			require.Equal(t, uint64(42), binary.LittleEndian.Uint64(a.Buf[3008:]), "the swap happened")
			require.Equal(t, uint64(7), binary.LittleEndian.Uint64(a.Buf[3016:]), "the second compare failed")
			require.Equal(t, uint64(7), binary.NativeEndian.Uint64(b.Buf[16384:]))
			require.Equal(t, tc.atomics, direct == 3)

			// WRITE with immediate: the bytes go direct, the notification
			// as a packet, and the receive completion has the length.
			b.PostRecv(t, 10, 0, 0)
			copy(a.Buf[5000:], bytes.Repeat([]byte("imm!"), 500))
			direct, _ = count(func() {
				a.Post(t, verbs.SendWR{ID: 6, Opcode: verbs.OpWriteImm, Flags: verbs.FlagSignaled, Imm: 0xC0FFEE,
					SGL: []verbs.SGE{a.MR.SGE(5000, 2000)}, RemoteAddr: b.MR.Addr() + 20000, RKey: b.MR.RKey()})
				require.Equal(t, verbs.StatusSuccess, a.Wait(t).Status)
			})
			wc := b.Wait(t)
			require.Equal(t, verbs.WorkCompletion{WRID: 10, Opcode: verbs.WCRecvWriteImm, Flags: verbs.WCWithImm, Imm: 0xC0FFEE,
				ByteLen: 2000, QPN: b.QP.Num(), SrcQP: a.QP.Num()}, wc)
			require.Equal(t, a.Buf[5000:7000], b.Buf[20000:22000])
			require.Equal(t, tc.direct, direct == 1)
		})
	}
}

// TestSHMDirectErrors: what the direct path cannot check it declines, and
// the packets then fail as they would anywhere.
func TestSHMDirectErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		wr   func(a, b *verbstest.Side) verbs.SendWR
		want verbs.Status
	}{
		{"wrong key", func(a, b *verbstest.Side) verbs.SendWR {
			return verbs.SendWR{Opcode: verbs.OpWrite, SGL: []verbs.SGE{a.MR.SGE(0, 8)}, RemoteAddr: b.MR.Addr(), RKey: b.MR.RKey() + 1}
		}, verbs.StatusRemoteAccessError},
		{"past the end", func(a, b *verbstest.Side) verbs.SendWR {
			return verbs.SendWR{Opcode: verbs.OpWrite, SGL: []verbs.SGE{a.MR.SGE(0, 16)}, RemoteAddr: b.MR.Addr() + uint64(b.MR.Len()) - 8, RKey: b.MR.RKey()}
		}, verbs.StatusRemoteAccessError},
		{"before the start", func(a, b *verbstest.Side) verbs.SendWR {
			return verbs.SendWR{Opcode: verbs.OpRead, SGL: []verbs.SGE{a.MR.SGE(0, 16)}, RemoteAddr: b.MR.Addr() - 8, RKey: b.MR.RKey()}
		}, verbs.StatusRemoteAccessError},
		{"atomic without the right", func(a, b *verbstest.Side) verbs.SendWR {
			return verbs.SendWR{Opcode: verbs.OpFetchAdd, SGL: []verbs.SGE{a.MR.SGE(0, 8)}, RemoteAddr: b.MR.Addr() + 8, RKey: b.MR.RKey(), CompareAdd: 1}
		}, verbs.StatusRemoteAccessError},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := verbstest.Pair(t, verbstest.SHMAlloc(), verbstest.PairConfig{
				Access: verbs.AccessLocalWrite | verbs.AccessRemoteWrite | verbs.AccessRemoteRead})
			wr := tc.wr(a, b)
			wr.Flags = verbs.FlagSignaled
			before := append([]byte(nil), b.Buf...)
			a.Post(t, wr)
			require.Equal(t, tc.want, a.Wait(t).Status)
			require.Equal(t, before, b.Buf, "nothing was written")
			require.Zero(t, a.Dev.Stats().Direct)
		})
	}

	t.Run("deregistered", func(t *testing.T) {
		a, b := verbstest.Pair(t, verbstest.SHMAlloc(), verbstest.PairConfig{})
		mr, err := b.PD.AllocMR(4096, verbs.AccessAll)
		require.NoError(t, err)
		write := func() verbs.Status {
			a.Post(t, verbs.SendWR{Opcode: verbs.OpWrite, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{a.MR.SGE(0, 64)},
				RemoteAddr: mr.Addr(), RKey: mr.RKey()})
			return a.Wait(t).Status
		}
		require.Equal(t, verbs.StatusSuccess, write())
		require.Equal(t, uint64(1), a.Dev.Stats().Direct)
		require.NoError(t, mr.Deregister())
		require.Equal(t, verbs.StatusRemoteAccessError, write(), "a withdrawn region is not reached")
	})

	t.Run("other protection domain", func(t *testing.T) {
		a, b := verbstest.Pair(t, verbstest.SHMAlloc(), verbstest.PairConfig{})
		pd, err := b.Dev.AllocPD()
		require.NoError(t, err)
		mr, err := pd.AllocMR(4096, verbs.AccessAll)
		require.NoError(t, err)
		a.Post(t, verbs.SendWR{Opcode: verbs.OpWrite, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{a.MR.SGE(0, 64)},
			RemoteAddr: mr.Addr(), RKey: mr.RKey()})
		require.Equal(t, verbs.StatusRemoteAccessError, a.Wait(t).Status, "a key opens memory only to QPs of its PD")
		require.Zero(t, a.Dev.Stats().Direct)
	})

	t.Run("remote QP in error", func(t *testing.T) {
		a, b := verbstest.Pair(t, verbstest.SHMAlloc(), verbstest.PairConfig{
			Connect: verbs.ConnectConfig{Timeout: time.Millisecond, RetryCount: 2}})
		require.NoError(t, b.QP.SetError())
		a.Post(t, verbs.SendWR{Opcode: verbs.OpWrite, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{a.MR.SGE(0, 64)},
			RemoteAddr: b.MR.Addr(), RKey: b.MR.RKey()})
		require.Equal(t, verbs.StatusRetryExceeded, a.Wait(t).Status, "no direct write on behalf of a QP that stopped")
		require.Zero(t, a.Dev.Stats().Direct)
	})
}

// pullHandler places mailbox writes into one buffer and records how each
// arrived.
type pullHandler struct {
	mu     sync.Mutex
	buf    []byte
	calls  int
	pulled int // writes whose payload was not in the packet
}

func (h *pullHandler) HandleMailboxWrite(w *verbs.MailboxWrite) verbs.MailboxResult {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.calls++
	if w.Payload == nil && w.Len() > 0 {
		h.pulled++
	}
	o := int(w.Offset) + int(w.MsgOff)
	if o+w.Len() > len(h.buf) || w.Place(h.buf[o:o+w.Len()]) != nil {
		return verbs.MailboxRefused
	}
	return verbs.MailboxAccepted
}

// TestSHMMailboxPull: a large mailbox write's payload is copied once, by
// the target, straight from the initiator's memory.
func TestSHMMailboxPull(t *testing.T) {
	if ok, why := shmfab.CMA(); !ok {
		t.Skip("cross-memory attach unavailable: " + why)
	}
	for _, tc := range []struct {
		name   string
		env    verbstest.Env
		size   int
		pulled int
	}{
		{"large", verbstest.SHM(), 200 << 10, 1},
		{"small", verbstest.SHM(), 1000, 0},
		{"no cross-memory attach", verbstest.SHMPackets(), 200 << 10, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := verbstest.Pair(t, tc.env, verbstest.PairConfig{BufSize: 256 << 10})
			h := &pullHandler{buf: make([]byte, 512<<10)}
			b.Dev.SetMailboxHandler(h)
			for i := range tc.size {
				a.Buf[i] = byte(i*13 + 5)
			}
			a.Post(t, verbs.SendWR{Opcode: verbs.OpMailboxWrite, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{a.MR.SGE(0, tc.size)},
				Mailbox: 0xB0B, MailboxOffset: 4096})
			require.Equal(t, verbs.StatusSuccess, a.Wait(t).Status)
			require.Equal(t, a.Buf[:tc.size], h.buf[4096:4096+tc.size])
			require.Equal(t, tc.pulled, h.pulled)
			if tc.pulled == 1 {
				require.Equal(t, 1, h.calls, "one packet for the whole write")
				require.Equal(t, uint64(1), b.Dev.Stats().Direct)
			} else {
				require.Zero(t, b.Dev.Stats().Direct)
			}
		})
	}
}

// Helper processes. The parent listens with package cm and passes what
// the child needs in the environment; the child connects one RC QP and
// reports errors on stderr.
//
//	atomics: RVMA_N fetch-and-adds of 1 on the parent's word
//	  (RVMA_ADDR, RVMA_RKEY), then RVMA_N compare-and-swap increments.
//	mailbox: RVMA_N puts of RVMA_SIZE bytes (byte value RVMA_ID) into
//	  mailbox RVMA_BOX at offset (RVMA_ID*RVMA_N + i) * RVMA_SIZE.
//	target: registers 1 MiB of shared memory, sends its address and key
//	  as private data, then sleeps until killed.
func shmChild(role string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	env := func(k string) uint64 { v, _ := strconv.ParseUint(os.Getenv(k), 0, 64); return v }
	dev, err := verbs.Open(ctx, "shm://"+os.Getenv("RVMA_FABRIC"), nil)
	if err != nil {
		return err
	}
	defer dev.Close()
	pd, _ := dev.AllocPD()
	cq, _ := dev.CreateCQ(verbs.CQConfig{})
	qp, err := pd.CreateQP(verbs.QPConfig{SendCQ: cq, SignalAll: true})
	if err != nil {
		return err
	}
	mr, err := pd.AllocMR(1<<20, verbs.AccessAll)
	if err != nil {
		return err
	}
	var private []byte
	if role == "target" {
		private = binary.LittleEndian.AppendUint64(nil, mr.Addr())
		private = binary.LittleEndian.AppendUint32(private, mr.RKey())
	}
	if _, err := cm.Dial(ctx, os.Getenv("RVMA_CM"), qp, &cm.Config{PrivateData: private}); err != nil {
		return err
	}
	wait := func() (verbs.WorkCompletion, error) {
		wcs := make([]verbs.WorkCompletion, 1)
		for {
			if n, err := cq.Poll(wcs); err != nil || n == 1 {
				if err == nil {
					err = wcs[0].Err()
				}
				return wcs[0], err
			}
			if err := cq.Wait(ctx); err != nil {
				return verbs.WorkCompletion{}, err
			}
		}
	}
	n := int(env("RVMA_N"))
	switch role {
	case "atomics":
		addr, rkey := env("RVMA_ADDR"), uint32(env("RVMA_RKEY"))
		for range n {
			if _, err := qp.PostSend([]verbs.SendWR{{Opcode: verbs.OpFetchAdd, CompareAdd: 1, SGL: []verbs.SGE{mr.SGE(0, 8)}, RemoteAddr: addr, RKey: rkey}}); err != nil {
				return err
			}
			if _, err := wait(); err != nil {
				return err
			}
		}
		old := binary.LittleEndian.Uint64(mr.Bytes())
		for done := 0; done < n; {
			if _, err := qp.PostSend([]verbs.SendWR{{Opcode: verbs.OpCompareSwap, CompareAdd: old, Swap: old + 1,
				SGL: []verbs.SGE{mr.SGE(0, 8)}, RemoteAddr: addr, RKey: rkey}}); err != nil {
				return err
			}
			if _, err := wait(); err != nil {
				return err
			}
			got := binary.LittleEndian.Uint64(mr.Bytes())
			if got == old {
				done++
				old++
			} else {
				old = got
			}
		}
	case "mailbox":
		if os.Getenv("RVMA_FAULTS") != "" {
			if err := dev.SetFaults(-1, verbs.Faults{Duplicate: 0.2, Seed: 3}); err != nil {
				return err
			}
		}
		size, id := int(env("RVMA_SIZE")), int(env("RVMA_ID"))
		for i := range size {
			mr.Bytes()[i] = byte(id + 1)
		}
		for i := range n {
			if _, err := qp.PostSend([]verbs.SendWR{{Opcode: verbs.OpMailboxWrite, SGL: []verbs.SGE{mr.SGE(0, size)},
				Mailbox: env("RVMA_BOX"), MailboxOffset: uint64((id*n + i) * size)}}); err != nil {
				return err
			}
			if _, err := wait(); err != nil {
				return err
			}
		}
	case "target":
		<-ctx.Done()
	}
	return nil
}

// children are helper processes, each connected to one of the parent's
// QPs (on pd, completing on cq), with the private data each sent.
type children struct {
	cmds    []*exec.Cmd
	qps     []*verbs.QP
	private [][]byte
	pd      *verbs.PD
	cq      *verbs.CQ
}

// startChildren starts n helper processes of role, connected to QPs the
// parent makes in pd.
func startChildren(t *testing.T, pd *verbs.PD, fabric, role string, n int, env func(i int) []string) *children {
	ctx := context.Background()
	ln, err := cm.Listen(ctx, "127.0.0.1:0", nil)
	require.NoError(t, err)
	defer ln.Close()
	ch := &children{pd: pd}
	dev := pd.Device()
	ch.cq, err = dev.CreateCQ(verbs.CQConfig{})
	require.NoError(t, err)
	for i := range n {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "RVMA_VERBS_CHILD="+role, "RVMA_FABRIC="+fabric, "RVMA_CM="+ln.Addr().String(),
			"RVMA_ID="+strconv.Itoa(i))
		cmd.Env = append(cmd.Env, env(i)...)
		cmd.Stderr = os.Stderr
		require.NoError(t, cmd.Start())
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		ch.cmds = append(ch.cmds, cmd)
	}
	for range n {
		actx, cancel := context.WithTimeout(ctx, 30*time.Second)
		req, err := ln.Accept(actx)
		require.NoError(t, err)
		qp, err := ch.pd.CreateQP(verbs.QPConfig{SendCQ: ch.cq, SignalAll: true})
		require.NoError(t, err)
		require.NoError(t, req.Accept(actx, qp, &cm.Config{Connect: &verbs.ConnectConfig{Timeout: 5 * time.Millisecond, RetryCount: 3}}))
		cancel()
		ch.qps = append(ch.qps, qp)
		ch.private = append(ch.private, req.PrivateData())
	}
	return ch
}

func shmFabric(t *testing.T) (string, *verbs.Device) {
	fabric := fmt.Sprintf("verbs-shm-%d-%s", os.Getpid(), t.Name())
	dev, err := verbs.Open(context.Background(), "shm://"+fabric, nil)
	require.NoError(t, err)
	t.Cleanup(func() { dev.Close() })
	return fabric, dev
}

// TestSHMAtomicsProcesses: fetch-and-adds and compare-and-swaps from
// several processes, with the owner adding with sync/atomic at the same
// time, end exactly at the sum: on shared memory they are the same CPU
// instructions; on ordinary memory the owner's engine executes them with
// those instructions too.
func TestSHMAtomicsProcesses(t *testing.T) {
	for _, alloc := range []bool{true, false} {
		t.Run(fmt.Sprintf("alloc=%v", alloc), func(t *testing.T) {
			fabric, dev := shmFabric(t)
			pd, err := dev.AllocPD()
			require.NoError(t, err)
			var mr *verbs.MR
			if alloc {
				mr, err = pd.AllocMR(64, verbs.AccessAll)
			} else {
				w := make([]uint64, 8)
				mr, err = pd.RegisterMR(unsafe.Slice((*byte)(unsafe.Pointer(&w[0])), 64), verbs.AccessAll)
			}
			require.NoError(t, err)
			word := (*uint64)(unsafe.Pointer(&mr.Bytes()[0]))
			const children, n, local = 3, 300, 1000
			rx0 := dev.Stats().RxPackets
			ch := startChildren(t, pd, fabric, "atomics", children, func(int) []string {
				return []string{"RVMA_N=" + strconv.Itoa(n), "RVMA_ADDR=" + strconv.FormatUint(mr.Addr(), 10), "RVMA_RKEY=" + strconv.FormatUint(uint64(mr.RKey()), 10)}
			})
			for range local {
				atomic.AddUint64(word, 1)
				time.Sleep(10 * time.Microsecond)
			}
			for _, c := range ch.cmds {
				require.NoError(t, c.Wait())
			}
			require.Equal(t, uint64(children*2*n+local), atomic.LoadUint64(word))
			if rx := dev.Stats().RxPackets - rx0; alloc {
				require.Less(t, rx, uint64(children*n), "shared memory: the atomics sent no packets")
			} else {
				require.GreaterOrEqual(t, rx, uint64(children*2*n), "ordinary memory: this engine executed them")
			}
		})
	}
}

// TestSHMMailboxProcesses: several processes put into one mailbox at
// once; the epoch completes exactly when all their bytes are in, with
// every byte where it belongs. With the window's buffer in ordinary memory
// the target pulls every payload; in device memory the children place
// and count their puts themselves, while one child, whose port injects
// faults (duplicates), still sends packets: both count into one epoch.
func TestSHMMailboxProcesses(t *testing.T) {
	for _, shared := range []bool{false, true} {
		t.Run(fmt.Sprintf("shared=%v", shared), func(t *testing.T) {
			fabric, dev := shmFabric(t)
			const children, n, size = 3, 4, 64 << 10
			total := children * n * size
			tgt := mailbox.NewTarget(dev, nil)
			win, err := tgt.Init(0xB0B, mailbox.Config{Threshold: total, History: 2})
			require.NoError(t, err)
			pd, err := dev.AllocPD()
			require.NoError(t, err)
			buf := make([]byte, total)
			if shared {
				mr, err := pd.AllocMR(total, verbs.AccessLocalWrite)
				require.NoError(t, err)
				buf = mr.Bytes()
			}
			_, err = win.Post(buf)
			require.NoError(t, err)
			_, err = win.Post(make([]byte, total))
			require.NoError(t, err)
			rx0 := dev.Stats().RxPackets
			ch := startChildren(t, pd, fabric, "mailbox", children, func(i int) []string {
				env := []string{"RVMA_N=" + strconv.Itoa(n), "RVMA_SIZE=" + strconv.Itoa(size), "RVMA_BOX=" + strconv.Itoa(0xB0B)}
				if shared && i == 0 {
					env = append(env, "RVMA_FAULTS=1")
				}
				return env
			})
			for _, c := range ch.cmds {
				require.NoError(t, c.Wait())
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			rec, err := win.Wait(ctx)
			require.NoError(t, err)
			require.Equal(t, total, rec.Bytes)
			require.Equal(t, children*n, rec.Ops)
			for c := range children {
				want := bytes.Repeat([]byte{byte(c + 1)}, n*size)
				require.True(t, bytes.Equal(want, rec.Data[c*n*size:(c+1)*n*size]), "child %d's bytes", c)
			}
			require.Equal(t, uint64(0), win.Epoch()-1, "exactly one epoch completed")
			rx := dev.Stats().RxPackets - rx0
			switch ok, _ := shmfab.CMA(); {
			case shared:
				// Child 0's puts and everyone's connection set-up only.
				require.Less(t, rx, uint64(children*n*size/(64<<10)*2+100), "the others placed their puts themselves")
				require.GreaterOrEqual(t, rx, uint64(n))
			case ok:
				require.Equal(t, uint64(children*n), dev.Stats().Direct, "every payload pulled, once")
			}
		})
	}
}

// TestSHMDirectPeerKilled: a process writing directly into a peer that is
// killed -9 sees its QP fail within the retry budget, as over packets,
// not writes into memory nobody reads.
func TestSHMDirectPeerKilled(t *testing.T) {
	fabric, dev := shmFabric(t)
	pd, err := dev.AllocPD()
	require.NoError(t, err)
	ch := startChildren(t, pd, fabric, "target", 1, func(int) []string { return nil })
	addr, rkey := binary.LittleEndian.Uint64(ch.private[0]), binary.LittleEndian.Uint32(ch.private[0][8:])
	src, err := pd.AllocMR(4096, verbs.AccessLocalWrite)
	require.NoError(t, err)
	qp := ch.qps[0]
	post := func() verbs.WorkCompletion {
		_, err := qp.PostSend([]verbs.SendWR{{Opcode: verbs.OpWrite, SGL: []verbs.SGE{src.SGE(0, 64)}, RemoteAddr: addr, RKey: rkey}})
		require.NoError(t, err)
		wcs := make([]verbs.WorkCompletion, 1)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for {
			n, err := ch.cq.Poll(wcs)
			require.NoError(t, err)
			if n == 1 {
				return wcs[0]
			}
			require.NoError(t, ch.cq.Wait(ctx))
		}
	}
	require.Equal(t, verbs.StatusSuccess, post().Status)
	require.NotZero(t, dev.Stats().Direct, "the write went direct")
	require.NoError(t, ch.cmds[0].Process.Kill())
	ch.cmds[0].Wait()
	start := time.Now()
	var wc verbs.WorkCompletion
	for wc = post(); wc.Status == verbs.StatusSuccess; wc = post() {
		require.Less(t, time.Since(start), 5*time.Second, "writes to a dead peer kept succeeding")
	}
	require.Equal(t, verbs.StatusRetryExceeded, wc.Status)
}

// TestCompositeDevice: one device over udp and shm ports; each QP reaches
// peers of its GID's provider, with one PD's memory serving both.
func TestCompositeDevice(t *testing.T) {
	ctx := context.Background()
	name := fmt.Sprintf("composite-%d", os.Getpid())
	dev, err := verbs.Open(ctx, "udp://127.0.0.1:0+shm://"+name, nil)
	require.NoError(t, err)
	defer dev.Close()
	require.Len(t, dev.GIDs(), 2)
	require.Equal(t, verbs.ProviderUDP, dev.Provider(0))
	require.Equal(t, verbs.ProviderSHM, dev.Provider(1))
	require.Equal(t, verbs.Provider(""), dev.Provider(2))

	_, err = verbs.Open(ctx, "shm://"+name+"+bogus://x", nil)
	require.ErrorIs(t, err, verbs.ErrUnknownProvider)

	pd, err := dev.AllocPD()
	require.NoError(t, err)
	cq, err := dev.CreateCQ(verbs.CQConfig{})
	require.NoError(t, err)
	mr, err := pd.AllocMR(4096, verbs.AccessAll)
	require.NoError(t, err)
	for i, peerURI := range []string{"udp://127.0.0.1:0", "shm://" + name} {
		peer, err := verbs.Open(ctx, peerURI, nil)
		require.NoError(t, err)
		defer peer.Close()
		ppd, _ := peer.AllocPD()
		pcq, _ := peer.CreateCQ(verbs.CQConfig{})
		pqp, err := ppd.CreateQP(verbs.QPConfig{SendCQ: pcq})
		require.NoError(t, err)
		pmr, err := ppd.AllocMR(4096, verbs.AccessAll)
		require.NoError(t, err)
		qp, err := pd.CreateQP(verbs.QPConfig{SendCQ: cq, GID: i})
		require.NoError(t, err)
		require.NoError(t, qp.Connect(pqp.Endpoint(), nil))
		require.NoError(t, pqp.Connect(qp.Endpoint(), nil))
		copy(mr.Bytes(), fmt.Sprintf("over %s", dev.Provider(i)))
		_, err = qp.PostSend([]verbs.SendWR{{Opcode: verbs.OpWrite, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{mr.SGE(0, 8)},
			RemoteAddr: pmr.Addr(), RKey: pmr.RKey()}})
		require.NoError(t, err)
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		wcs := make([]verbs.WorkCompletion, 1)
		for {
			n, err := cq.Poll(wcs)
			require.NoError(t, err)
			if n == 1 {
				break
			}
			require.NoError(t, cq.Wait(wctx))
		}
		cancel()
		require.Equal(t, verbs.StatusSuccess, wcs[0].Status)
		require.Equal(t, mr.Bytes()[:8], pmr.Bytes()[:8], "via %s", peerURI)
	}
}

// BenchmarkSHMDirectWrite is one 4 MiB WRITE into a peer's device memory
// on shm, both devices in this process: the one copy the initiator makes.
func BenchmarkSHMDirectWrite(b *testing.B) {
	const size = 4 << 20
	a, t := verbstest.Pair(b, verbstest.SHMAlloc(), verbstest.PairConfig{BufSize: 2 * size})
	wr := []verbs.SendWR{{Opcode: verbs.OpWrite, SGL: []verbs.SGE{a.MR.SGE(0, size)}, RemoteAddr: t.MR.Addr() + size, RKey: t.MR.RKey()}}
	d0 := a.Dev.Stats().Direct
	b.SetBytes(size)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := a.QP.PostSend(wr); err != nil {
			b.Fatal(err)
		}
	}
	if a.Dev.Stats().Direct == d0 {
		b.Fatal("the writes did not go direct")
	}
}

// An unordered WRITE is executed at once on shared memory even behind a
// request still in flight, and the flag is refused on anything but a
// WRITE.
func TestUnorderedWrite(t *testing.T) {
	a, b := verbstest.Pair(t, verbstest.SHMAlloc(), verbstest.PairConfig{})
	// A SEND with no receive posted stays pending (receiver not ready).
	a.Post(t, verbs.SendWR{ID: 1, Opcode: verbs.OpSend, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{a.MR.SGE(0, 64)}})
	d0 := a.Dev.Stats().Direct
	binary.LittleEndian.PutUint64(a.Buf[100:], 77)
	binary.LittleEndian.PutUint64(a.Buf[108:], 88)
	a.Post(t, verbs.SendWR{ID: 2, Opcode: verbs.OpWrite, Flags: verbs.FlagSignaled | verbs.FlagUnordered,
		SGL: []verbs.SGE{a.MR.SGE(100, 8)}, RemoteAddr: b.MR.Addr() + 256, RKey: b.MR.RKey()})
	require.Equal(t, d0+1, a.Dev.Stats().Direct, "the unordered WRITE went direct behind the SEND")
	require.Equal(t, uint64(77), binary.LittleEndian.Uint64(b.Buf[256:]), "placed before PostSend returned")
	a.Post(t, verbs.SendWR{ID: 3, Opcode: verbs.OpWrite, Flags: verbs.FlagSignaled,
		SGL: []verbs.SGE{a.MR.SGE(108, 8)}, RemoteAddr: b.MR.Addr() + 264, RKey: b.MR.RKey()})
	require.Equal(t, d0+1, a.Dev.Stats().Direct, "an ordinary WRITE waits behind the SEND")
	b.PostRecv(t, 1, 0, 64)
	for id := range uint64(3) {
		wc := a.Wait(t)
		require.Equal(t, verbs.StatusSuccess, wc.Status)
		require.Equal(t, id+1, wc.WRID, "completions stay in order")
	}
	b.Wait(t)
	require.Equal(t, uint64(88), binary.LittleEndian.Uint64(b.Buf[264:]))

	_, err := a.QP.PostSend([]verbs.SendWR{{ID: 4, Opcode: verbs.OpRead, Flags: verbs.FlagUnordered,
		SGL: []verbs.SGE{a.MR.SGE(0, 8)}, RemoteAddr: b.MR.Addr(), RKey: b.MR.RKey()}})
	require.ErrorIs(t, err, verbs.ErrInvalidWR)
}

// QP.Map hands out the peer's AllocMR memory after the checks a direct
// access makes; stores through it land in the peer's region. Faults make
// it unusable; other memory, keys, ranges and rights are refused.
func TestMap(t *testing.T) {
	a, b := verbstest.Pair(t, verbstest.SHMAlloc(), verbstest.PairConfig{})
	m, err := a.QP.Map(b.MR.RKey(), b.MR.Addr()+16, 64, verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
	require.NoError(t, err)
	require.Len(t, m.Bytes(), 64)
	copy(m.Bytes(), "through the mapping")
	require.Equal(t, "through the mapping", string(b.Buf[16:16+19]))
	require.True(t, m.Usable())
	require.False(t, m.PeerGone())

	ro, err := b.PD.AllocMR(4096, verbs.AccessRemoteRead)
	require.NoError(t, err)
	for _, c := range []struct {
		name   string
		rkey   uint32
		addr   uint64
		n      int
		access verbs.Access
	}{
		{"wrong key", b.MR.RKey() ^ 0x55, b.MR.Addr(), 8, verbs.AccessRemoteWrite},
		{"past the end", b.MR.RKey(), b.MR.Addr() + uint64(b.MR.Len()) - 4, 8, verbs.AccessRemoteWrite},
		{"before the start", b.MR.RKey(), b.MR.Addr() - 8, 8, verbs.AccessRemoteWrite},
		{"no bytes", b.MR.RKey(), b.MR.Addr(), 0, verbs.AccessRemoteWrite},
		{"no rights asked", b.MR.RKey(), b.MR.Addr(), 8, 0},
		{"write into read-only", ro.RKey(), ro.Addr(), 8, verbs.AccessRemoteWrite},
	} {
		_, err := a.QP.Map(c.rkey, c.addr, c.n, c.access)
		require.ErrorIs(t, err, verbs.ErrUnsupported, c.name)
	}
	_, err = a.QP.Map(ro.RKey(), ro.Addr(), 8, verbs.AccessRemoteRead)
	require.NoError(t, err, "read from read-only")

	require.NoError(t, a.Dev.SetFaults(-1, verbs.Faults{Drop: 0.1, Seed: 1}))
	require.False(t, m.Usable(), "faults would be bypassed")
	require.NoError(t, a.Dev.SetFaults(-1, verbs.Faults{}))
	require.True(t, m.Usable())

	// Memory that is not from AllocMR, and providers without shared
	// memory, are reached by work requests only.
	c, d := verbstest.Pair(t, verbstest.SHM(), verbstest.PairConfig{})
	_, err = c.QP.Map(d.MR.RKey(), d.MR.Addr(), 8, verbs.AccessRemoteWrite)
	require.ErrorIs(t, err, verbs.ErrUnsupported)
	e, f := verbstest.Pair(t, verbstest.Loop(), verbstest.PairConfig{})
	_, err = e.QP.Map(f.MR.RKey(), f.MR.Addr(), 8, verbs.AccessRemoteWrite)
	require.ErrorIs(t, err, verbs.ErrUnsupported)
}
