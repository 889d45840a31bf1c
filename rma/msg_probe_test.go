package rma

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestProbeMatch: a probe describes the message the matching receive
// would take (source, tag, length) and leaves it there; a blocking probe
// waits for one that arrives later; a receive cancelled through its
// context takes nothing.
func TestProbeMatch(t *testing.T) {
	comms := newWorld(t, 2, nil)
	each(t, comms, func(ctx context.Context, c *Comm) error {
		if c.Rank() == 1 {
			for _, m := range []struct {
				tag  int
				data string
			}{{5, "five"}, {6, "sixsix"}} {
				if err := c.Send(ctx, 0, m.tag, []byte(m.data)); err != nil {
					return err
				}
			}
			if _, err := c.Recv(ctx, 0, 1); err != nil {
				return err
			}
			time.Sleep(20 * time.Millisecond) // rank 0 is probing by now
			return c.Send(ctx, 0, 7, []byte("late"))
		}
		wild := Match{Source: AnySource, Mask: 0}
		// Send waited for each to arrive: both are here.
		for range 2 {
			e, err := c.ProbeMatch(ctx, wild)
			if err != nil {
				return err
			}
			if e != (Envelope{Source: 1, Tag: 5, Len: 4}) {
				return fmt.Errorf("probe: %+v, want the first message (not taken by a probe)", e)
			}
		}
		// Tag 6 may still be on its way: the blocking probe waits, then
		// the other sees it.
		e, err := c.ProbeMatch(ctx, Match{Source: 1, Tag: 6, Mask: ^uint32(0)})
		if err != nil || e != (Envelope{Source: 1, Tag: 6, Len: 6}) {
			return fmt.Errorf("probe of tag 6: %+v %v", e, err)
		}
		e, ok, err := c.TryProbeMatch(Match{Source: 1, Tag: 6, Mask: ^uint32(0)})
		if err != nil || !ok || e != (Envelope{Source: 1, Tag: 6, Len: 6}) {
			return fmt.Errorf("try probe of tag 6: %+v %v %v", e, ok, err)
		}
		// A snapshot taken before both arrived sees neither.
		if _, ok, err := c.TryProbeMatch(Match{Source: AnySource, Mask: 0, Before: 1}); ok || err != nil {
			return fmt.Errorf("before: %v %v", ok, err)
		}
		if b, err := c.Recv(ctx, 1, 5); err != nil || string(b) != "five" {
			return fmt.Errorf("recv 5: %q %v", b, err)
		}
		if e, err = c.ProbeMatch(ctx, wild); err != nil || e.Tag != 6 {
			return fmt.Errorf("probe after recv: %+v %v", e, err)
		}
		if m, err := c.RecvMatch(ctx, wild); err != nil || string(m.Data) != "sixsix" || m.Tag != 6 {
			return fmt.Errorf("recv match: %+v %v", m, err)
		}
		if _, ok, err := c.TryProbeMatch(wild); ok || err != nil {
			return fmt.Errorf("a third message: %v %v", ok, err)
		}

		// A receive whose context is cancelled returns, taking nothing;
		// the message it waited for is there for the next one.
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			_, err := c.RecvMatch(cctx, Match{Source: 1, Tag: 7, Mask: ^uint32(0)})
			done <- err
		}()
		time.Sleep(10 * time.Millisecond)
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			return fmt.Errorf("cancelled receive: %v", err)
		}
		if err := c.Send(ctx, 1, 1, nil); err != nil {
			return err
		}
		if e, err = c.ProbeMatch(ctx, Match{Source: 1, Tag: 7, Mask: ^uint32(0)}); err != nil || e.Len != 4 {
			return fmt.Errorf("blocking probe: %+v %v", e, err)
		}
		if b, err := c.Recv(ctx, 1, 7); err != nil || string(b) != "late" {
			return fmt.Errorf("recv 7: %q %v", b, err)
		}
		return nil
	})
}

func TestProbeMatchArgs(t *testing.T) {
	comms := newWorld(t, 2, nil)
	c := comms[0]
	_, _, err := c.TryProbeMatch(Match{Source: 2})
	require.ErrorIs(t, err, ErrRank)
	_, _, err = c.TryProbeMatch(Match{Source: AnySource, Tag: -1})
	require.ErrorIs(t, err, ErrSync)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	_, err = c.ProbeMatch(ctx, Match{Source: AnySource})
	require.ErrorIs(t, err, context.DeadlineExceeded)
}
