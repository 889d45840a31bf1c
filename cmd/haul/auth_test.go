package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/internal/launch"
	"github.com/rvma/rvma/internal/sdrwire"
	"github.com/rvma/rvma/verbs"
	"github.com/rvma/rvma/verbs/cm"
)

// keyFile writes a new key file in dir.
func keyFile(t *testing.T, dir, name string) string {
	p := filepath.Join(dir, name)
	require.NoError(t, launch.WriteKeyFile(p))
	return p
}

// rcDialer dials addr with an RC QP (haul's receiver wants UC, so its
// setup fails after the request was admitted) and private data pd.
func rcDialer(t *testing.T, addr string, key, pd []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dev, err := verbs.Open(ctx, "udp://127.0.0.1:0", nil)
	require.NoError(t, err)
	defer dev.Close()
	pdom, err := dev.AllocPD()
	require.NoError(t, err)
	cq, err := dev.CreateCQ(verbs.CQConfig{})
	require.NoError(t, err)
	qp, err := pdom.CreateQP(verbs.QPConfig{Type: verbs.RC, SendCQ: cq})
	require.NoError(t, err)
	_, err = cm.Dial(ctx, addr, qp, &cm.Config{Key: key, PrivateData: pd})
	return err
}

// tamperingProxy relays TCP connections to target, flipping a byte early
// in the first reply (inside what its MAC covers: the nonce), as a
// man in the middle would. It returns the proxy's address.
func tamperingProxy(t *testing.T, target string) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				s, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer s.Close()
				go func() {
					io.Copy(s, c)
					s.Close() // the dialer gave up: so does its relay
				}()
				buf := make([]byte, 4096)
				n, err := io.ReadAtLeast(s, buf, 13)
				if err != nil {
					return
				}
				buf[12] ^= 1
				c.Write(buf[:n])
				io.Copy(c, s)
			}()
		}
	}()
	return ln.Addr().String()
}

// A receiver with a key refuses every sender that does not hold it, and
// a silent connection, a sender whose setup fails and a malformed offer
// leave it waiting: then the real sender's transfer completes intact.
func TestKeyedReceiverRefusesOutsiders(t *testing.T) {
	f := newFixture(t)
	key, other := keyFile(t, f.dir, "key"), keyFile(t, f.dir, "other")
	k, err := launch.ReadKeyFile(key)
	require.NoError(t, err)
	ctx := context.Background()
	r := start(ctx, f.recvArgs("--key-file", key)...)
	waitListening(t, f.addr)

	// A silent connection stays open through everything that follows.
	silent, err := net.Dial("tcp", f.addr)
	require.NoError(t, err)
	defer silent.Close()

	// (a) No key, (b) another key: refused by the CM, with the reason.
	err = f.sender(ctx).wait(t)
	require.ErrorContains(t, err, "refused")
	require.ErrorContains(t, err, "it requires a key")
	err = f.sender(ctx, "--key-file", other).wait(t)
	require.ErrorContains(t, err, "the keys differ")
	err = f.sender(ctx, "--key-file", other, "--encrypt").wait(t)
	require.ErrorContains(t, err, "the keys differ")
	_, err = os.Stat(partPath(f.out))
	require.ErrorIs(t, err, os.ErrNotExist, "no refused sender got as far as the output")

	// Holders of the key that the receiver cannot serve: a malformed
	// offer, and a sender whose setup fails (its offer claims the output
	// for a file of another size, until its setup fails).
	err = rcDialer(t, f.addr, k, []byte("not an offer"))
	require.ErrorIs(t, err, cm.ErrRejected)
	require.ErrorContains(t, err, "malformed offer")
	bogus := offer{Name: "x", Size: 5 << 20, Digest: sha256Hex([]byte("x")), Region: 1 << 20, Manifest: sha256Hex(nil), K: 32, Wire: sdrwire.Version, Hashing: hashChain}
	err = rcDialer(t, f.addr, k, mustJSON(bogus))
	require.ErrorIs(t, err, cm.ErrRejected)
	require.ErrorContains(t, err, "QP type")

	// (c) A receiver impersonated by a man in the middle: the sender
	// refuses it.
	proxy := tamperingProxy(t, f.addr)
	err = start(ctx, "send", "--to", proxy, "--via", f.l.AddrA().String(), "--key-file", key, f.in).wait(t)
	require.ErrorIs(t, err, cm.ErrAuth)
	require.ErrorContains(t, err, "could not prove that it holds the key")

	rep := f.requireDone(t, f.sender(ctx, "--key-file", key), r)
	require.Zero(t, rep.Resumed)
	require.False(t, rep.Encrypted)
	require.NotContains(t, r.stderr.String(), "any sender")
	require.Contains(t, r.stderr.String(), "malformed offer")
	require.Contains(t, r.stderr.String(), "connection setup failed")
}

// A sender with a key refuses a receiver that has none (it cannot prove
// the key), and that receiver warns that it accepts anyone.
func TestKeyedSenderRefusesReceiverWithoutKey(t *testing.T) {
	f := newFixture(t)
	key := keyFile(t, f.dir, "key")
	ctx := context.Background()
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	r := start(rctx, f.recvArgs()...)
	waitListening(t, f.addr)
	err := f.sender(ctx, "--key-file", key).wait(t)
	require.ErrorContains(t, err, "refused")
	require.ErrorContains(t, err, "without --key-file")
	stop()
	require.Error(t, r.wait(t))
	require.Contains(t, r.stderr.String(), "warning: no --key-file: any sender that reaches "+f.addr+" is accepted")
	_, err = os.Stat(partPath(f.out))
	require.ErrorIs(t, err, os.ErrNotExist)
}

func TestKeygen(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "k")
	var out bytes.Buffer
	require.NoError(t, run(context.Background(), []string{"keygen", p}, &out, io.Discard))
	require.Contains(t, out.String(), p)
	fi, err := os.Stat(p)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	k, err := launch.ReadKeyFile(p)
	require.NoError(t, err)
	require.Len(t, k, launch.KeySize)

	err = run(context.Background(), []string{"keygen", p}, io.Discard, io.Discard)
	require.ErrorIs(t, err, os.ErrExist, "never overwrites a key")
	k2, err := launch.ReadKeyFile(p)
	require.NoError(t, err)
	require.Equal(t, k, k2)
	require.Error(t, run(context.Background(), []string{"keygen"}, io.Discard, io.Discard))

	// A key others can read is refused, and --encrypt needs a key.
	require.NoError(t, os.Chmod(p, 0o644))
	_, err = parseSend([]string{"--to", "127.0.0.1:1", "--key-file", p, "x"}, io.Discard)
	require.ErrorContains(t, err, "readable by its owner only")
	_, err = parseSend([]string{"--to", "127.0.0.1:1", "--encrypt", "x"}, io.Discard)
	require.ErrorContains(t, err, "--encrypt needs --key-file")
	_, err = parseRecv([]string{"--listen", "127.0.0.1:1", "--out", "x", "--encrypt"}, io.Discard)
	require.ErrorContains(t, err, "--encrypt needs --key-file")
}
