package kvs

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/internal/testutil"
)

func TestServerClients(t *testing.T) {
	srv, err := Listen("127.0.0.1:0", 3)
	require.NoError(t, err)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	got := make([][]string, 3)
	for r := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := Dial(ctx, srv.Addr(), nil)
			require.NoError(t, err)
			defer c.Close()
			require.NoError(t, c.Put(ctx, fmt.Sprintf("addr/%d", r), fmt.Sprintf("host:%d", 100+r)))
			require.NoError(t, c.Barrier(ctx))
			for p := range 3 {
				v, err := c.Get(ctx, fmt.Sprintf("addr/%d", p))
				require.NoError(t, err)
				got[r] = append(got[r], v)
			}
			require.NoError(t, c.Barrier(ctx))
		}()
	}
	wg.Wait()
	for r := range 3 {
		require.Equal(t, []string{"host:100", "host:101", "host:102"}, got[r])
	}
}

func TestGetBlocksUntilPut(t *testing.T) {
	s := NewMem(1)
	ctx := context.Background()
	res := make(chan string)
	go func() {
		v, _ := s.Get(ctx, "k")
		res <- v
	}()
	select {
	case <-res:
		t.Fatal("Get returned before Put")
	case <-time.After(10 * time.Millisecond):
	}
	require.NoError(t, s.Put(ctx, "k", "v"))
	require.Equal(t, "v", <-res)

	short, cancel := context.WithTimeout(ctx, time.Millisecond)
	defer cancel()
	_, err := s.Get(short, "missing")
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

func TestBadInput(t *testing.T) {
	s := NewMem(1)
	require.Error(t, s.Put(context.Background(), "a b", "v"))
	require.Error(t, s.Put(context.Background(), "k", ""))

	srv, err := Listen("127.0.0.1:0", 1)
	require.NoError(t, err)
	defer srv.Close()
	c, err := net.Dial("tcp", srv.Addr())
	require.NoError(t, err)
	defer c.Close()
	fmt.Fprintf(c, "frobnicate\n")
	line, err := bufio.NewReader(c).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "err malformed request\n", line)

	// A client whose Get is cancelled fails cleanly and is then closed.
	cl, err := Dial(context.Background(), srv.Addr(), nil)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err = cl.Get(ctx, "never")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	_, err = cl.Get(context.Background(), "never")
	require.ErrorIs(t, err, ErrClosed)
}

// flakyServer answers gets on its connections after a random delay, or
// drops the connection instead, so that clients' requests fail while
// their contexts are being cancelled.
func flakyServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					if _, err := r.ReadString('\n'); err != nil {
						return
					}
					time.Sleep(time.Duration(rand.IntN(200)) * time.Microsecond)
					if rand.IntN(8) == 0 {
						return
					}
					if _, err := fmt.Fprintf(c, "val v\n"); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// Many requests at once on one client, their contexts cancelled at random
// while the server drops the connection under them: no request may
// panic, race (go test -race) or report anything but a value, its
// context's error, a connection error or ErrClosed.
func TestClientCancelRace(t *testing.T) {
	addr := flakyServer(t)
	for range 40 {
		c, err := Dial(context.Background(), addr, nil)
		require.NoError(t, err)
		var wg sync.WaitGroup
		for range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 8 {
					ctx, cancel := context.WithCancel(context.Background())
					go func() {
						time.Sleep(time.Duration(rand.IntN(300)) * time.Microsecond)
						cancel()
					}()
					v, err := c.Get(ctx, "k")
					switch {
					case err == nil:
						require.Equal(t, "v", v)
					case errors.Is(err, context.Canceled), errors.Is(err, ErrClosed):
					default:
						require.ErrorContains(t, err, "kvs: ")
					}
					cancel()
				}
			}()
		}
		if rand.IntN(2) == 0 {
			time.Sleep(time.Duration(rand.IntN(500)) * time.Microsecond)
			c.Close()
		}
		wg.Wait()
		c.Close()
	}
}

// A context cancelled just as its request's reply arrives must not cut
// the next request (its deadline callback runs late).
func TestCancelDoesNotCutNextRequest(t *testing.T) {
	// Closed connections leave the server's count a little later than
	// the client redials.
	srv, err := ListenConfig("127.0.0.1:0", 1, &ServerConfig{MaxConns: 1000})
	require.NoError(t, err)
	defer srv.Close()
	bg := context.Background()
	c, err := Dial(bg, srv.Addr(), nil)
	require.NoError(t, err)
	defer func() { c.Close() }()
	require.NoError(t, c.Put(bg, "k", "v"))
	for range 300 {
		ctx, cancel := context.WithCancel(bg)
		go cancel()
		if _, err := c.Get(ctx, "k"); err != nil {
			require.ErrorIs(t, err, context.Canceled)
			c.Close()
			c, err = Dial(bg, srv.Addr(), nil)
			require.NoError(t, err)
			continue
		}
		v, err := c.Get(bg, "k")
		require.NoError(t, err)
		require.Equal(t, "v", v)
	}
}

// Close cuts a request in progress instead of waiting behind it.
func TestCloseCutsRequest(t *testing.T) {
	srv, err := Listen("127.0.0.1:0", 1)
	require.NoError(t, err)
	defer srv.Close()
	c, err := Dial(context.Background(), srv.Addr(), nil)
	require.NoError(t, err)
	res := make(chan error)
	go func() {
		_, err := c.Get(context.Background(), "never")
		res <- err
	}()
	// The Get holds the request lock while it waits.
	require.Eventually(t, func() bool {
		if c.mu.TryLock() {
			c.mu.Unlock()
			return false
		}
		return true
	}, 10*time.Second, time.Millisecond)
	require.NoError(t, c.Close())
	require.ErrorIs(t, <-res, ErrClosed)
	require.NoError(t, c.Close())
}

// Connections accepted while the server closes are closed too: Close
// returns, and may be called again.
func TestServerCloseWhileDialing(t *testing.T) {
	for range 20 {
		srv, err := ListenConfig("127.0.0.1:0", 1, &ServerConfig{Logger: slog.New(slog.DiscardHandler)})
		require.NoError(t, err)
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					c, err := net.Dial("tcp", srv.Addr())
					if err != nil {
						return
					}
					defer c.Close()
				}
			}()
		}
		time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond)
		closed := make(chan struct{})
		go func() {
			srv.Close()
			close(closed)
		}()
		select {
		case <-closed:
		case <-time.After(10 * time.Second):
			t.Fatal("Close did not return")
		}
		close(stop)
		wg.Wait()
		require.NoError(t, srv.Close())
	}
}

// A connection accepted just as the server closes (the window is too
// narrow to hit through the listener) is closed, not served: Close has
// already closed the others and would wait for its goroutine forever.
func TestAdmitAfterClose(t *testing.T) {
	srv, err := Listen("127.0.0.1:0", 1)
	require.NoError(t, err)
	require.NoError(t, srv.Close())
	a, b := net.Pipe()
	defer b.Close()
	srv.admit(a)
	_, err = b.Read(make([]byte, 1))
	require.ErrorIs(t, err, io.EOF)
	require.Zero(t, srv.openConns())
}

// openConns returns how many connections the server holds.
func (s *Server) openConns() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// A client that leaves while its get waits is dropped at once, not when
// the server closes.
func TestAbandonedGetIsDropped(t *testing.T) {
	srv, err := Listen("127.0.0.1:0", 1)
	require.NoError(t, err)
	defer srv.Close()
	c, err := net.Dial("tcp", srv.Addr())
	require.NoError(t, err)
	fmt.Fprintf(c, "get never\n")
	require.Eventually(t, func() bool { return srv.openConns() == 1 }, 10*time.Second, time.Millisecond)
	c.Close()
	require.Eventually(t, func() bool { return srv.openConns() == 0 }, 10*time.Second, time.Millisecond)
}

// A rank whose barrier wait ends is no longer counted in it.
func TestBarrierLeave(t *testing.T) {
	s := NewMem(2)
	short := func() context.Context {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		t.Cleanup(cancel)
		return ctx
	}
	require.ErrorIs(t, s.Barrier(short()), context.DeadlineExceeded)
	// Had the first stayed counted, this one would pass alone.
	require.ErrorIs(t, s.Barrier(short()), context.DeadlineExceeded)
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			require.NoError(t, s.Barrier(context.Background()))
		}()
	}
	wg.Wait()
}

// A line over MaxLine disconnects its client with a logged reason, before
// the server has read much more than MaxLine of it; lines within the
// bound are served.
func TestLineLimit(t *testing.T) {
	var log testutil.SyncBuffer
	srv, err := ListenConfig("127.0.0.1:0", 1, &ServerConfig{MaxLine: 4096, Logger: slog.New(slog.NewTextHandler(&log, nil))})
	require.NoError(t, err)
	defer srv.Close()
	ctx := context.Background()
	cl, err := Dial(ctx, srv.Addr(), nil)
	require.NoError(t, err)
	defer cl.Close()
	long := strings.Repeat("x", 4000)
	require.NoError(t, cl.Put(ctx, "k", long))
	v, err := cl.Get(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, long, v)

	c, err := net.Dial("tcp", srv.Addr())
	require.NoError(t, err)
	defer c.Close()
	// 64 MiB without a newline: more than the socket buffers hold, so the
	// writes fail once the server has dropped the connection.
	chunk := bytes.Repeat([]byte("y"), 1<<20)
	var werr error
	for i := 0; i < 64 && werr == nil; i++ {
		_, werr = c.Write(chunk)
	}
	require.Error(t, werr, "the server read a 64 MiB line")
	require.Eventually(t, func() bool { return strings.Contains(log.String(), "line over 4096 bytes") }, 10*time.Second, time.Millisecond)
	require.Contains(t, log.String(), "kvs: dropping client")
}

// Connections over MaxConns are refused with a reason, logged; once one
// closes, a new one is served.
func TestConnLimit(t *testing.T) {
	var log testutil.SyncBuffer
	srv, err := ListenConfig("127.0.0.1:0", 1, &ServerConfig{MaxConns: 2, Logger: slog.New(slog.NewTextHandler(&log, nil))})
	require.NoError(t, err)
	defer srv.Close()
	ctx := context.Background()
	var cls []*Client
	for i := range 2 {
		cl, err := Dial(ctx, srv.Addr(), nil)
		require.NoError(t, err)
		defer cl.Close()
		require.NoError(t, cl.Put(ctx, fmt.Sprint("k", i), "v"))
		cls = append(cls, cl)
	}
	c, err := net.Dial("tcp", srv.Addr())
	require.NoError(t, err)
	defer c.Close()
	line, err := bufio.NewReader(c).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "err too many connections\n", line)
	require.Contains(t, log.String(), "refusing connections over the limit")

	cls[0].Close()
	require.Eventually(t, func() bool { return srv.openConns() < 2 }, 10*time.Second, time.Millisecond)
	cl, err := Dial(ctx, srv.Addr(), nil)
	require.NoError(t, err)
	defer cl.Close()
	v, err := cl.Get(ctx, "k1")
	require.NoError(t, err)
	require.Equal(t, "v", v)
}
