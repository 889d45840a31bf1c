package kvs

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// recoverers gives the same Recoverer semantics in process and over TCP,
// with the launcher's side (Died, Respawned).
func recoverers(t *testing.T, size int) map[string]func() (func(int) Recoverer, interface {
	Died(int)
	Respawned(int, uint32)
}) {
	return map[string]func() (func(int) Recoverer, interface {
		Died(int)
		Respawned(int, uint32)
	}){
		"mem": func() (func(int) Recoverer, interface {
			Died(int)
			Respawned(int, uint32)
		}) {
			m := NewMem(size)
			return func(int) Recoverer { return m }, m
		},
		"server": func() (func(int) Recoverer, interface {
			Died(int)
			Respawned(int, uint32)
		}) {
			srv, err := Listen("127.0.0.1:0", size)
			require.NoError(t, err)
			t.Cleanup(func() { srv.Close() })
			return func(int) Recoverer {
				c, err := Dial(context.Background(), srv.Addr(), nil)
				require.NoError(t, err)
				t.Cleanup(func() { c.Close() })
				return c
			}, srv
		},
	}
}

func TestJoinRounds(t *testing.T) {
	for name, mk := range recoverers(t, 3) {
		t.Run(name, func(t *testing.T) {
			client, launcher := mk()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			cl := []Recoverer{client(0), client(1), client(2)}
			watch := client(0)

			// A death is a fault; the rank's state says so.
			launcher.Died(1)
			f, err := watch.Faults(ctx, 0)
			require.NoError(t, err)
			require.Equal(t, uint64(1), f.N)
			require.Equal(t, []bool{false, true, false}, f.Dead)

			// The dead incarnation cannot join; ranks 0 and 2 wait for 1's
			// next one.
			_, err = cl[1].Join(ctx, 1, 0, "x")
			require.ErrorIs(t, err, ErrStale)
			views := make([]View, 3)
			var wg sync.WaitGroup
			for _, r := range []int{0, 2} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					v, err := cl[r].Join(ctx, r, 0, fmt.Sprintf("v%d", r))
					require.NoError(t, err)
					views[r] = v
				}()
			}
			// The round opening is a fault too: a rank not joined hears of it.
			f, err = watch.Faults(ctx, 1)
			require.NoError(t, err)
			require.Equal(t, uint64(2), f.N)
			time.Sleep(20 * time.Millisecond)
			launcher.Respawned(1, 1)
			v, err := cl[1].Join(ctx, 1, 1, "fresh")
			require.NoError(t, err)
			views[1] = v
			wg.Wait()
			for _, v := range views {
				require.Equal(t, View{Gen: 1, Faults: 2, Inc: []uint32{0, 1, 0}, Values: []string{"v0", "fresh", "v2"}}, v)
			}
			_, err = cl[1].Join(ctx, 1, 0, "old")
			require.ErrorIs(t, err, ErrStale)

			// A rank that dies while joined leaves the round: the view
			// holds its next incarnation's value, never the dead one's.
			for _, r := range []int{0, 2} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					v, err := cl[r].Join(ctx, r, 0, fmt.Sprintf("g2r%d", r))
					if r == 2 {
						require.ErrorIs(t, err, ErrStale)
						return
					}
					require.NoError(t, err)
					views[r] = v
				}()
			}
			time.Sleep(20 * time.Millisecond)
			launcher.Died(2)
			launcher.Respawned(2, 1)
			done := make(chan View)
			go func() {
				v, err := cl[1].Join(ctx, 1, 1, "g2r1")
				require.NoError(t, err)
				done <- v
			}()
			v, err = client(2).Join(ctx, 2, 1, "new2")
			require.NoError(t, err)
			views[1] = <-done
			wg.Wait()
			require.Equal(t, uint64(2), v.Gen)
			require.Equal(t, []uint32{0, 1, 1}, v.Inc)
			require.Equal(t, []string{"g2r0", "g2r1", "new2"}, v.Values)
			require.Equal(t, v, views[0])
			require.Equal(t, v, views[1])
		})
	}
}

func TestJoinCancelLeavesRound(t *testing.T) {
	m := NewMem(2)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err := m.Join(ctx, 0, 0, "gone")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	// Rank 0's abandoned entry must not complete a round with rank 1 alone.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel2()
	_, err = m.Join(ctx2, 1, 0, "alone")
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

func TestRecoveryBadInput(t *testing.T) {
	srv, err := Listen("127.0.0.1:0", 2)
	require.NoError(t, err)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, req := range []string{"join x 0 v", "join 0 -1 v", "faults -3", "faults", "join 0 0"} {
		c, err := Dial(ctx, srv.Addr(), nil)
		require.NoError(t, err)
		_, err = c.do(ctx, req)
		require.ErrorContains(t, err, "malformed", req)
		c.Close()
	}
	c, err := Dial(ctx, srv.Addr(), nil)
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Join(ctx, 7, 0, "v")
	require.ErrorContains(t, err, "rank 7 of 2")
	_, err = c.Join(ctx, 0, 0, "two words")
	require.Error(t, err)
}

func FuzzParseFaults(f *testing.F) {
	f.Add("faults 3 0 d1 2")
	f.Add("faults x")
	f.Fuzz(func(t *testing.T, line string) {
		fl, err := parseFaults(line)
		if err == nil {
			require.Equal(t, len(fl.Inc), len(fl.Dead))
		}
	})
}

// A launcher elsewhere (a host's daemon) records deaths and incarnations
// through an authenticated client: the ranks' watch sees them as it sees
// the server's own Died and Respawned.
func TestDiedRespawnedRequests(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	srv, err := ListenConfig("127.0.0.1:0", 3, &ServerConfig{Key: key})
	require.NoError(t, err)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	daemon, err := Dial(ctx, srv.Addr(), key)
	require.NoError(t, err)
	defer daemon.Close()
	watch, err := Dial(ctx, srv.Addr(), key)
	require.NoError(t, err)
	defer watch.Close()

	require.NoError(t, daemon.Died(ctx, 2))
	f, err := watch.Faults(ctx, 0)
	require.NoError(t, err)
	require.Equal(t, Faults{N: 1, Inc: []uint32{0, 0, 0}, Dead: []bool{false, false, true}}, f)
	require.NoError(t, daemon.Respawned(ctx, 2, 1))
	_, err = watch.Join(ctx, 2, 0, "old")
	require.ErrorIs(t, err, ErrStale, "the dead incarnation is refused once the next is recorded")

	// The record is there when Respawned returns: the new incarnation
	// joins at once (with the other two, so that the round completes).
	views := make(chan View, 3)
	for r, inc := range []uint32{0, 0, 1} {
		go func() {
			c, err := Dial(ctx, srv.Addr(), key)
			require.NoError(t, err)
			defer c.Close()
			v, err := c.Join(ctx, r, inc, fmt.Sprintf("v%d", r))
			require.NoError(t, err)
			views <- v
		}()
	}
	for range 3 {
		require.Equal(t, []uint32{0, 0, 1}, (<-views).Inc)
	}

	// Out of range: refused by name, and the connection ends.
	err = daemon.Died(ctx, 3)
	require.ErrorContains(t, err, "died: rank 3 of 3")
	bad, err := Dial(ctx, srv.Addr(), key)
	require.NoError(t, err)
	defer bad.Close()
	require.ErrorContains(t, bad.Respawned(ctx, -1, 1), "respawned: rank -1 of 3")
	for _, req := range []string{"died", "died x", "respawned 1", "respawned 1 -2", "respawned 1 x", "died 1 2"} {
		c, err := Dial(ctx, srv.Addr(), key)
		require.NoError(t, err)
		_, err = c.do(ctx, req)
		require.ErrorContains(t, err, "malformed", req)
		c.Close()
	}
}

// A server without a key takes no died or respawned: anything that
// reaches its port could declare ranks dead.
func TestDiedNeedsKey(t *testing.T) {
	srv, err := Listen("127.0.0.1:0", 2)
	require.NoError(t, err)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, req := range []func(c *Client) error{
		func(c *Client) error { return c.Died(ctx, 1) },
		func(c *Client) error { return c.Respawned(ctx, 1, 1) },
	} {
		c, err := Dial(ctx, srv.Addr(), nil)
		require.NoError(t, err)
		require.ErrorContains(t, req(c), "only a server with a key takes it")
		c.Close()
	}
	c, err := Dial(ctx, srv.Addr(), nil)
	require.NoError(t, err)
	defer c.Close()
	short, cancelShort := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancelShort()
	_, err = c.Faults(short, 0)
	require.ErrorIs(t, err, context.DeadlineExceeded, "no fault was recorded")
}

// Once a rank has finished, a join fails at once instead of waiting for a
// rank that will not come, and so does one already waiting.
func TestJoinAfterFinished(t *testing.T) {
	m := NewMem(3)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	errc := make(chan error)
	go func() { _, err := m.Join(ctx, 0, 0, "v"); errc <- err }()
	time.Sleep(10 * time.Millisecond)
	m.Finished(2)
	require.ErrorIs(t, <-errc, ErrFinished)
	_, err := m.Join(ctx, 1, 0, "v")
	require.ErrorIs(t, err, ErrFinished)
	srv, err := Listen("127.0.0.1:0", 2)
	require.NoError(t, err)
	defer srv.Close()
	c, err := Dial(ctx, srv.Addr(), nil)
	require.NoError(t, err)
	defer c.Close()
	srv.Finished(1)
	_, err = c.Join(ctx, 0, 0, "v")
	require.ErrorIs(t, err, ErrFinished)
}
