// Command quicpeer moves a file over QUIC (quic-go, one stream), for
// side-by-side figures with haul through the same link emulator: it is
// the peer issue 22 measures haul against, and a tool only. It lives in
// a module of its own so that quic-go never enters the library's
// dependency graph.
//
//	quicpeer recv --listen ADDR --out PATH [--json]
//	quicpeer send --to ADDR [--via RELAY] [--json] PATH
//
// The receiver makes a self-signed certificate at start, and the sender
// does not check it: the figures are about moving bytes, not about who
// is at the other end. The sender hashes the file first (SHA-256, not
// timed, as haul hashes before its clock starts), then times from the
// handshake's end to the receiver's reply, which is the SHA-256 of what
// it wrote: the transfer is checked end to end as haul's is. --via sends
// to a relay (linkem's side A; give linkem --peer-b the receiver's
// address, since a QUIC server speaks only when spoken to).
package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/big"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/quic-go/quic-go"
)

const alpn = "rvma-quicpeer"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "quicpeer:", err)
		}
		os.Exit(1)
	}
}

const usage = `usage:
  quicpeer recv --listen ADDR --out PATH [--json]
  quicpeer send --to ADDR [--via RELAY] [--json] PATH`

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprintln(stderr, usage)
		return flag.ErrHelp
	}
	fs := flag.NewFlagSet("quicpeer "+args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "print the report as one JSON line")
	switch args[0] {
	case "recv":
		listen := fs.String("listen", "", "UDP host:port to listen on")
		out := fs.String("out", "", "file to write")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if *listen == "" || *out == "" || fs.NArg() != 0 {
			return errors.New("recv needs --listen ADDR and --out PATH")
		}
		return receive(ctx, *listen, *out, *asJSON, stdout)
	case "send":
		to := fs.String("to", "", "the receiver's UDP host:port")
		via := fs.String("via", "", "send to this relay instead (linkem's side A)")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if *to == "" || fs.NArg() != 1 {
			return errors.New("send needs --to ADDR and one PATH")
		}
		addr := *to
		if *via != "" {
			addr = *via
		}
		return send(ctx, addr, fs.Arg(0), *asJSON, stdout)
	}
	fmt.Fprintln(stderr, usage)
	return fmt.Errorf("unknown command %q", args[0])
}

// config lets flow control cover a long fat path (quic-go's default
// windows, 6 and 15 MiB, would cap 100 ms at about 500 Mbit/s): the
// figures are then of its congestion control and loss recovery.
func config() *quic.Config {
	return &quic.Config{
		MaxStreamReceiveWindow:     256 << 20,
		MaxConnectionReceiveWindow: 256 << 20,
		MaxIdleTimeout:             30 * time.Second,
		KeepAlivePeriod:            time.Second,
	}
}

// report is what both ends print.
type report struct {
	Bytes   int64   `json:"bytes"`
	Seconds float64 `json:"seconds"`
	Gbps    float64 `json:"gbps"`
	SHA256  string  `json:"sha256"`
	OK      bool    `json:"ok"`
}

func (r report) print(w io.Writer, asJSON bool, verb string) {
	if asJSON {
		b, _ := json.Marshal(r)
		fmt.Fprintf(w, "%s\n", b)
		return
	}
	fmt.Fprintf(w, "quicpeer: %s %d bytes in %.3fs, %.3f Gbit/s; sha256 %s ok=%v\n", verb, r.Bytes, r.Seconds, r.Gbps, r.SHA256, r.OK)
}

func receive(ctx context.Context, listen, out string, asJSON bool, stdout io.Writer) error {
	cert, err := selfSigned()
	if err != nil {
		return err
	}
	ln, err := quic.ListenAddr(listen, &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{alpn}}, config())
	if err != nil {
		return err
	}
	defer ln.Close()
	conn, err := ln.Accept(ctx)
	if err != nil {
		return err
	}
	defer conn.CloseWithError(0, "")
	st, err := conn.AcceptStream(ctx)
	if err != nil {
		return err
	}
	var hdr [8]byte
	if _, err := io.ReadFull(st, hdr[:]); err != nil {
		return fmt.Errorf("the size: %w", err)
	}
	size := int64(binary.BigEndian.Uint64(hdr[:]))
	start := time.Now()
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.CopyBuffer(io.MultiWriter(f, h), io.LimitReader(st, size), make([]byte, 1<<20))
	if err != nil {
		return err
	}
	if n != size {
		return fmt.Errorf("got %d of %d bytes", n, size)
	}
	sum := h.Sum(nil)
	if _, err := st.Write(sum); err != nil {
		return err
	}
	st.Close()
	// Wait for the sender to close: the reply must reach it.
	select {
	case <-conn.Context().Done():
	case <-time.After(10 * time.Second):
	case <-ctx.Done():
	}
	el := time.Since(start)
	report{Bytes: n, Seconds: el.Seconds(), Gbps: float64(n) * 8 / el.Seconds() / 1e9, SHA256: hex.EncodeToString(sum), OK: true}.print(stdout, asJSON, "received")
	return nil
}

func send(ctx context.Context, addr, path string, asJSON bool, stdout io.Writer) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	h := sha256.New()
	size, err := io.Copy(h, f)
	if err != nil {
		return err
	}
	want := h.Sum(nil)
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	conn, err := quic.DialAddr(dctx, addr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{alpn}}, config())
	cancel()
	if err != nil {
		return err
	}
	defer conn.CloseWithError(0, "")
	st, err := conn.OpenStreamSync(ctx)
	if err != nil {
		return err
	}
	start := time.Now()
	var hdr [8]byte
	binary.BigEndian.PutUint64(hdr[:], uint64(size))
	if _, err := st.Write(hdr[:]); err != nil {
		return err
	}
	if _, err := io.CopyBuffer(st, f, make([]byte, 1<<20)); err != nil {
		return err
	}
	st.Close()
	got := make([]byte, sha256.Size)
	if _, err := io.ReadFull(st, got); err != nil {
		return fmt.Errorf("the receiver's reply: %w", err)
	}
	el := time.Since(start)
	r := report{Bytes: size, Seconds: el.Seconds(), Gbps: float64(size) * 8 / el.Seconds() / 1e9, SHA256: hex.EncodeToString(want),
		OK: string(got) == string(want)}
	r.print(stdout, asJSON, "sent")
	if !r.OK {
		return errors.New("sha256 mismatch")
	}
	return nil
}

// selfSigned makes a certificate for this run only.
func selfSigned() (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		DNSNames: []string{"quicpeer"}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}
