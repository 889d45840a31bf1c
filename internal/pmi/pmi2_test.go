package pmi

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rvma/rvma/internal/kvs"
	"github.com/rvma/rvma/internal/pmitest"
	"github.com/stretchr/testify/require"
)

var (
	_ kvs.Store = (*Client)(nil)
	_ kvs.Store = (*Client2)(nil)
	_ Session   = (*Client)(nil)
	_ Session   = (*Client2)(nil)
)

// dial gives the rank's end of a server's socketpair, as FromEnv does (a
// file, which the session makes a net.Conn that deadlines cut), or with
// raw a connection without deadlines (closing it cuts a request).
func dial(t *testing.T, s *pmitest.Server, rank int, raw bool) io.ReadWriteCloser {
	t.Helper()
	f, err := s.Conn(rank)
	require.NoError(t, err)
	if !raw {
		return f
	}
	c, err := net.FileConn(f)
	require.NoError(t, err)
	f.Close()
	return struct{ io.ReadWriteCloser }{c}
}

func env(s *pmitest.Server, rank int) Env {
	e := EnvFromOS()
	for _, kv := range s.Env(rank, 3) {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "PMI_RANK":
			e.Rank = v
		case "PMI_SIZE":
			e.Size = v
		case "PMI_JOBID":
			e.JobID = v
		}
	}
	e.ID = ""
	return e
}

// A job of goroutines bootstraps through PMI-2: each puts a value (with
// ';' and '=' inside), fences, and reads every other's; a missing key
// is a timeout, after which the session still works; all finalize.
func TestPMI2Job(t *testing.T) {
	const n = 4
	for _, right := range []bool{false, true} {
		t.Run(fmt.Sprintf("right-aligned=%v", right), func(t *testing.T) {
			srv := pmitest.New(n)
			srv.RightAlign = right
			defer srv.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			val := func(r int) string { return fmt.Sprintf("addr=%d;x;;y;k=v;", r) }
			var wg sync.WaitGroup
			errs := make([]error, n)
			for r := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					errs[r] = func() error {
						s, err := Open(ctx, dial(t, srv, r, r == 3), 0, env(srv, r))
						if err != nil {
							return err
						}
						if s.Version() != 2 || s.Rank() != r || s.Size() != n {
							return fmt.Errorf("version %d rank %d size %d", s.Version(), s.Rank(), s.Size())
						}
						if err := s.Put(ctx, fmt.Sprintf("k-%d", r), val(r)); err != nil {
							return err
						}
						if err := s.Barrier(ctx); err != nil {
							return err
						}
						for p := range n {
							v, err := s.Get(ctx, fmt.Sprintf("k-%d", p))
							if err != nil {
								return err
							}
							if v != val(p) {
								return fmt.Errorf("k-%d = %q, want %q", p, v, val(p))
							}
						}
						short, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
						_, err = s.Get(short, "missing")
						cancel()
						if !errors.Is(err, context.DeadlineExceeded) {
							return fmt.Errorf("get of a missing key: %v", err)
						}
						if _, err := s.Get(ctx, "k-0"); err != nil {
							return fmt.Errorf("after a missing key: %w", err)
						}
						return s.Close()
					}()
				}()
			}
			wg.Wait()
			for r, err := range errs {
				require.NoError(t, err, "rank %d", r)
			}
			require.Equal(t, n, srv.Finalized())
			reqs := strings.Join(srv.Requests(), "\n")
			require.Contains(t, reqs, "0: cmd=init pmi_version=2 pmi_subversion=0")
			require.Contains(t, reqs, "2: cmd=fullinit;pmirank=2;pmijobid=4242.0;threaded=FALSE;")
			require.Contains(t, reqs, "1: cmd=kvs-put;key=k-1;value=addr=1;;x;;;;y;;k=v;;;")
			require.Contains(t, reqs, "3: cmd=kvs-get;srcid=-1;key=k-0;")
			require.Contains(t, reqs, "0: cmd=kvs-fence;")
			require.Contains(t, reqs, "1: cmd=finalize;")
		})
	}
}

// Keys and values PMI-2 cannot carry are refused before anything is sent.
func TestPMI2BadInput(t *testing.T) {
	srv := pmitest.New(1)
	defer srv.Close()
	ctx := context.Background()
	s, err := Open(ctx, dial(t, srv, 0, false), 2, env(srv, 0))
	require.NoError(t, err)
	defer s.Close()
	for _, kv := range [][2]string{{"", "v"}, {"a=b", "v"}, {"a;b", "v"}, {"a b", "v"}, {strings.Repeat("k", MaxKeyLen+1), "v"},
		{"k", ""}, {"k", strings.Repeat("v", MaxValLen+1)}, {"k", "a\x00b"}} {
		require.Error(t, s.Put(ctx, kv[0], kv[1]), "%q", kv)
	}
	require.NoError(t, s.Put(ctx, strings.Repeat("k", MaxKeyLen), strings.Repeat("v", MaxValLen)))
	_, err = s.Get(ctx, "a=b")
	require.Error(t, err)
	require.NotContains(t, strings.Join(srv.Requests(), "\n"), "a=b")
}

// A reply with rc != 0 is a *ServerError carrying errmsg (';' undoubled);
// the session goes on.
func TestPMI2ServerError(t *testing.T) {
	srv := pmitest.New(1)
	srv.Fail = func(_ int, cmd string, f map[string]string) (int, string) {
		if cmd == "kvs-put" && f["key"] == "bad" {
			return 6, "value refused; try another"
		}
		return 0, ""
	}
	defer srv.Close()
	ctx := context.Background()
	s, err := Open(ctx, dial(t, srv, 0, false), 0, env(srv, 0))
	require.NoError(t, err)
	err = s.Put(ctx, "bad", "v")
	var se *ServerError
	require.ErrorAs(t, err, &se)
	require.Equal(t, 6, se.RC)
	require.Equal(t, "kvs-put-response", se.Cmd)
	require.Equal(t, "value refused; try another", se.Msg)
	require.Contains(t, err.Error(), "rc=6: value refused; try another")
	require.NoError(t, s.Put(ctx, "good", "v"))
	require.NoError(t, s.Barrier(ctx))
	v, err := s.Get(ctx, "good")
	require.NoError(t, err)
	require.Equal(t, "v", v)
	require.NoError(t, s.Close())
}

// Slurm refuses a fullinit without pmijobid (PMI_JOBID unset): Open says
// so with the server's rc.
func TestPMI2FullinitRefused(t *testing.T) {
	srv := pmitest.New(1)
	defer srv.Close()
	e := env(srv, 0)
	e.JobID = ""
	_, err := Open(context.Background(), dial(t, srv, 0, false), 0, e)
	var se *ServerError
	require.ErrorAs(t, err, &se)
	require.Equal(t, 3, se.RC)
	require.Equal(t, "fullinit-response", se.Cmd)
}

// A server that closes the connection in the middle of a request: a clear
// error at once, and the session refuses further use.
func TestPMI2Hangup(t *testing.T) {
	for _, at := range []string{"init", "fullinit", "kvs-put", "kvs-fence", "kvs-get", "finalize"} {
		t.Run(at, func(t *testing.T) {
			srv := pmitest.New(1)
			srv.Hangup = func(_ int, cmd string) bool { return cmd == at }
			defer srv.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			s, err := Open(ctx, dial(t, srv, 0, false), 0, env(srv, 0))
			if at == "init" || at == "fullinit" {
				require.ErrorContains(t, err, "the launcher closed the PMI connection during "+at)
				return
			}
			require.NoError(t, err)
			err = s.Put(ctx, "k", "v")
			if at == "kvs-put" {
				require.ErrorContains(t, err, "the launcher closed the PMI connection during kvs-put")
				require.ErrorIs(t, s.Barrier(ctx), ErrBroken)
				return
			}
			require.NoError(t, err)
			err = s.Barrier(ctx)
			if at == "kvs-fence" {
				require.ErrorContains(t, err, "during kvs-fence")
				_, err = s.Get(ctx, "k")
				require.ErrorIs(t, err, ErrBroken)
				return
			}
			require.NoError(t, err)
			_, err = s.Get(ctx, "k")
			if at == "kvs-get" {
				require.ErrorContains(t, err, "during kvs-get")
				return
			}
			require.NoError(t, err)
			require.ErrorContains(t, s.Close(), "during finalize")
			require.NoError(t, ctx.Err())
		})
	}
}

// A fence that the other ranks never enter returns when its context
// ends; Grace later it is cut, over a net.Conn (by a deadline) or a
// connection without deadlines (by closing it), and the session is
// unusable afterwards. Waiting for another request's turn ends with ctx
// too.
func TestPMI2Cancel(t *testing.T) {
	defer func(g time.Duration) { Grace = g }(Grace)
	Grace = time.Second // long enough that a loaded machine returns the cancelled fence first
	for _, raw := range []bool{false, true} {
		t.Run(fmt.Sprintf("raw=%v", raw), func(t *testing.T) {
			srv := pmitest.New(2)
			defer srv.Close()
			ctx := context.Background()
			s, err := Open(ctx, dial(t, srv, 0, raw), 0, env(srv, 0))
			require.NoError(t, err)
			fenced := make(chan error, 1)
			fctx, cancel := context.WithCancel(ctx)
			go func() { fenced <- s.Barrier(fctx) }()
			require.Eventually(t, func() bool {
				return strings.Contains(strings.Join(srv.Requests(), "\n"), "kvs-fence")
			}, 5*time.Second, time.Millisecond)
			// Another request waits for its turn, and gives up with its ctx.
			short, cancel2 := context.WithTimeout(ctx, 20*time.Millisecond)
			err = s.Put(short, "k", "v")
			cancel2()
			require.ErrorIs(t, err, context.DeadlineExceeded)
			t0 := time.Now()
			cancel()
			select {
			case err := <-fenced:
				require.ErrorIs(t, err, context.Canceled)
			case <-time.After(5 * time.Second):
				t.Fatal("a cancelled fence did not return")
			}
			require.Less(t, time.Since(t0), Grace)
			err = s.Put(ctx, "k", "v") // waits for the fence's cut
			require.ErrorIs(t, err, ErrBroken)
			require.ErrorContains(t, err, "no reply to kvs-fence within 1s of its cancellation")
			require.GreaterOrEqual(t, time.Since(t0), Grace)
			require.NoError(t, s.Close())
		})
	}
}

// Version negotiation: a PMI-1-only server (answering a PMI-2 init with
// version 1, with rc 0 or not), forced versions, and a forced PMI-2
// refused by a PMI-1 server.
func TestNegotiation(t *testing.T) {
	for _, tc := range []struct {
		name        string
		maxVersion  int
		downgradeRC int
		force       int
		want        int
		wantErr     string
	}{
		{name: "pmi2", want: 2},
		{name: "force1", force: 1, want: 1},
		{name: "force2", force: 2, want: 2},
		{name: "pmi1-only", maxVersion: 1, want: 1},
		{name: "pmi1-only-rc1", maxVersion: 1, downgradeRC: 1, want: 1},
		{name: "force2-pmi1-only", maxVersion: 1, force: 2, wantErr: "speaks PMI-1 only"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const n = 2
			srv := pmitest.New(n)
			srv.MaxVersion, srv.DowngradeRC = tc.maxVersion, tc.downgradeRC
			defer srv.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var wg sync.WaitGroup
			errs := make([]error, n)
			for r := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					errs[r] = func() error {
						s, err := Open(ctx, dial(t, srv, r, false), tc.force, env(srv, r))
						if err != nil {
							return err
						}
						defer s.Close()
						if s.Version() != tc.want || srv.Version(r) != tc.want {
							return fmt.Errorf("client speaks %d, server %d; want %d", s.Version(), srv.Version(r), tc.want)
						}
						if err := s.Put(ctx, fmt.Sprintf("k%d", r), "v"); err != nil {
							return err
						}
						if err := s.Barrier(ctx); err != nil {
							return err
						}
						_, err = s.Get(ctx, fmt.Sprintf("k%d", 1-r))
						return err
					}()
				}()
			}
			wg.Wait()
			for _, err := range errs {
				if tc.wantErr != "" {
					require.ErrorContains(t, err, tc.wantErr)
				} else {
					require.NoError(t, err)
				}
			}
		})
	}
}

// FromEnv: no PMI_FD is no session; a bad one, an error naming it.
func TestFromEnv(t *testing.T) {
	t.Setenv("PMI_FD", "")
	_, ok, err := FromEnv(context.Background(), 0)
	require.False(t, ok)
	require.NoError(t, err)
	t.Setenv("PMI_FD", "x")
	_, ok, err = FromEnv(context.Background(), 0)
	require.True(t, ok)
	require.ErrorContains(t, err, `PMI_FD="x"`)

	srv := pmitest.New(1)
	defer srv.Close()
	srv.Setenv(t, 0)
	s, ok, err := FromEnv(context.Background(), 0)
	require.True(t, ok)
	require.NoError(t, err)
	require.Equal(t, 2, s.Version())
	require.NoError(t, s.Close())
	require.Equal(t, 1, srv.Finalized())
}

func TestParse2(t *testing.T) {
	for _, tc := range []struct {
		body   string
		cmd    string
		fields map[string]string
		bad    bool
	}{
		{body: "cmd=kvs-get-response;rc=0;found=TRUE;value=a=b;;c;", cmd: "kvs-get-response",
			fields: map[string]string{"rc": "0", "found": "TRUE", "value": "a=b;c"}},
		{body: "cmd=x;v=;;;", cmd: "x", fields: map[string]string{"v": ";"}},
		{body: "cmd=x;v=;w=1;", cmd: "x", fields: map[string]string{"v": "", "w": "1"}},
		{body: "cmd=x;k=1;k=2;", cmd: "x", fields: map[string]string{"k": "1"}},
		{body: "cmd=fullinit-response;", cmd: "fullinit-response", fields: map[string]string{}},
		{body: "", bad: true},
		{body: "cmd=x", bad: true},
		{body: "cmd=x;;", bad: true},
		{body: "cmd=x;k", bad: true},
		{body: "cmd=x;=v;", bad: true},
		{body: "cmd=x;a;b=c;", bad: true},
		{body: "rc=0;cmd=x;", bad: true},
		{body: "cmd=x;v=a;;", bad: true},
	} {
		cmd, fields, err := Parse2(tc.body)
		if tc.bad {
			require.ErrorIs(t, err, ErrProtocol, "%q", tc.body)
			continue
		}
		require.NoError(t, err, "%q", tc.body)
		require.Equal(t, tc.cmd, cmd)
		require.Equal(t, tc.fields, fields)
	}
	for _, hdr := range []string{"12    ", "    12", "  12  ", "000012"} {
		n, err := ParseLen2([]byte(hdr))
		require.NoError(t, err)
		require.Equal(t, 12, n)
	}
	for _, hdr := range []string{"      ", "000000", "-00001", "+00001", "1 2   ", "abcdef", "12\n   "} {
		_, err := ParseLen2([]byte(hdr))
		require.ErrorIs(t, err, ErrProtocol, "%q", hdr)
	}
	msg, err := Encode2("kvs-put", "key", "k", "value", "a;b")
	require.NoError(t, err)
	require.Equal(t, "29    cmd=kvs-put;key=k;value=a;;b;", string(msg))
	_, err = Encode2("x", "k")
	require.Error(t, err)
	_, err = Encode2("x", "a=b", "v")
	require.Error(t, err)
	_, err = Encode2("x", "k", strings.Repeat("v", MaxFrame))
	require.Error(t, err)
}

// FuzzParse2: Parse2 never panics; what it accepts, Encode2 frames back
// into a message ReadFrame2 and Parse2 read as the same.
func FuzzParse2(f *testing.F) {
	f.Add("cmd=kvs-get-response;rc=0;found=TRUE;value=a=b;;c;")
	f.Add("cmd=fullinit-response;rc=0;rank=1;size=4;appnum=-1;")
	f.Add("cmd=x;v=;;;")
	f.Add("cmd=;=;;;")
	f.Fuzz(func(t *testing.T, body string) {
		cmd, fields, err := Parse2(body)
		if err != nil {
			require.ErrorIs(t, err, ErrProtocol)
			return
		}
		var kv []string
		for k, v := range fields {
			require.NotEmpty(t, k)
			require.False(t, strings.ContainsAny(k, "=;"))
			kv = append(kv, k, v)
		}
		msg, err := Encode2(cmd, kv...)
		if err != nil {
			require.Greater(t, len(body), MaxFrame/2)
			return
		}
		got, err := ReadFrame2(bufio.NewReader(strings.NewReader(string(msg))))
		require.NoError(t, err)
		cmd2, fields2, err := Parse2(got)
		require.NoError(t, err)
		require.Equal(t, cmd, cmd2)
		require.Equal(t, fields, fields2)
	})
}

// A reply cut in the middle, or with a length field that is no number:
// a clear error, not a hang.
func TestPMI2BadReply(t *testing.T) {
	for _, tc := range []struct{ reply, want string }{
		{"    50cmd=fullinit-response;rc=0;", "closed the PMI connection during fullinit"},
		{"abcdefcmd=fullinit-response;rc=0;", `length field "abcdef"`},
		{frame("cmd=kvs-put-response;rc=0;"), "sent fullinit, got"},
		{frame("cmd=fullinit-response;"), "fullinit-response without rc"},
		{frame("cmd=fullinit-response;rc=0;rank=0;"), "without size"},
		{frame("cmd=fullinit-response;rc=0;rank=2;size=2;appnum=0;"), "rank 2 of 2"},
		{frame("cmd=fullinit-response;rc=x;"), `rc="x" is not a number`},
		{frame("cmd=fullinit-response;rc=0"), "not ended by ';'"},
	} {
		a, b := net.Pipe()
		go func() {
			r := bufio.NewReader(b)
			r.ReadString('\n')
			b.Write([]byte("cmd=response_to_init pmi_version=2 pmi_subversion=0 rc=0\n"))
			var hdr [6]byte
			io.ReadFull(r, hdr[:])
			n, _ := ParseLen2(hdr[:])
			io.ReadFull(r, make([]byte, n))
			b.Write([]byte(tc.reply))
			b.Close()
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := New2(ctx, a, Identity{PMIRank: "0"})
		cancel()
		require.ErrorContains(t, err, tc.want)
	}
}

func frame(body string) string { return fmt.Sprintf("%-6d%s", len(body), body) }
