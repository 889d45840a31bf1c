package kvs

import (
	"bufio"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
)

const (
	minKey   = 16
	nonceLen = 16
	macLen   = sha256.Size
	tagLen   = 16 // bytes of a line's tag (32 hex digits)
	// Labels keep each HMAC to its one purpose.
	labelServer  = "rvma-kvs v1 server"
	labelClient  = "rvma-kvs v1 client"
	labelSession = "rvma-kvs v1 session"
)

// ErrAuth reports a failed authentication or a line whose tag is wrong.
var ErrAuth = errors.New("kvs: authentication failed")

func mac(key []byte, label string, parts ...[]byte) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(label))
	for _, p := range parts {
		h.Write(p) // fixed-size parts only: nonces
	}
	return h.Sum(nil)
}

func decodeHex(dst []byte, s string) bool {
	if hex.DecodedLen(len(s)) != len(dst) {
		return false
	}
	_, err := hex.Decode(dst, []byte(s))
	return err == nil
}

// session tags the lines of an authenticated connection: an HMAC under a
// key of the connection's own over the direction, the line's sequence
// number in that direction, and the line.
type session struct {
	key            []byte
	sendSeq, rcvSq uint64
}

func newSession(key []byte, nc, ns [nonceLen]byte) *session {
	return &session{key: mac(key, labelSession, nc[:], ns[:])}
}

func (s *session) tag(dir byte, seq uint64, line string) string {
	h := hmac.New(sha256.New, s.key)
	var b [9]byte
	b[0] = dir
	binary.BigEndian.PutUint64(b[1:], seq)
	h.Write(b[:])
	h.Write([]byte(line))
	return hex.EncodeToString(h.Sum(nil)[:tagLen])
}

// seal appends the tag of the next line sent in direction dir.
func (s *session) seal(dir byte, line string) string {
	t := s.tag(dir, s.sendSeq, line)
	s.sendSeq++
	return line + " " + t
}

// open checks and strips the tag of the next line received from direction
// dir.
func (s *session) open(dir byte, line string) (string, error) {
	body, t, ok := cutLast(line)
	want := s.tag(dir, s.rcvSq, body)
	s.rcvSq++
	if !ok || !hmac.Equal([]byte(t), []byte(want)) {
		return "", fmt.Errorf("%w: a line with a wrong tag", ErrAuth)
	}
	return body, nil
}

func cutLast(line string) (body, last string, ok bool) {
	i := strings.LastIndexByte(line, ' ')
	if i < 0 {
		return "", "", false
	}
	return line[:i], line[i+1:], true
}

// clientHandshake proves to the server that this client holds key, and
// checks the server's proof.
func clientHandshake(c net.Conn, sc *bufio.Scanner, key []byte) (*session, error) {
	var nc, ns [nonceLen]byte
	rand.Read(nc[:])
	if _, err := fmt.Fprintf(c, "auth %x\n", nc); err != nil {
		return nil, err
	}
	reply := func() ([]string, error) {
		if !sc.Scan() {
			if err := sc.Err(); err != nil {
				return nil, err
			}
			return nil, io.EOF
		}
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, "err "); ok {
			return nil, fmt.Errorf("%w: the server says: %s", ErrAuth, rest)
		}
		return strings.Fields(line), nil
	}
	f, err := reply()
	if err != nil {
		return nil, err
	}
	var ms [macLen]byte
	if len(f) != 3 || f[0] != "challenge" || !decodeHex(ns[:], f[1]) || !decodeHex(ms[:], f[2]) ||
		!hmac.Equal(ms[:], mac(key, labelServer, nc[:], ns[:])) {
		return nil, fmt.Errorf("%w: the server did not prove it holds the job's key", ErrAuth)
	}
	if _, err := fmt.Fprintf(c, "proof %x\n", mac(key, labelClient, nc[:], ns[:])); err != nil {
		return nil, err
	}
	if f, err = reply(); err != nil {
		return nil, err
	}
	if len(f) != 1 || f[0] != "ok" {
		return nil, fmt.Errorf("%w: unexpected reply %q", ErrAuth, strings.Join(f, " "))
	}
	return newSession(key, nc, ns), nil
}
