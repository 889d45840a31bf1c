package pmix_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/internal/pmix"
	"github.com/rvma/rvma/internal/pmix/pmixtest"
	"github.com/rvma/rvma/internal/pmix/wire"
)

func newServer(t *testing.T, size int) *pmixtest.Server {
	t.Helper()
	srv, err := pmixtest.New(size)
	require.NoError(t, err)
	t.Cleanup(srv.Close)
	return srv
}

func dial(t *testing.T, srv *pmixtest.Server, rank int) *pmix.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pmix.Dial(ctx, srv.URI(), wire.Proc{Nspace: srv.Nspace, Rank: uint32(rank)}, nil)
	require.NoError(t, err)
	return c
}

// Every rank puts, commits and enters a collecting fence; then each reads
// every other rank's value, and finalizes.
func TestPutFenceGet(t *testing.T) {
	const n = 4
	srv := newServer(t, n)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, n)
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := dial(t, srv, r)
			c.Put("addr", fmt.Sprintf("rank %d", r))
			c.Put("other", "x")
			err := errors.Join(c.Commit(ctx), c.Fence(ctx, true))
			for p := range n {
				v, gerr := c.Get(ctx, uint32(p), "addr")
				if gerr == nil && v != fmt.Sprintf("rank %d", p) {
					gerr = fmt.Errorf("rank %d read %q from %d", r, v, p)
				}
				err = errors.Join(err, gerr)
			}
			errs[r] = errors.Join(err, c.Close(ctx))
		}()
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
	require.Equal(t, n, srv.Finalized())
	reqs := strings.Join(srv.Requests(), "\n")
	require.Contains(t, reqs, "0: connect 3.2.3 v3 hash")
	require.Contains(t, reqs, "2: commit 2")
	require.Contains(t, reqs, "1: fence [4242.*] collect=true")
	require.Contains(t, reqs, "3: get 4242.0 addr")
}

// A key the rank did not put: ErrNotFound, and the session goes on.
func TestGetNotFound(t *testing.T) {
	srv := newServer(t, 1)
	ctx := context.Background()
	c := dial(t, srv, 0)
	c.Put("a", "1")
	require.NoError(t, c.Commit(ctx))
	require.NoError(t, c.Fence(ctx, true))
	_, err := c.Get(ctx, 0, "b")
	require.ErrorIs(t, err, pmix.ErrNotFound)
	v, err := c.Get(ctx, 0, "a")
	require.NoError(t, err)
	require.Equal(t, "1", v)
	require.NoError(t, c.Close(ctx))
}

// A fence that does not complete returns when the context ends, saying
// so; the session stays usable.
func TestFenceTimeout(t *testing.T) {
	srv := newServer(t, 2) // rank 1 never comes
	c := dial(t, srv, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := c.Fence(ctx, true)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Contains(t, err.Error(), "fence")
	require.Less(t, time.Since(start), 5*time.Second)
	require.NoError(t, c.Commit(context.Background()), "the reply of the abandoned fence is not taken for the commit's")
	require.NoError(t, c.Close(context.Background()))
}

// The server hangs up mid-request: ErrServerGone, now and after.
func TestServerGone(t *testing.T) {
	srv := newServer(t, 1)
	srv.Hangup = func(_ uint32, cmd uint8) bool { return cmd == wire.CmdFence }
	c := dial(t, srv, 0)
	ctx := context.Background()
	require.NoError(t, c.Commit(ctx))
	err := c.Fence(ctx, true)
	require.ErrorIs(t, err, pmix.ErrServerGone)
	_, err = c.Get(ctx, 0, "x")
	require.ErrorIs(t, err, pmix.ErrServerGone)
	require.NoError(t, c.Close(ctx), "nothing to finalize with a server that is gone")

	// and a server that is not there at all
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	_, err = pmix.Dial(ctx, "x.0;tcp4://"+addr, wire.Proc{Nspace: "x"}, nil)
	require.ErrorIs(t, err, pmix.ErrServerGone)
}

// A server that does not serve this client's version or encoding hangs
// up on its connection request, as PMIx's does: ErrProtocol, naming them.
func TestVersionRefused(t *testing.T) {
	srv := newServer(t, 1)
	srv.Bfrops = []string{"v41"}
	_, err := pmix.Dial(context.Background(), srv.URI(), wire.Proc{Nspace: srv.Nspace}, nil)
	require.ErrorIs(t, err, pmix.ErrProtocol)
	require.Contains(t, err.Error(), "v3")

	// an unknown rank is hung up on the same way
	_, err = pmix.Dial(context.Background(), newServer(t, 1).URI(), wire.Proc{Nspace: "4242", Rank: 5}, nil)
	require.ErrorIs(t, err, pmix.ErrProtocol)
}

// A server that accepts the connection and never answers: the handshake
// ends with the context.
func TestHandshakeTimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			defer c.Close()
			time.Sleep(5 * time.Second)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err = pmix.Dial(ctx, "tcp4://"+ln.Addr().String(), wire.Proc{Nspace: "x"}, nil)
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

func TestParseURI(t *testing.T) {
	for _, tc := range []struct{ uri, want string }{
		{"168820736.0;tcp4://127.0.0.1:40997", "127.0.0.1:40997"},
		{"tcp6://[::1]:5", "[::1]:5"},
		{"tcp://10.0.0.1:7", "10.0.0.1:7"},
	} {
		got, err := pmix.ParseURI(tc.uri)
		require.NoError(t, err)
		require.Equal(t, tc.want, got)
	}
	for _, bad := range []string{"x.0;usock:/tmp/pmix", "tcp4://nohost", ""} {
		_, err := pmix.ParseURI(bad)
		require.ErrorIs(t, err, pmix.ErrProtocol, bad)
	}
}

func TestFromEnv(t *testing.T) {
	for _, v := range []string{"PMIX_SERVER_URI3", "PMIX_SERVER_URI4", "PMIX_SERVER_URI41", "PMIX_SERVER_URI21", "PMIX_SERVER_URI2"} {
		t.Setenv(v, "")
	}
	_, ok, err := pmix.FromEnv()
	require.False(t, ok)
	require.NoError(t, err)

	t.Setenv("PMIX_SERVER_URI2", "old;tcp4://127.0.0.1:1")
	t.Setenv("PMIX_SERVER_URI3", "new;tcp4://127.0.0.1:2")
	t.Setenv("PMIX_NAMESPACE", "77")
	t.Setenv("PMIX_RANK", "3")
	t.Setenv("PMIX_SECURITY_MODE", "munge,native")
	env, ok, err := pmix.FromEnv()
	require.True(t, ok)
	require.NoError(t, err)
	require.Equal(t, pmix.Env{URI: "new;tcp4://127.0.0.1:2", Proc: wire.Proc{Nspace: "77", Rank: 3}}, env)

	t.Setenv("PMIX_SECURITY_MODE", "munge")
	_, _, err = pmix.FromEnv()
	require.ErrorIs(t, err, pmix.ErrProtocol)
	t.Setenv("PMIX_SECURITY_MODE", "")
	t.Setenv("PMIX_RANK", "x")
	_, ok, err = pmix.FromEnv()
	require.True(t, ok)
	require.Error(t, err)
}
