package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// A file crosses loopback over QUIC intact, and the sender's report says
// so. (The module does without testify: its one dependency is quic-go.)
func TestSendRecv(t *testing.T) {
	dir := t.TempDir()
	in, out := filepath.Join(dir, "in"), filepath.Join(dir, "out")
	want := make([]byte, 3<<20+7)
	rand.Read(want)
	if err := os.WriteFile(in, want, 0o644); err != nil {
		t.Fatal(err)
	}
	u, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	addr := u.LocalAddr().String()
	u.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := make(chan error, 1)
	var rout bytes.Buffer
	go func() { done <- run(ctx, []string{"recv", "--listen", addr, "--out", out, "--json"}, &rout, os.Stderr) }()
	var sout bytes.Buffer
	var serr error
	for range 50 { // until the receiver listens
		if serr = run(ctx, []string{"send", "--to", addr, "--json", in}, &sout, os.Stderr); serr == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if serr != nil {
		t.Fatal(serr)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var rep report
	if err := json.Unmarshal(sout.Bytes(), &rep); err != nil || !rep.OK || rep.Bytes != int64(len(want)) {
		t.Fatalf("report %q: %v", sout.String(), err)
	}
	got, err := os.ReadFile(out)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("the file differs (%v)", err)
	}
}
