// Command linkem emulates a long-haul link between two UDP endpoints in
// user space: what arrives at --a leaves from --b toward the endpoint
// behind B, and back, through a rate limiter and the configured delay,
// jitter, loss, bursts, reordering and duplication (each direction its
// own seeded draw). Each side's peer is the latest endpoint to send to it
// (a restarted sender takes over), or --peer-a/--peer-b strictly. Point
// the tools' data paths at it, e.g.
//
//	linkem --a 127.0.0.1:7001 --b 127.0.0.1:7002 --delay 12.5ms --rate 500mbit --loss 1e-3
//	haul recv --listen 127.0.0.1:7000 --via 127.0.0.1:7002 --out f
//	haul send --to 127.0.0.1:7000 --via 127.0.0.1:7001 f
//
// It prints both directions' counters on exit (SIGINT or SIGTERM) and,
// with --stats D, every D. --blackout AT,FOR takes the link down, both
// ways, for FOR from AT after start.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rvma/rvma/internal/linkem"
	"github.com/rvma/rvma/internal/units"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "linkem:", err)
		}
		os.Exit(2)
	}
}

// runOpts are the flags that act while linkem runs.
type runOpts struct {
	every   time.Duration // print counters this often (0: on exit only)
	downAt  time.Duration // the blackout's start after linkem's
	downFor time.Duration // and its length (0: none)
}

func parse(args []string, stderr io.Writer) (linkem.Config, runOpts, error) {
	var cfg linkem.Config
	var ro runOpts
	fs := flag.NewFlagSet("linkem", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.A, "a", "127.0.0.1:0", "side A's listen address")
	fs.StringVar(&cfg.B, "b", "127.0.0.1:0", "side B's listen address")
	peerA := fs.String("peer-a", "", "the endpoint behind A, fixed (default: the latest to send to A, so that a restarted endpoint takes over)")
	peerB := fs.String("peer-b", "", "the endpoint behind B, fixed (default: the latest to send to B)")
	fs.DurationVar(&cfg.Faults.Delay, "delay", 0, "one-way delay, each direction (RTT is twice this)")
	fs.DurationVar(&cfg.Faults.Jitter, "jitter", 0, "uniform extra delay in [0, jitter)")
	rate := fs.String("rate", "", "each direction's rate, as tc spells it (500mbit, 1gbit); default unlimited")
	queue := fs.String("queue", "", "bytes each direction queues before dropping (default 4MiB or 50ms at the rate)")
	fs.Float64Var(&cfg.Faults.Drop, "loss", 0, "Bernoulli per-packet loss probability")
	burst := fs.String("burst", "", "Gilbert-Elliott bursts P_GB,P_BG: per packet, good→bad and bad→good probabilities; all lost while bad")
	fs.Float64Var(&cfg.Faults.Reorder, "reorder", 0, "probability a packet is held back behind later ones")
	fs.Float64Var(&cfg.Faults.Duplicate, "dup", 0, "probability a packet is delivered twice")
	fs.Uint64Var(&cfg.Faults.Seed, "seed", 1, "seed of the random draws (B→A uses seed+1)")
	fs.DurationVar(&ro.every, "stats", 0, "print counters every this often (default: only on exit)")
	blackout := fs.String("blackout", "", "AT,FOR: drop everything, both ways, from AT after start for FOR (e.g. 3s,5s), as a path that goes down and comes back")
	if err := fs.Parse(args); err != nil {
		return cfg, ro, err
	}
	if *blackout != "" {
		at, dur, ok := strings.Cut(*blackout, ",")
		var err1, err2 error
		ro.downAt, err1 = time.ParseDuration(at)
		ro.downFor, err2 = time.ParseDuration(dur)
		if !ok || err1 != nil || err2 != nil || ro.downAt < 0 || ro.downFor <= 0 {
			return cfg, ro, fmt.Errorf("--blackout %q: want AT,FOR, two durations (3s,5s)", *blackout)
		}
	}
	if fs.NArg() > 0 {
		return cfg, ro, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	for _, p := range []struct {
		s   string
		dst *netip.AddrPort
	}{{*peerA, &cfg.PeerA}, {*peerB, &cfg.PeerB}} {
		if p.s == "" {
			continue
		}
		ap, err := netip.ParseAddrPort(p.s)
		if err != nil {
			return cfg, ro, fmt.Errorf("peer %q: %w", p.s, err)
		}
		*p.dst = ap
	}
	if *rate != "" {
		bits, err := units.ParseRate(*rate)
		if err != nil {
			return cfg, ro, err
		}
		cfg.Rate = bits / 8
	}
	if *queue != "" {
		q, err := units.ParseSize(*queue)
		if err != nil {
			return cfg, ro, err
		}
		cfg.Queue = int(q)
	}
	if *burst != "" {
		gb, bg, ok := strings.Cut(*burst, ",")
		var err1, err2 error
		cfg.Faults.BurstEnter, err1 = strconv.ParseFloat(gb, 64)
		cfg.Faults.BurstExit, err2 = strconv.ParseFloat(bg, 64)
		if !ok || err1 != nil || err2 != nil || cfg.Faults.BurstEnter <= 0 || cfg.Faults.BurstExit <= 0 || cfg.Faults.BurstExit > 1 {
			return cfg, ro, fmt.Errorf("--burst %q: want P_GB,P_BG, two probabilities in (0, 1]", *burst)
		}
	}
	for name, p := range map[string]float64{"loss": cfg.Faults.Drop, "reorder": cfg.Faults.Reorder, "dup": cfg.Faults.Duplicate} {
		if p < 0 || p > 1 {
			return cfg, ro, fmt.Errorf("--%s %g: want a probability in [0, 1]", name, p)
		}
	}
	if cfg.Faults.Delay < 0 || cfg.Faults.Jitter < 0 {
		return cfg, ro, errors.New("--delay and --jitter must not be negative")
	}
	return cfg, ro, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, ro, err := parse(args, stderr)
	if err != nil {
		return err
	}
	l, err := linkem.Start(cfg)
	if err != nil {
		return err
	}
	defer l.Close()
	fmt.Fprintf(stdout, "linkem: A %v <-> B %v: delay %v jitter %v rate %s loss %g burst %g,%g reorder %g dup %g seed %d\n",
		l.AddrA(), l.AddrB(), cfg.Faults.Delay, cfg.Faults.Jitter, rateString(cfg.Rate), cfg.Faults.Drop,
		cfg.Faults.BurstEnter, cfg.Faults.BurstExit, cfg.Faults.Reorder, cfg.Faults.Duplicate, cfg.Faults.Seed)
	print := func() {
		ab, ba := l.Stats()
		fmt.Fprintf(stdout, "linkem: A->B %v\nlinkem: B->A %v\n", ab, ba)
	}
	var tick <-chan time.Time
	if ro.every > 0 {
		t := time.NewTicker(ro.every)
		defer t.Stop()
		tick = t.C
	}
	var down, up <-chan time.Time
	if ro.downFor > 0 {
		down = time.After(ro.downAt)
	}
	for {
		select {
		case <-ctx.Done():
			print()
			return nil
		case <-tick:
			print()
		case <-down:
			down, up = nil, time.After(ro.downFor)
			l.SetDown(true)
			fmt.Fprintf(stdout, "linkem: down for %v (--blackout)\n", ro.downFor)
		case <-up:
			up = nil
			l.SetDown(false)
			fmt.Fprintf(stdout, "linkem: up again\n")
		}
	}
}

func rateString(bytesPerSec float64) string {
	if bytesPerSec == 0 {
		return "unlimited"
	}
	return fmt.Sprintf("%.0fmbit", bytesPerSec*8/1e6)
}
