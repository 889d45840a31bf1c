package kvs

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/internal/testutil"
)

var (
	jobKey   = []byte("the job's key, 32 bytes long....")
	otherKey = []byte("another job's key, not this one.")
)

// outsider sends lines on a fresh connection, as a process without the
// key would, and returns the first reply line ("" if none).
func outsider(t *testing.T, addr string, lines ...string) string {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer c.Close()
	for _, l := range lines {
		c.Write([]byte(l + "\n"))
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, _ := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line)
}

// What an outsider did to rvmarun's rendezvous (read every rank's
// address, overwrite one, enter the barrier) is each refused, and leaves
// the job's values and barrier as they were.
func TestOutsiderIsRefused(t *testing.T) {
	srv, err := ListenConfig("127.0.0.1:0", 2, &ServerConfig{Key: jobKey})
	require.NoError(t, err)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rank0, err := Dial(ctx, srv.Addr(), jobKey)
	require.NoError(t, err)
	defer rank0.Close()
	require.NoError(t, rank0.Put(ctx, "rvma-cm-0", "127.0.0.1:7000"))

	for name, lines := range map[string][]string{
		"read":              {"get rvma-cm-0"},
		"overwrite":         {"put rvma-cm-0 10.6.6.6:1"},
		"barrier":           {"barrier"},
		"forged auth":       {"auth 00112233445566778899aabbccddeeff", "proof " + strings.Repeat("ab", 32), "put rvma-cm-0 10.6.6.6:1"},
		"guessed tag":       {"get rvma-cm-0 " + strings.Repeat("0", 32)},
		"malformed nonce":   {"auth xyz"},
		"over-long request": {"auth " + strings.Repeat("a", 1000)},
	} {
		reply := outsider(t, srv.Addr(), lines...)
		require.True(t, strings.HasPrefix(reply, "err") || reply == "" || strings.HasPrefix(reply, "challenge"), "%s: %q", name, reply)
		require.NotContains(t, reply, "127.0.0.1:7000", name)
	}
	// A client with another job's key is refused too.
	_, err = Dial(ctx, srv.Addr(), otherKey)
	require.ErrorIs(t, err, ErrAuth)

	// The value is intact, and the barrier counts the job's ranks only.
	v, err := rank0.Get(ctx, "rvma-cm-0")
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:7000", v)
	rank1, err := Dial(ctx, srv.Addr(), jobKey)
	require.NoError(t, err)
	defer rank1.Close()
	bctx, bcancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer bcancel()
	require.ErrorIs(t, rank1.Barrier(bctx), context.DeadlineExceeded, "one rank alone does not pass a barrier of two")
	rank1, err = Dial(ctx, srv.Addr(), jobKey) // the cut request closed the first
	require.NoError(t, err)
	defer rank1.Close()
	var wg sync.WaitGroup
	for _, c := range []*Client{rank0, rank1} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			require.NoError(t, c.Barrier(ctx))
		}()
	}
	wg.Wait()
}

// A client refuses a server that cannot prove it holds the key: one
// impersonating the rendezvous learns nothing it could use.
func TestClientRefusesFakeServer(t *testing.T) {
	for _, key := range [][]byte{nil, otherKey} {
		srv, err := ListenConfig("127.0.0.1:0", 1, &ServerConfig{Key: key})
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err = Dial(ctx, srv.Addr(), jobKey)
		require.ErrorIs(t, err, ErrAuth, "server key %q", key)
		cancel()
		srv.Close()
	}
}

// Flooding (a line with no end, many silent connections) is bounded: the
// flooder is dropped after a few hundred bytes, silent connections are
// dropped oldest first, and the job's ranks still get in at once.
func TestFloodAndStall(t *testing.T) {
	var log testutil.SyncBuffer
	srv, err := ListenConfig("127.0.0.1:0", 1, &ServerConfig{Key: jobKey, MaxPending: 8, HandshakeTimeout: 300 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&log, nil))})
	require.NoError(t, err)
	defer srv.Close()

	c, err := net.Dial("tcp", srv.Addr())
	require.NoError(t, err)
	defer c.Close()
	chunk := bytes.Repeat([]byte("y"), 1<<20)
	var werr error
	for i := 0; i < 64 && werr == nil; i++ {
		_, werr = c.Write(chunk)
	}
	require.Error(t, werr, "the server read a 64 MiB line before authentication")

	var silent []net.Conn
	for range 40 {
		s, err := net.Dial("tcp", srv.Addr())
		require.NoError(t, err)
		defer s.Close()
		silent = append(silent, s)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	cl, err := Dial(ctx, srv.Addr(), jobKey)
	require.NoError(t, err)
	defer cl.Close()
	require.NoError(t, cl.Put(ctx, "k", "v"))
	require.Less(t, time.Since(start), 3*time.Second)
	require.Contains(t, log.String(), "dropping unauthenticated connections over the limit")
	// Every silent connection ends: dropped, or at the handshake timeout.
	for _, s := range silent {
		s.SetReadDeadline(time.Now().Add(3 * time.Second))
		_, err := bufio.NewReader(s).ReadString('\n')
		require.NotErrorIs(t, err, context.DeadlineExceeded)
		var ne net.Error
		if errors.As(err, &ne) {
			require.False(t, ne.Timeout(), "still open after the handshake timeout")
		}
	}
}

// A session's tags refuse a line replayed, reordered, altered or sent in
// the other direction.
func TestSessionTags(t *testing.T) {
	var nc, ns [nonceLen]byte
	nc[0], ns[0] = 1, 2
	client, server := newSession(jobKey, nc, ns), newSession(jobKey, nc, ns)
	l0 := client.seal('c', "put a 1")
	l1 := client.seal('c', "put b 2")
	for name, line := range map[string]string{
		"reordered":       l1,
		"altered":         strings.Replace(l0, "put a 1", "put a 9", 1),
		"other dir":       (&session{key: client.key}).seal('s', "put a 1"),
		"no tag":          "put a 1",
		"other session":   newSession(jobKey, ns, nc).seal('c', "put a 1"),
		"truncated tag":   l0[:len(l0)-2],
		"other job's key": newSession(otherKey, nc, ns).seal('c', "put a 1"),
	} {
		s := *server
		_, err := s.open('c', line)
		require.ErrorIs(t, err, ErrAuth, name)
	}
	got, err := server.open('c', l0)
	require.NoError(t, err)
	require.Equal(t, "put a 1", got)
	_, err = server.open('c', l0)
	require.ErrorIs(t, err, ErrAuth, "replayed")
}

// Whatever a client sends, the server's handshake neither panics nor
// admits it without the key.
func FuzzServerHandshake(f *testing.F) {
	f.Add([]byte("auth 00112233445566778899aabbccddeeff\nproof " + strings.Repeat("ab", 32) + "\n"))
	f.Add([]byte("get k\n"))
	f.Add([]byte("auth \nproof\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		s := &Server{cfg: (&ServerConfig{Key: jobKey, HandshakeTimeout: time.Second}).withDefaults(1)}
		a, c := net.Pipe()
		defer a.Close()
		go func() {
			c.Write(b)
			c.Close()
		}()
		go io.Copy(io.Discard, c)
		_, err := s.handshake(a)
		require.Error(t, err)
	})
}

// A line's tag check never panics, and never passes a line it did not
// seal.
func FuzzSessionOpen(f *testing.F) {
	var nc, ns [nonceLen]byte
	sealed := newSession(jobKey, nc, ns).seal('c', "put k v")
	f.Add(sealed + "x")
	f.Add("put k v " + strings.Repeat("0", 32))
	f.Add("")
	f.Fuzz(func(t *testing.T, line string) {
		s := newSession(jobKey, nc, ns)
		if got, err := s.open('c', line); err == nil {
			require.Equal(t, sealed, line, "opened %q", got)
		}
	})
}

// A client over MaxConns learns it in the handshake: the server answers
// "ok" only to a client it serves, so an authenticated connection that
// ends means the server is gone (a launcher watch relies on it).
func TestOKOnlyWhenAdmitted(t *testing.T) {
	srv, err := ListenConfig("127.0.0.1:0", 1, &ServerConfig{Key: jobKey, MaxConns: 1})
	require.NoError(t, err)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	first, err := Dial(ctx, srv.Addr(), jobKey)
	require.NoError(t, err)
	defer first.Close()
	c, err := net.Dial("tcp", srv.Addr())
	require.NoError(t, err)
	_, err = NewClient(ctx, c, jobKey)
	require.ErrorIs(t, err, ErrAuth)
	require.Contains(t, err.Error(), "too many connections")
	// The admitted client is still served.
	require.NoError(t, first.Put(ctx, "k", "v"))
}
