package launch

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/internal/kvs"

	"github.com/rvma/rvma/internal/testutil"
)

// envRole makes the test binary play a process of a test instead.
const envRole = "LAUNCH_TEST_ROLE"

func TestMain(m *testing.M) {
	if role := os.Getenv(envRole); role != "" {
		os.Exit(play(role))
	}
	os.Exit(m.Run())
}

func play(role string) int {
	switch role {
	case "mid": // a launcher: starts a leaf, says its pid, waits to be killed
		leaf := exec.Command(os.Args[0])
		leaf.Env = append(os.Environ(), envRole+"=leaf", EnvPID+"="+strconv.Itoa(os.Getpid()))
		leaf.Stdout = os.Stdout
		f, err := os.Create(os.Getenv("LAUNCH_TEST_STDERR"))
		if err != nil {
			panic(err)
		}
		leaf.Stderr = f
		if err := leaf.Start(); err != nil {
			panic(err)
		}
		fmt.Printf("leaf %d\n", leaf.Process.Pid)
		time.Sleep(time.Minute)
	case "leaf": // a rank: watches its launcher
		Watch(context.Background(), "", &WatchConfig{Interval: 20 * time.Millisecond})
		fmt.Println("ready")
		time.Sleep(time.Minute)
	case "reset": // a rank started with SIGINT ignored
		if err := ResetSignals(); err != nil {
			panic(err)
		}
		fmt.Println(inheritedState(syscall.SIGINT), ignoredBySelf(syscall.SIGINT))
		time.Sleep(time.Minute)
	case "signal.Reset": // the same, trying os/signal alone
		c := make(chan os.Signal, 1)
		signal.Notify(c, syscall.SIGINT)
		signal.Reset(syscall.SIGINT)
		fmt.Println(inheritedState(syscall.SIGINT), ignoredBySelf(syscall.SIGINT))
		return 0
	}
	return 3
}

// inheritedState says whether this process started with s ignored.
func inheritedState(s syscall.Signal) string {
	return fmt.Sprintf("inherited-ignored=%v", inherited[s])
}

// ignoredBySelf reports the kernel's view: the SigIgn mask in
// /proc/self/status.
func ignoredBySelf(s syscall.Signal) string {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		panic(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if hex, ok := strings.CutPrefix(l, "SigIgn:"); ok {
			m, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 64)
			if err != nil {
				panic(err)
			}
			return fmt.Sprintf("now-ignored=%v", m&(1<<(s-1)) != 0)
		}
	}
	panic("no SigIgn")
}

// goneRecorder is a WatchConfig.Gone that records its calls.
type goneRecorder struct {
	mu      sync.Mutex
	reasons []string
}

func (g *goneRecorder) gone(reason string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.reasons = append(g.reasons, reason)
}

func (g *goneRecorder) get() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.reasons...)
}

// The rendezvous server going away (the launcher dying) is noticed, once.
func TestWatchConnLost(t *testing.T) {
	srv, err := kvs.Listen("127.0.0.1:0", 1)
	require.NoError(t, err)
	var g goneRecorder
	Watch(context.Background(), srv.Addr(), &WatchConfig{Gone: g.gone})
	srv.Close()
	require.Eventually(t, func() bool { return len(g.get()) > 0 }, 10*time.Second, time.Millisecond)
	require.Len(t, g.get(), 1)
	require.Contains(t, g.get()[0], "the launcher is gone")
}

// Ending ctx ends the watch: closing its connection is no sign of the
// launcher.
func TestWatchStops(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	var g goneRecorder
	Watch(ctx, ln.Addr().String(), &WatchConfig{Gone: g.gone})
	c, err := ln.Accept()
	require.NoError(t, err)
	defer c.Close()
	cancel()
	_, err = c.Read(make([]byte, 1))
	require.ErrorIs(t, err, io.EOF, "the watch closes its connection")
	ln.Close()
	require.Never(t, func() bool { return len(g.get()) > 0 }, 100*time.Millisecond, 5*time.Millisecond)
}

// A server refusing the watch (over its connection limit) is logged, not
// taken for the launcher's death.
func TestWatchRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			io.WriteString(c, "err too many connections\n")
			c.Close()
		}
	}()
	var log testutil.SyncBuffer
	var g goneRecorder
	Watch(context.Background(), ln.Addr().String(), &WatchConfig{Gone: g.gone, Logger: slog.New(slog.NewTextHandler(&log, nil))})
	require.Eventually(t, func() bool { return strings.Contains(log.String(), "refused the watch") }, 10*time.Second, time.Millisecond)
	require.Empty(t, g.get())
	// The watch was not given up: the server's end is still noticed.
	ln.Close()
	require.Eventually(t, func() bool { return len(g.get()) > 0 }, 20*time.Second, time.Millisecond)
	require.Contains(t, g.get()[0], "the launcher is gone")
}

// dropper accepts connections on ln and ends each after reading the
// client's first line, without a word, as a dying server's kernel does;
// it counts them.
func dropper(ln net.Listener, accepted *atomic.Int32) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		accepted.Add(1)
		bufio.NewReader(c).ReadString('\n')
		c.Close()
	}
}

// A launcher that dies while a watch is in its handshake (the connection
// ends without a word, then the rendezvous refuses connections) is found
// gone: an ended handshake is asked again, not taken for "no watch".
func TestWatchLauncherDiesInHandshake(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		bufio.NewReader(c).ReadString('\n') // the client's "auth"
		ln.Close()
		c.Close()
	}()
	var log testutil.SyncBuffer
	var g goneRecorder
	Watch(context.Background(), ln.Addr().String(), &WatchConfig{Gone: g.gone, Key: []byte("job key"), Logger: slog.New(slog.NewTextHandler(&log, nil))})
	require.Eventually(t, func() bool { return len(g.get()) > 0 }, 10*time.Second, time.Millisecond, log.String())
	require.Len(t, g.get(), 1)
	require.Contains(t, g.get()[0], "refuses connections")
}

// A live server that keeps ending the watch's handshakes is asked again
// (past any fixed number of tries), logged once, and not taken for the
// launcher's death; when it dies, the watch says so.
func TestWatchHandshakeDropped(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	var accepted atomic.Int32
	go dropper(ln, &accepted)
	var log testutil.SyncBuffer
	var g goneRecorder
	Watch(context.Background(), ln.Addr().String(), &WatchConfig{Gone: g.gone, Key: []byte("job key"), Logger: slog.New(slog.NewTextHandler(&log, nil))})
	require.Eventually(t, func() bool { return accepted.Load() >= 7 }, 20*time.Second, time.Millisecond)
	require.Empty(t, g.get())
	require.Equal(t, 1, strings.Count(log.String(), "refused the watch"), log.String())
	ln.Close()
	require.Eventually(t, func() bool { return len(g.get()) > 0 }, 20*time.Second, time.Millisecond)
	require.Contains(t, g.get()[0], "the launcher is gone")
}

// A rank whose launcher dies without the rank being signalled (no
// parent-death signal here) notices its new parent and exits, saying so
// on stderr.
func TestWatchParent(t *testing.T) {
	errFile := filepath.Join(t.TempDir(), "leaf.err")
	mid := exec.Command(os.Args[0])
	mid.Env = append(os.Environ(), envRole+"=mid", "LAUNCH_TEST_STDERR="+errFile)
	out, err := mid.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, mid.Start())
	t.Cleanup(func() { mid.Process.Kill(); mid.Wait() })
	sc := bufio.NewScanner(out)
	require.True(t, sc.Scan())
	pid, err := strconv.Atoi(strings.TrimPrefix(sc.Text(), "leaf "))
	require.NoError(t, err, sc.Text())
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	require.True(t, sc.Scan())
	require.Equal(t, "ready", sc.Text())

	require.NoError(t, mid.Process.Kill())
	mid.Wait()
	require.Eventually(t, func() bool { return testutil.Exited(pid) }, 10*time.Second, 10*time.Millisecond, "the leaf outlived its launcher")
	msg, err := os.ReadFile(errFile)
	require.NoError(t, err)
	require.Contains(t, string(msg), fmt.Sprintf("the launcher (pid %d) is gone", mid.Process.Pid))
}

// A rank started with SIGINT ignored (as "&" in a script does) gets its
// default action back: SIGINT ends it.
func TestResetSignals(t *testing.T) {
	// What os/signal alone does: Notify and Reset leave it ignored.
	cmd := exec.Command("sh", "-c", `trap '' INT; exec "$0"`, os.Args[0])
	cmd.Env = append(os.Environ(), envRole+"=signal.Reset")
	b, err := cmd.Output()
	require.NoError(t, err)
	require.Equal(t, "inherited-ignored=true now-ignored=true\n", string(b))

	cmd = exec.Command("sh", "-c", `trap '' INT; exec "$0"`, os.Args[0])
	cmd.Env = append(os.Environ(), envRole+"=reset")
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	sc := bufio.NewScanner(out)
	require.True(t, sc.Scan())
	require.Equal(t, "inherited-ignored=true now-ignored=false", sc.Text())
	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	ee := testutil.ExitError(t, cmd, 10*time.Second, func() string { return "SIGINT did not end the rank" })
	ws := ee.Sys().(syscall.WaitStatus)
	require.True(t, ws.Signaled() && ws.Signal() == syscall.SIGINT, "status %v", ws)
}
