package cm

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/verbs"
)

func TestMessageRoundTrip(t *testing.T) {
	ep := verbs.Endpoint{GID: netip.MustParseAddrPort("[fd00::1]:4791"), QPN: 0x123456, PSN: 0xABCDE, MTU: 4096, Secret: 0xDEADBEEF12345}
	ep4 := verbs.Endpoint{GID: netip.MustParseAddrPort("127.0.0.1:9"), QPN: 2, PSN: 0, MTU: 256, Secret: 1}
	cases := []struct {
		name string
		m    message
	}{
		{"REQ", message{typ: msgREQ, ep: ep, qpType: verbs.RC, private: []byte("hello")}},
		{"REP IPv4 UC", message{typ: msgREP, ep: ep4, qpType: verbs.UC, private: []byte{}}},
		{"RTU", message{typ: msgRTU}},
		{"REJ", message{typ: msgREJ, reason: "no thanks"}},
		{"REQ authenticated", message{typ: msgREQ, flags: flagAuth, nonce: [16]byte{1, 2, 3}, ep: ep, qpType: verbs.RC, private: []byte("hi"), mac: bytes.Repeat([]byte{7}, macLen)}},
		{"RTU authenticated", message{typ: msgRTU, flags: flagAuth, mac: bytes.Repeat([]byte{9}, macLen)}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := appendMessage(nil, &c.m)
			got, err := readMessage(bytes.NewReader(b))
			require.NoError(t, err)
			require.Equal(t, b, got.raw)
			got.raw = nil
			if got.private == nil && c.m.private != nil {
				got.private = []byte{}
			}
			if len(c.m.private) == 0 {
				got.private, c.m.private = nil, nil
			}
			require.Equal(t, c.m, *got)
		})
	}
}

func TestMalformed(t *testing.T) {
	good := appendMessage(nil, &message{typ: msgREQ, ep: verbs.Endpoint{GID: netip.MustParseAddrPort("127.0.0.1:1"), QPN: 5, MTU: 1024}, qpType: verbs.RC})
	cases := map[string][]byte{
		"empty":           {},
		"bad magic":       append([]byte("XVCM"), good[4:]...),
		"bad version":     append(append([]byte{}, good[:4]...), append([]byte{9}, good[5:]...)...),
		"truncated":       good[:len(good)-3],
		"unknown type":    {'R', 'V', 'C', 'M', version, 99, 0, 0},
		"RTU with body":   {'R', 'V', 'C', 'M', version, msgRTU, 0, 2, 0, 0},
		"RTU short MAC":   {'R', 'V', 'C', 'M', version, msgRTU, 0, 2, flagAuth, 0},
		"unknown flags":   {'R', 'V', 'C', 'M', version, msgRTU, 0, 1, 2},
		"oversized body":  {'R', 'V', 'C', 'M', version, msgREQ, 0xFF, 0xFF},
		"old version":     {'R', 'V', 'C', 'M', 1, msgRTU, 0, 0},
		"zero QPN":        appendMessage(nil, &message{typ: msgREQ, ep: verbs.Endpoint{GID: netip.MustParseAddrPort("127.0.0.1:1"), MTU: 1024}, qpType: verbs.RC}),
		"bad QP type":     appendMessage(nil, &message{typ: msgREQ, ep: verbs.Endpoint{GID: netip.MustParseAddrPort("127.0.0.1:1"), QPN: 3, MTU: 1024}, qpType: 9}),
		"tiny MTU":        appendMessage(nil, &message{typ: msgREQ, ep: verbs.Endpoint{GID: netip.MustParseAddrPort("127.0.0.1:1"), QPN: 3, MTU: 10}, qpType: verbs.RC}),
		"private overrun": func() []byte { b := bytes.Clone(good); b[len(b)-1] = 9; return b }(),
	}
	for name, b := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := readMessage(bytes.NewReader(b))
			require.Error(t, err)
		})
	}
}

func FuzzMessage(f *testing.F) {
	f.Add(appendMessage(nil, &message{typ: msgREQ, ep: verbs.Endpoint{GID: netip.MustParseAddrPort("127.0.0.1:1"), QPN: 5, MTU: 1024, Secret: 7}, qpType: verbs.RC, private: []byte("x")}))
	f.Add(appendMessage(nil, &message{typ: msgREJ, reason: "r"}))
	f.Add(appendMessage(nil, &message{typ: msgRTU}))
	f.Add(seal([]byte("0123456789abcdef"), labelRTU, &message{typ: msgRTU}))
	f.Add(seal([]byte("0123456789abcdef"), labelREQ, &message{typ: msgREQ, ep: verbs.Endpoint{GID: netip.MustParseAddrPort("127.0.0.1:1"), QPN: 5, MTU: 1024}, qpType: verbs.UC}))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := readMessage(bytes.NewReader(b))
		if err != nil {
			return
		}
		// What decodes re-encodes to the same bytes.
		again := appendMessage(nil, m)
		require.Equal(t, b[:len(again)], again)
	})
}

func newQP(t *testing.T, d *verbs.Device, typ verbs.QPType) *verbs.QP {
	pd, err := d.AllocPD()
	require.NoError(t, err)
	cq, err := d.CreateCQ(verbs.CQConfig{})
	require.NoError(t, err)
	qp, err := pd.CreateQP(verbs.QPConfig{Type: typ, SendCQ: cq})
	require.NoError(t, err)
	return qp
}

func openPair(t *testing.T) (*verbs.Device, *verbs.Device) {
	name := "loop://cm-" + t.Name()
	a, err := verbs.Open(context.Background(), name, nil)
	require.NoError(t, err)
	b, err := verbs.Open(context.Background(), name, nil)
	require.NoError(t, err)
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

func TestDialAccept(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	da, db := openPair(t)
	l, err := Listen(ctx, "127.0.0.1:0", nil)
	require.NoError(t, err)
	defer l.Close()
	server := newQP(t, db, verbs.RC)
	done := make(chan error, 1)
	go func() {
		req, err := l.Accept(ctx)
		if err != nil {
			done <- err
			return
		}
		if string(req.PrivateData()) != "from dialer" {
			done <- errors.New("private data lost")
			return
		}
		done <- req.Accept(ctx, server, &Config{PrivateData: []byte("from listener")})
	}()
	client := newQP(t, da, verbs.RC)
	res, err := Dial(ctx, l.Addr().String(), client, &Config{PrivateData: []byte("from dialer")})
	require.NoError(t, err)
	require.NoError(t, <-done)
	require.Equal(t, "from listener", string(res.PrivateData))
	require.Equal(t, server.Endpoint(), res.Remote)
	require.Equal(t, verbs.StateReadyToSend, client.State())
	require.Equal(t, verbs.StateReadyToSend, server.State())
	require.Equal(t, client.Endpoint(), server.Remote())
}

func TestReject(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	da, db := openPair(t)
	l, err := Listen(ctx, "127.0.0.1:0", nil)
	require.NoError(t, err)
	defer l.Close()
	go func() {
		req, err := l.Accept(ctx)
		if err == nil {
			req.Accept(ctx, newQP(t, db, verbs.UC), nil) // type mismatch: rejected
		}
		req, err = l.Accept(ctx)
		if err == nil {
			req.Reject("go away")
		}
	}()
	_, err = Dial(ctx, l.Addr().String(), newQP(t, da, verbs.RC), nil)
	var rej *RejectError
	require.ErrorAs(t, err, &rej)
	require.Contains(t, rej.Reason, "QP type")
	_, err = Dial(ctx, l.Addr().String(), newQP(t, da, verbs.RC), nil)
	require.ErrorIs(t, err, ErrRejected)
	require.ErrorAs(t, err, &rej)
	require.Equal(t, "go away", rej.Reason)
}

func TestGarbageRequestIsSkipped(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	da, db := openPair(t)
	l, err := Listen(ctx, "127.0.0.1:0", nil)
	require.NoError(t, err)
	defer l.Close()
	c, err := net.Dial("tcp", l.Addr().String())
	require.NoError(t, err)
	c.Write([]byte("GET / HTTP/1.0\r\n\r\n"))
	go func() {
		qp := newQP(t, da, verbs.RC)
		Dial(ctx, l.Addr().String(), qp, nil)
	}()
	req, err := l.Accept(ctx)
	require.NoError(t, err, "the garbage connection is skipped, the real request accepted")
	require.NoError(t, req.Accept(ctx, newQP(t, db, verbs.RC), nil))
	reply := make([]byte, 64)
	n, _ := c.Read(reply)
	require.Contains(t, string(reply[:n]), "malformed", "the garbage sender got a rejection")
}

func TestContextCancel(t *testing.T) {
	da, _ := openPair(t)
	l, err := Listen(context.Background(), "127.0.0.1:0", nil)
	require.NoError(t, err)
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	// Nobody accepts: the dial blocks on the reply until the context ends.
	_, err = Dial(ctx, l.Addr().String(), newQP(t, da, verbs.RC), nil)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	ctx2, cancel2 := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel2()
	l2, _ := Listen(context.Background(), "127.0.0.1:0", nil)
	_, err = l2.Accept(ctx2)
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

// An MTU cap on one side only still gives both sides the same path MTU
// (a responder that expected bigger packets would refuse the requester's).
func TestOneSidedMTUCap(t *testing.T) {
	for _, tc := range []struct{ dial, accept, want int }{{1024, 0, 1024}, {0, 2048, 2048}, {4096, 1024, 1024}} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		da, db := openPair(t)
		l, err := Listen(ctx, "127.0.0.1:0", nil)
		require.NoError(t, err)
		server, client := newQP(t, db, verbs.RC), newQP(t, da, verbs.RC)
		done := make(chan error, 1)
		go func() {
			req, err := l.Accept(ctx)
			if err == nil {
				err = req.Accept(ctx, server, &Config{Connect: &verbs.ConnectConfig{MTU: tc.accept}})
			}
			done <- err
		}()
		_, err = Dial(ctx, l.Addr().String(), client, &Config{Connect: &verbs.ConnectConfig{MTU: tc.dial}})
		require.NoError(t, err)
		require.NoError(t, <-done)
		require.Equal(t, tc.want, client.PathMTU(), "%+v", tc)
		require.Equal(t, tc.want, server.PathMTU(), "%+v", tc)
		l.Close()
		cancel()
	}
}
