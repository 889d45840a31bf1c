// Package launch is what a rank needs from its launcher beyond the
// rendezvous: noticing that the launcher is gone (Watch), and undoing the
// ignored signals a launcher's own starter may have passed down
// (ResetSignals).
//
// rvmarun starts its ranks with a parent-death signal, which ends them
// when it dies, even by SIGKILL; Watch covers what that cannot: a rank
// started through a wrapper (whose parent is the wrapper), and a
// launcher thread, not process, being what the kernel ties that signal
// to.
package launch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/rvma/rvma/internal/kvs"
)

// EnvPID names the variable in which rvmarun passes its process ID to the
// ranks it starts.
const EnvPID = "RVMA_LAUNCHER_PID"

// WatchConfig adjusts Watch; the zero value means defaults.
type WatchConfig struct {
	// PID is the launcher's process ID (default $RVMA_LAUNCHER_PID; 0
	// and unset: no parent check). The parent check runs only in a rank
	// whose parent it is when Watch starts: one started through a wrapper
	// has another parent, and relies on the connection.
	PID int
	// Interval is how often the parent is checked (default 500ms).
	Interval time.Duration
	// Gone is called, once, when the launcher is found gone, with why
	// (default: print that to stderr and exit with status 1).
	Gone func(reason string)
	// Logger receives why a watch could not be set up (default
	// slog.Default()).
	Logger *slog.Logger
	// Key is the job's key, which the rendezvous requires before it keeps
	// a connection open (default none: an unauthenticated rendezvous).
	Key []byte
}

func (c *WatchConfig) withDefaults() WatchConfig {
	var d WatchConfig
	if c != nil {
		d = *c
	}
	if d.PID == 0 {
		d.PID, _ = strconv.Atoi(os.Getenv(EnvPID))
	}
	if d.Interval <= 0 {
		d.Interval = 500 * time.Millisecond
	}
	if d.Gone == nil {
		d.Gone = exit
	}
	if d.Logger == nil {
		d.Logger = slog.Default()
	}
	return d
}

// exit is the default Gone. The message may find no reader (stderr was
// most likely a pipe to the launcher); a wrapper may have redirected it.
func exit(reason string) {
	fmt.Fprintf(os.Stderr, "rvma: pid %d: %s; exiting\n", os.Getpid(), reason)
	os.Exit(1)
}

// Watch watches, until ctx ends, for the launcher going away: the
// connection it opens to the launcher's rendezvous at addr (RVMA_KVS)
// closing, which happens when the launcher dies however it dies, or this
// process's parent changing from cfg.PID. Then it calls cfg.Gone, by
// default ending the process. addr "" skips the connection. Watch returns
// at once; a rank calls it once, for its lifetime.
func Watch(ctx context.Context, addr string, cfg *WatchConfig) {
	w := &watcher{cfg: cfg.withDefaults()}
	if addr != "" {
		go w.conn(ctx, addr)
	}
	if w.cfg.PID > 0 && os.Getppid() == w.cfg.PID {
		go w.parent(ctx)
	}
}

type watcher struct {
	cfg  WatchConfig
	once sync.Once
}

func (w *watcher) gone(reason string) {
	w.once.Do(func() { w.cfg.Gone(reason) })
}

// conn holds an idle, authenticated connection to the rendezvous server:
// the server never writes to a client that sends nothing, so the
// connection ends only with the server, or with the server refusing it.
func (w *watcher) conn(ctx context.Context, addr string) {
	cl := w.dial(ctx, addr)
	if cl == nil {
		return
	}
	defer cl.Close()
	switch err := cl.Wait(ctx); {
	case ctx.Err() != nil:
	case err != nil:
		w.cfg.Logger.Warn("launch: the launcher's rendezvous refused the watch", "addr", addr, "err", err)
	default:
		w.gone(fmt.Sprintf("the launcher is gone: its rendezvous at %s closed the connection", addr))
	}
}

// handshakeTries bounds the dials of a watch whose connections end during
// the handshake without a word from the server.
const handshakeTries = 5

// dial connects and authenticates to the rendezvous, or returns nil after
// calling gone or logging why there is no watch. A launcher that dies
// while the watch is being set up ends the connection in the middle of
// the handshake: that is no verdict (a live server may drop a connection
// too), so dial asks again, and the next dial's refusal is the verdict.
func (w *watcher) dial(ctx context.Context, addr string) *kvs.Client {
	var d net.Dialer
	pause := 20 * time.Millisecond
	for try := 1; ; try++ {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			switch {
			case ctx.Err() != nil:
			case errors.Is(err, syscall.ECONNREFUSED):
				w.gone(fmt.Sprintf("the launcher is gone: its rendezvous at %s refuses connections", addr))
			default:
				// Not a sign of the launcher (we may be out of file
				// descriptors): no watch is better than a wrong verdict.
				w.cfg.Logger.Warn("launch: cannot watch the launcher's rendezvous", "addr", addr, "err", err)
			}
			return nil
		}
		hctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		cl, err := kvs.NewClient(hctx, c, w.cfg.Key)
		cancel()
		switch {
		case err == nil:
			return cl
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, kvs.ErrAuth), errors.Is(err, context.DeadlineExceeded), try == handshakeTries:
			// The server answered with a refusal, or never answered.
			w.cfg.Logger.Warn("launch: the launcher's rendezvous refused the watch", "addr", addr, "err", err, "tries", try)
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(pause):
		}
		pause *= 2
	}
}

// parent polls the parent process ID: when the launcher dies, its
// children pass to an ancestor (init or a subreaper).
func (w *watcher) parent(ctx context.Context) {
	t := time.NewTicker(w.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if p := os.Getppid(); p != w.cfg.PID {
			w.gone(fmt.Sprintf("the launcher (pid %d) is gone: this process's parent is now pid %d", w.cfg.PID, p))
			return
		}
	}
}

// RouteTo returns the local address this host uses to reach ip (no
// packet is sent): the address a rank binds so that other hosts reach it
// back.
func RouteTo(ip string) (string, error) {
	c, err := net.Dial("udp", net.JoinHostPort(ip, "9"))
	if err != nil {
		return "", err
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).IP.String(), nil
}
