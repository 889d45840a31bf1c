//go:build rvmadebug

package rma

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/internal/testutil"
)

// TestLockRulesEnforced breaks the package's documented lock rules on
// purpose: the debug build panics, naming the rule, where a normal build
// would deadlock or race.
func TestLockRulesEnforced(t *testing.T) {
	c := newWorld(t, 1, nil)[0]
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// A per-origin notified window that expects this rank: it has a
	// txState towards it.
	w, err := c.Allocate(ctx, 64, &WinConfig{Notify: &NotifyConfig{ExpectFrom: map[int]int{0: 8}}})
	require.NoError(t, err)
	tx := &w.tx[0]

	// Lock takes w.mu: a call from a goroutine holding it would deadlock.
	w.mu.Lock()
	msg := testutil.Recovered(func() { w.Lock(ctx, LockShared, 0) })
	w.mu.Unlock()
	require.Contains(t, msg, "holds already")

	// Functions documented as "lock held".
	for name, f := range map[string]func(){
		"established": func() { c.established(0, c.peers[0], nil) },
		"txDrain":     func() { w.txDrain(tx, 0) },
		"refresh":     func() { w.refresh(tx, 0) },
		"find":        func() { c.reg.find([]byte{1}) },
		"standing":    func() { w.notify.standing() },
	} {
		require.Contains(t, testutil.Recovered(f), "does not hold", name)
	}

	// tx.mu precedes the engine's lock: a credit answer (which takes
	// tx.mu) must not run under the engine's lock. Ask for a buffer the
	// target will not post soon, so the request stays in flight.
	tx.mu.Lock()
	w.askCredit(tx, 0, 1000)
	call := tx.ask
	tx.mu.Unlock()
	require.NotNil(t, call)
	c.eng.Locked(func() { msg = testutil.Recovered(func() { call.after(nil) }) })
	require.Contains(t, msg, "credit answer")

	// Kept, the rules let the window work; Free drops the credit request.
	require.NoError(t, w.Put(ctx, make([]byte, 8), 0, 0))
	e, err := w.WaitEpoch(ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(1), e)
	require.NoError(t, w.Free(ctx))
}
