// Command haul moves a file across a long-haul link with the reliability
// package: chunks written straight into the receiver's file (mapped into
// memory and registered), losses repaired by selective repeat or
// Reed-Solomon coding as the model chooses, verified end to end (BLAKE3,
// or SHA-256 with --digest sha256),
// and an interrupted transfer resumed from what the receiver kept.
//
//	haul keygen FILE
//	haul digest [--digest blake3|sha256] [--region SIZE] PATH
//	haul recv --listen ADDR --out PATH [--key-file FILE [--encrypt]] [--via RELAY] [--wait D]
//	haul send --to ADDR [--key-file FILE [--encrypt]] [--via RELAY] [--rate auto|R] [--workers N] [--scheme auto|sr|ec] [--k K --m M] [--chunk SIZE] [--region SIZE] [--probes N] PATH
//
// ADDR is host:port; the connection setup uses TCP on it and the data
// path UDP on the same port. --via sends the data path through a relay
// such as linkem (each side names the relay address that faces it).
//
// keygen writes a new pre-shared key to FILE (mode 0600). Given the same
// --key-file, both ends authenticate the connection setup with it: a
// receiver accepts no sender without the key, and a sender trusts no
// receiver that cannot prove it holds it. Without a key, the receiver
// accepts any sender that reaches it. send --encrypt (which needs the
// key) also encrypts the payload with AES-256-GCM; recv --encrypt accepts
// only such senders.
//
// digest prints a file's digest as send computes it (and the receiver
// checks it): with --digest blake3 (the default) a BLAKE3 tree over the
// regions, so --region must be send's; with sha256 the file's SHA-256.
//
// send --rate auto (the default) finds the path's rate: the probe
// train's dispersion to start, then a delay-based controller that backs
// off when the round trip shows a queue and not on loss, which the
// reliability layer repairs; the report says what it found and how it
// moved. --rate R paces at R instead.
//
// send --workers N spreads the regions over N connections, each with its
// own sockets, queues and goroutines at both ends, so that one transfer
// uses N cores (they share --rate; through relays, each path of each
// worker needs its own --via).
//
// The receiver writes PATH.haul.part and renames it to PATH only once its
// digest matches; PATH.haul beside it records the regions in place (each
// checked as it lands against the hash the sender sends for it), so that
// a rerun of both sides resumes, and a sender restarted within --wait
// resumes with the same receiver.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"

	"github.com/rvma/rvma/internal/launch"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "haul:", err)
		}
		os.Exit(1)
	}
}

const usage = `usage:
  haul keygen FILE
  haul digest [--digest blake3|sha256] [--region SIZE] PATH
  haul recv --listen ADDR --out PATH [--key-file FILE [--encrypt]] [--via RELAY] [--wait D] [--json]
  haul send --to ADDR [--key-file FILE [--encrypt]] [--via RELAY] [--rate auto|R] [--workers N] [--scheme auto|sr|ec] [--k K --m M] [--chunk SIZE] [--region SIZE] [--probes N] [--json] PATH`

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprintln(stderr, usage)
		return flag.ErrHelp
	}
	switch args[0] {
	case "recv":
		o, err := parseRecv(args[1:], stderr)
		if err != nil {
			return err
		}
		stop, err := profile(o.cpuprof)
		if err != nil {
			return err
		}
		defer stop()
		return receive(ctx, o, stdout, stderr)
	case "send":
		o, err := parseSend(args[1:], stderr)
		if err != nil {
			return err
		}
		stop, err := profile(o.cpuprof)
		if err != nil {
			return err
		}
		defer stop()
		return send(ctx, o, stdout, stderr)
	case "keygen":
		return keygen(args[1:], stdout)
	case "digest":
		return digestCmd(args[1:], stdout, stderr)
	case "-h", "--help", "help":
		fmt.Fprintln(stdout, usage)
		return nil
	}
	fmt.Fprintln(stderr, usage)
	return fmt.Errorf("unknown command %q", args[0])
}

// profile starts a CPU profile into path ("" : none) and returns what
// stops it.
func profile(path string) (func(), error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// digestCmd prints PATH's digest as haul send computes it.
func digestCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("haul digest", flag.ContinueOnError)
	fs.SetOutput(stderr)
	label := fs.String("digest", "blake3", "blake3 or sha256, as haul send's --digest")
	regionFlag := fs.String("region", "", "haul send's --region (blake3 hashes each region; default as send's)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return errors.New("digest needs one PATH")
	}
	h, ok := hashingLabeled(*label)
	if !ok {
		return fmt.Errorf("--digest %q: want blake3 or sha256", *label)
	}
	var flagRegion int64
	if *regionFlag != "" {
		var err error
		if flagRegion, err = parseRegion(*regionFlag); err != nil {
			return err
		}
	}
	mm, size, closeFn, err := mapFile(fs.Arg(0))
	if err != nil {
		return err
	}
	defer closeFn()
	region, err := pickRegion(flagRegion, size)
	if err != nil {
		return err
	}
	sum, _ := h.file(mm, region)
	fmt.Fprintf(stdout, "%s  %s (%s, region %d)\n", sum, fs.Arg(0), h.label(), region)
	return nil
}

// keygen writes a new key file; it never overwrites one, which would lock
// out the other end holding the old key.
func keygen(args []string, stdout io.Writer) error {
	if len(args) != 1 || len(args[0]) == 0 || args[0][0] == '-' {
		return errors.New("keygen needs one FILE to write the new key to")
	}
	if err := launch.WriteKeyFile(args[0]); err != nil {
		return fmt.Errorf("keygen: %w (an existing key file is never overwritten)", err)
	}
	fmt.Fprintf(stdout, "haul: wrote a new key to %s (readable by you only); give both ends a copy as --key-file\n", args[0])
	return nil
}
