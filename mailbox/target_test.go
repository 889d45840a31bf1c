package mailbox

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/verbs"
)

// pkt is one packet of a put from peer qpn, as the verbs receive path hands
// it to the target.
func pkt(qpn uint32, off uint64, msgOff, msgLen int, first, last bool, payload string) *verbs.MailboxWrite {
	return &verbs.MailboxWrite{Mailbox: 1, Offset: off, MsgOff: uint32(msgOff), MsgLen: uint32(msgLen), First: first, Last: last,
		Payload: []byte(payload), SrcQP: qpn, Source: netip.MustParseAddrPort("[fd00::1]:1")}
}

// TestPlacementStateMachine drives the target packet by packet.
func TestPlacementStateMachine(t *testing.T) {
	newT := func(cfg Config) (*Target, *Window, []byte, []byte) {
		tg := &Target{windows: map[uint64]*Window{}, outstanding: map[peer]int{}}
		w, err := tg.Init(1, cfg)
		require.NoError(t, err)
		b1, b2 := make([]byte, 16), make([]byte, 16)
		w.Post(b1)
		w.Post(b2)
		return tg, w, b1, b2
	}
	t.Run("interleaved puts from two peers", func(t *testing.T) {
		tg, w, b1, _ := newT(Config{Threshold: 8})
		require.Equal(t, verbs.MailboxAccepted, tg.HandleMailboxWrite(pkt(1, 0, 0, 4, true, false, "ab")))
		require.Equal(t, verbs.MailboxAccepted, tg.HandleMailboxWrite(pkt(2, 4, 0, 4, true, false, "AB")))
		require.Equal(t, verbs.MailboxAccepted, tg.HandleMailboxWrite(pkt(2, 4, 2, 4, false, true, "CD")))
		_, ok := w.Poll()
		require.False(t, ok)
		require.Equal(t, verbs.MailboxAccepted, tg.HandleMailboxWrite(pkt(1, 0, 2, 4, false, true, "cd")))
		r, ok := w.Poll()
		require.True(t, ok)
		require.Equal(t, 8, r.Bytes)
		require.Equal(t, "abcdABCD", string(b1[:8]))
	})
	t.Run("threshold met while a put is half placed", func(t *testing.T) {
		tg, w, b1, b2 := newT(Config{Threshold: 4})
		require.Equal(t, verbs.MailboxAccepted, tg.HandleMailboxWrite(pkt(1, 0, 0, 6, true, false, "xxxx")))
		// The count is met, but peer 1's put is open: a new put goes to
		// the next buffer and the epoch waits.
		require.Equal(t, verbs.MailboxAccepted, tg.HandleMailboxWrite(pkt(2, 0, 0, 2, true, true, "NN")))
		_, ok := w.Poll()
		require.False(t, ok)
		require.Equal(t, "NN", string(b2[:2]))
		require.Equal(t, verbs.MailboxAccepted, tg.HandleMailboxWrite(pkt(1, 0, 4, 6, false, true, "yy")))
		r, ok := w.Poll()
		require.True(t, ok)
		require.Equal(t, 6, r.Bytes)
		require.Equal(t, "xxxxyy", string(b1[:6]))
	})
	t.Run("hand-off cuts a put short", func(t *testing.T) {
		tg, w, _, _ := newT(Config{Threshold: 100})
		require.Equal(t, verbs.MailboxAccepted, tg.HandleMailboxWrite(pkt(1, 0, 0, 6, true, false, "xxxx")))
		_, err := w.IncEpoch()
		require.NoError(t, err)
		require.Equal(t, codeEpochCrossed, tg.HandleMailboxWrite(pkt(1, 0, 4, 6, false, true, "yy")))
	})
	t.Run("abandon refuses the rest and zeroes what landed", func(t *testing.T) {
		tg, w, b1, _ := newT(Config{Threshold: 100})
		require.Equal(t, verbs.MailboxAccepted, tg.HandleMailboxWrite(pkt(1, 2, 0, 6, true, false, "xxxx")))
		require.NoError(t, w.Abandon())
		require.Equal(t, make([]byte, 16), b1)
		require.Equal(t, codeEpochCrossed, tg.HandleMailboxWrite(pkt(1, 2, 4, 6, false, true, "yy")))
	})
	t.Run("a continuation without a start", func(t *testing.T) {
		tg, _, _, _ := newT(Config{Threshold: 100})
		require.Equal(t, codeEpochCrossed, tg.HandleMailboxWrite(pkt(9, 0, 4, 6, false, true, "yy")))
	})
	t.Run("no buffer free: not ready", func(t *testing.T) {
		tg, _, _, _ := newT(Config{Threshold: 2, Count: CountOps})
		for i := 0; i < 4; i++ {
			require.Equal(t, verbs.MailboxAccepted, tg.HandleMailboxWrite(pkt(1, 0, 0, 1, true, true, "z")))
		}
		require.Equal(t, verbs.MailboxNotReady, tg.HandleMailboxWrite(pkt(1, 0, 0, 1, true, true, "z")))
	})
}
