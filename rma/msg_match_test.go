package rma

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestRecvMatch: receives from any source and with any tag take the
// earliest-arrived message that matches, report where it came from, keep
// each (source, tag) in send order, and leave collectives' messages alone.
func TestRecvMatch(t *testing.T) {
	comms := newWorld(t, 3, nil)
	each(t, comms, func(ctx context.Context, c *Comm) error {
		if c.Rank() != 0 {
			// Two messages with tag 1<<24|7 then one with tag 1<<24|9, each
			// sent once the one before has arrived (Send waits for that).
			for i := range 2 {
				if err := c.Send(ctx, 0, 1<<24|7, []byte(fmt.Sprintf("r%d m%d", c.Rank(), i))); err != nil {
					return err
				}
			}
			if err := c.Send(ctx, 0, 1<<24|9, []byte(fmt.Sprintf("r%d last", c.Rank()))); err != nil {
				return err
			}
			return c.Barrier(ctx)
		}
		// Take the six as they come, as libmpi does (a snapshot, a try,
		// else wait for the next arrival): any source and any tag of
		// context 1 (mask 0xff000000), rank r's in the order r sent them.
		next := map[int]int{1: 0, 2: 0}
		for range 6 {
			var m Message
			for {
				at := c.Arrived()
				var ok bool
				var err error
				if m, ok, err = c.TryRecvMatch(Match{Source: AnySource, Tag: 1 << 24, Mask: 0xff000000, Before: at}); err != nil {
					return err
				} else if ok {
					break
				}
				if err := c.WaitArrival(ctx, at); err != nil {
					return err
				}
			}
			want := fmt.Sprintf("r%d m%d", m.Source, next[m.Source])
			wantTag := 1<<24 | 7
			if next[m.Source] == 2 {
				want, wantTag = fmt.Sprintf("r%d last", m.Source), 1<<24|9
			}
			if string(m.Data) != want || m.Tag != wantTag {
				return fmt.Errorf("got %q tag %#x from %d, want %q tag %#x", m.Data, m.Tag, m.Source, want, wantTag)
			}
			next[m.Source]++
		}
		if _, ok, err := c.TryRecvMatch(Match{Source: AnySource, Mask: 0}); ok || err != nil {
			return fmt.Errorf("a seventh message: %v %v", ok, err)
		}
		return c.Barrier(ctx) // its messages are not taken by the wildcard
	})
}

// TestRecvMatchBlocks: RecvMatch waits for a message from any source with
// an exact tag, skipping others; Before bounds TryRecvMatch to a snapshot.
func TestRecvMatchBlocks(t *testing.T) {
	comms := newWorld(t, 2, nil)
	each(t, comms, func(ctx context.Context, c *Comm) error {
		if c.Rank() == 1 {
			if _, err := c.Recv(ctx, 0, 1); err != nil {
				return err
			}
			if err := c.Send(ctx, 0, 3, []byte("three")); err != nil {
				return err
			}
			time.Sleep(20 * time.Millisecond) // rank 0 is waiting by now
			return c.Send(ctx, 0, 4, []byte("four"))
		}
		before := c.Arrived()
		if err := c.Send(ctx, 1, 1, nil); err != nil {
			return err
		}
		m, err := c.RecvMatch(ctx, Match{Source: AnySource, Tag: 4, Mask: ^uint32(0)})
		if err != nil {
			return err
		}
		if string(m.Data) != "four" || m.Source != 1 || m.Tag != 4 {
			return fmt.Errorf("got %+v", m)
		}
		// "three" arrived after the snapshot: bounded by it, nothing.
		if _, ok, err := c.TryRecvMatch(Match{Source: 1, Tag: 3, Mask: ^uint32(0), Before: before}); ok || err != nil {
			return fmt.Errorf("before: %v %v", ok, err)
		}
		m, ok, err := c.TryRecvMatch(Match{Source: 1, Tag: 3, Mask: ^uint32(0), Before: c.Arrived()})
		if err != nil || !ok || string(m.Data) != "three" {
			return fmt.Errorf("three: %+v %v %v", m, ok, err)
		}
		return nil
	})
}

func TestRecvMatchArgs(t *testing.T) {
	comms := newWorld(t, 2, nil)
	c := comms[0]
	_, _, err := c.TryRecvMatch(Match{Source: 2})
	require.ErrorIs(t, err, ErrRank)
	_, _, err = c.TryRecvMatch(Match{Source: AnySource, Tag: userTagLimit})
	require.Error(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	_, err = c.RecvMatch(ctx, Match{Source: AnySource})
	require.ErrorIs(t, err, context.DeadlineExceeded)
}
