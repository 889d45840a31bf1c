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
// the server never writes to a client that sends nothing, and never drops
// one it has admitted, so the connection ends only with the server. Only
// two things are a verdict: that end, and a refused dial. Anything else
// (a dial that fails otherwise, a handshake cut or refused, a refusal
// after it) is asked again for as long as the watch lasts: a watch given
// up would leave the rank alive after its launcher.
func (w *watcher) conn(ctx context.Context, addr string) {
	var d net.Dialer
	pause, logged := minRetry, false
	retry := func(msg string, err error) bool {
		if !logged {
			// Once: a server refusing for good (its connection limit)
			// would fill the log.
			w.cfg.Logger.Warn("launch: "+msg+"; asking again", "addr", addr, "err", err)
			logged = true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(pause):
		}
		pause = min(2*pause, maxRetry)
		return true
	}
	for {
		c, err := d.DialContext(ctx, "tcp", addr)
		switch {
		case err == nil:
		case ctx.Err() != nil:
			return
		case errors.Is(err, syscall.ECONNREFUSED):
			w.gone(fmt.Sprintf("the launcher is gone: its rendezvous at %s refuses connections", addr))
			return
		default:
			// Not a sign of the launcher (we may be out of file
			// descriptors, or its host unreachable for a while).
			if !retry("cannot watch the launcher's rendezvous", err) {
				return
			}
			continue
		}
		hctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		cl, err := kvs.NewClient(hctx, c, w.cfg.Key)
		cancel()
		if err == nil {
			err = cl.Wait(ctx)
			cl.Close()
			if ctx.Err() != nil {
				return
			}
			if err == nil {
				w.gone(fmt.Sprintf("the launcher is gone: its rendezvous at %s closed the connection", addr))
				return
			}
		}
		// A handshake cut (the launcher may be dying: the next dial's
		// refusal says so), or refused, or a refusal after it.
		if ctx.Err() != nil || !retry("the launcher's rendezvous refused the watch", err) {
			return
		}
	}
}

// minRetry and maxRetry bound the pause before a watch asks again.
const (
	minRetry = 20 * time.Millisecond
	maxRetry = 2 * time.Second
)

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
