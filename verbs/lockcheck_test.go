//go:build rvmadebug

package verbs

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/internal/wire"
)

// recovered runs f and returns what it panicked with, as a string ("" if
// it did not panic).
func recovered(f func()) (msg string) {
	defer func() {
		if r := recover(); r != nil {
			msg = fmt.Sprint(r)
		}
	}()
	f()
	return ""
}

type countingHandler struct{ calls atomic.Int32 }

func (h *countingHandler) HandleMailboxWrite(*MailboxWrite) MailboxResult {
	h.calls.Add(1)
	return MailboxAccepted
}

// lockPair is two connected RC QPs on one loop device: the inline
// delivery between them is what the re-entrancy rule protects.
func lockPair(t *testing.T) (a, b *QP, d *Device) {
	d, err := Open(context.Background(), "loop://"+t.Name(), nil)
	require.NoError(t, err)
	t.Cleanup(func() { d.Close() })
	pd, err := d.AllocPD()
	require.NoError(t, err)
	cq, err := d.CreateCQ(CQConfig{})
	require.NoError(t, err)
	a, err = pd.CreateQP(QPConfig{SendCQ: cq})
	require.NoError(t, err)
	b, err = pd.CreateQP(QPConfig{SendCQ: cq})
	require.NoError(t, err)
	require.NoError(t, a.Connect(b.Endpoint(), nil))
	require.NoError(t, b.Connect(a.Endpoint(), nil))
	return a, b, d
}

// TestReentrancyRuleEnforced breaks the rule "nothing calls Port.Send or a
// MailboxHandler while holding a QP's mu" on purpose, and checks that the
// debug build panics, naming the rule, before the send or the call
// happens.
func TestReentrancyRuleEnforced(t *testing.T) {
	a, b, d := lockPair(t)
	h := &countingHandler{}
	d.SetMailboxHandler(h)

	t.Run("send", func(t *testing.T) {
		rx := d.stats.rxPackets.Load()
		ob := &outbox{}
		a.mu.Lock()
		ob.pkts = append(ob.pkts, a.newPacket(wire.Acknowledge, a.req.unacked))
		msg := recovered(func() { ob.flush(a.port) }) // as if a QP flushed its outbox under its lock
		a.mu.Unlock()
		require.Contains(t, msg, "Port.Send")
		require.Contains(t, msg, "holds a verbs QP's mu")
		require.Equal(t, rx, d.stats.rxPackets.Load(), "the packet was sent")
		for _, p := range ob.pkts {
			p.Release()
		}
	})

	t.Run("send under another QP's lock", func(t *testing.T) {
		// Any QP's: a send from a reaches b's handler inline.
		ob := &outbox{}
		b.mu.Lock()
		msg := recovered(func() { ob.flush(a.port) })
		b.mu.Unlock()
		require.Contains(t, msg, "holds a verbs QP's mu")
	})

	t.Run("mailbox handler", func(t *testing.T) {
		// mailboxExec releases b's own lock around the handler; a lock of
		// another QP still held there breaks the rule.
		a.mu.Lock()
		b.mu.Lock()
		p := &wire.Packet{Opcode: wire.MailboxOnly, Payload: []byte("x"), MsgLen: 1, Src: b.remote.GID}
		msg := recovered(func() { b.mailboxExec(p, &outbox{}, true, true, false) })
		a.mu.Unlock()
		require.Contains(t, msg, "MailboxHandler")
		require.Zero(t, h.calls.Load(), "the handler was called")
	})

	t.Run("relock", func(t *testing.T) {
		// A QP method called with its own lock held: a deadlock in a
		// normal build, a panic here.
		a.mu.Lock()
		msg := recovered(func() { a.State() })
		a.mu.Unlock()
		require.Contains(t, msg, "which it holds already")
	})

	t.Run("locked helper", func(t *testing.T) {
		msg := recovered(func() { a.toErrorLocked() })
		require.Contains(t, msg, "does not hold a verbs QP's mu")
	})

	// Kept, the rule lets the QPs work.
	require.Equal(t, StateReadyToSend, a.State())
	require.Equal(t, StateReadyToSend, b.State())
}
