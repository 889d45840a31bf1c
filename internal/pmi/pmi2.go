package pmi

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// PMI-2's wire protocol, as MPICH's PMI-2 client and Slurm's pmi2 plugin
// speak it:
//
// The session opens with PMI-1's init line, "cmd=init pmi_version=2
// pmi_subversion=0\n", answered by a line "cmd=response_to_init
// pmi_version=2 pmi_subversion=0 rc=0" (Slurm puts rc first; a server that
// speaks PMI-1 only answers pmi_version=1).
//
// Every later message, either way, is a 6-character decimal length
// (left-aligned and space-padded by MPICH's client and by Slurm,
// right-aligned by Hydra: both are read) followed by that many bytes of
// "cmd=NAME;key=value;...;". A ';' inside a value is doubled. Replies
// carry rc (0 on success) and, with a nonzero rc, an errmsg.
//
//	fullinit;pmirank=R;pmijobid=J;threaded=FALSE  -> fullinit-response;rc;rank;size;appnum;[spawner-jobid]
//	kvs-put;key=K;value=V                         -> kvs-put-response;rc
//	kvs-fence                                     -> kvs-fence-response;rc   (once every rank has entered)
//	kvs-get;srcid=-1;key=K                        -> kvs-get-response;rc;found=TRUE|FALSE;[value]
//	finalize                                      -> finalize-response;rc
const (
	// FrameLenSize is the width of a message's length field.
	FrameLenSize = 6
	// MaxFrame bounds a message's length (the field's six digits).
	MaxFrame = 999999
	// MaxKeyLen and MaxValLen bound keys and values (PMI2_MAX_KEYLEN
	// and PMI2_MAX_VALLEN: Hydra truncates longer values).
	MaxKeyLen = 64
	MaxValLen = 1024
)

// ServerError is a reply with a nonzero rc.
type ServerError struct {
	Cmd string // the reply's command, such as kvs-put-response
	RC  int
	Msg string // errmsg, if the server gave one
}

func (e *ServerError) Error() string {
	msg := e.Msg
	if msg == "" {
		msg = "no errmsg"
	}
	return fmt.Sprintf("pmi: %s: rc=%d: %s", e.Cmd, e.RC, msg)
}

// Client2 talks PMI-2 over one connection.
type Client2 struct {
	c      *conn
	rank   int
	size   int
	appnum int
}

// Identity is what a process tells a PMI-2 server about itself in
// fullinit (each field is left out when empty).
type Identity struct {
	PMIRank string // pmirank: PMI_ID, else PMI_RANK
	JobID   string // pmijobid: PMI_JOBID (Slurm sets it)
}

// New2 opens a PMI-2 session over rw: the init line, then fullinit. It
// owns rw from then on, and closes it on failure.
func New2(ctx context.Context, rw io.ReadWriteCloser, id Identity) (*Client2, error) {
	c := newConn(rw)
	m, err := initLine(ctx, c, 2, 0)
	if err != nil {
		return nil, err
	}
	if err := want2(m); err != nil {
		c.breakWith(err)
		return nil, err
	}
	return fullinit(ctx, c, id)
}

// initLine sends PMI-1's init line asking for version.subversion and
// returns the reply's fields (rc unchecked).
func initLine(ctx context.Context, c *conn, version, subversion int) (map[string]string, error) {
	req := fmt.Sprintf("cmd=init pmi_version=%d pmi_subversion=%d\n", version, subversion)
	line, err := c.exchange(ctx, "init", []byte(req), readLine)
	if err != nil {
		return nil, err
	}
	m := Parse(line)
	if m["cmd"] != "response_to_init" {
		err := fmt.Errorf("%w: sent %q, got %q", ErrProtocol, strings.TrimSpace(req), strings.TrimSpace(line))
		c.breakWith(err)
		return nil, err
	}
	return m, nil
}

// want2 checks that an init reply accepts PMI-2.
func want2(m map[string]string) error {
	if m["pmi_version"] != "2" {
		return fmt.Errorf("%w: asked for PMI version 2, the server answered version %q (rc=%s): it speaks PMI-1 only",
			ErrProtocol, m["pmi_version"], m["rc"])
	}
	if m["rc"] != "0" {
		return fmt.Errorf("pmi: the server refused PMI version 2: rc=%q", m["rc"])
	}
	return nil
}

func fullinit(ctx context.Context, c *conn, id Identity) (*Client2, error) {
	cl := &Client2{c: c}
	fail := func(err error) (*Client2, error) {
		c.breakWith(err)
		return nil, err
	}
	var kv []string
	if id.PMIRank != "" {
		kv = append(kv, "pmirank", id.PMIRank)
	}
	if id.JobID != "" {
		kv = append(kv, "pmijobid", id.JobID)
	}
	kv = append(kv, "threaded", "FALSE")
	m, err := cl.do(ctx, "fullinit", kv...)
	if err != nil {
		return fail(err)
	}
	for _, f := range []struct {
		key string
		v   *int
	}{{"rank", &cl.rank}, {"size", &cl.size}, {"appnum", &cl.appnum}} {
		s, ok := m[f.key]
		if !ok {
			return fail(fmt.Errorf("%w: fullinit-response without %s", ErrProtocol, f.key))
		}
		if *f.v, err = parseInt("fullinit-response", f.key, s); err != nil {
			return fail(err)
		}
	}
	if cl.size < 1 || cl.rank < 0 || cl.rank >= cl.size {
		return fail(fmt.Errorf("%w: fullinit-response gives rank %d of %d", ErrProtocol, cl.rank, cl.size))
	}
	return cl, nil
}

// Rank returns the process's rank.
func (c *Client2) Rank() int { return c.rank }

// Size returns the job's size.
func (c *Client2) Size() int { return c.size }

// AppNum returns the process's application number (its executable's
// index on an MPMD command line; Slurm says -1).
func (c *Client2) AppNum() int { return c.appnum }

// Version returns 2.
func (c *Client2) Version() int { return 2 }

// do sends cmd with its key-value pairs and reads the reply, which must
// be cmd-response with rc=0 (else a *ServerError, with the fields).
func (c *Client2) do(ctx context.Context, cmd string, kv ...string) (map[string]string, error) {
	req, err := Encode2(cmd, kv...)
	if err != nil {
		return nil, err
	}
	body, err := c.c.exchange(ctx, cmd, req, ReadFrame2)
	if err != nil {
		return nil, err
	}
	got, m, err := Parse2(body)
	if err != nil {
		return nil, err
	}
	want := cmd + "-response"
	if got != want {
		return nil, fmt.Errorf("%w: sent %s, got %q", ErrProtocol, cmd, body)
	}
	rcs, ok := m["rc"]
	if !ok {
		return nil, fmt.Errorf("%w: %s without rc", ErrProtocol, want)
	}
	rc, err := parseInt(want, "rc", rcs)
	if err != nil {
		return nil, err
	}
	if rc != 0 {
		return m, &ServerError{Cmd: want, RC: rc, Msg: m["errmsg"]}
	}
	return m, nil
}

// checkKey refuses what a PMI-2 key cannot be: empty, over MaxKeyLen, or
// holding '=', ';', whitespace or control characters.
func checkKey(key string) error {
	if key == "" || len(key) > MaxKeyLen {
		return fmt.Errorf("pmi: key %q: want 1 to %d bytes", key, MaxKeyLen)
	}
	for _, b := range []byte(key) {
		if b <= ' ' || b == '=' || b == ';' || b == 0x7f {
			return fmt.Errorf("pmi: key %q holds %q; keys hold no '=', ';', whitespace or control characters", key, b)
		}
	}
	return nil
}

// Put implements kvs.Store. A value is 1 to MaxValLen bytes, no NUL; a
// ';' in it travels doubled, as PMI-2 defines, but Slurm's pmi2 plugin
// and Hydra (MPICH 4) do not undo the doubling: they cut the value at
// its first ';'.
func (c *Client2) Put(ctx context.Context, key, value string) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if value == "" || len(value) > MaxValLen || strings.IndexByte(value, 0) >= 0 {
		return fmt.Errorf("pmi: value for %s: want 1 to %d bytes without NUL, got %d", key, MaxValLen, len(value))
	}
	_, err := c.do(ctx, "kvs-put", "key", key, "value", value)
	return err
}

// Get implements kvs.Store. PMI-2's kvs-get answers found=FALSE for a key
// not there yet: Get asks again until it is, or ctx ends. (It names no
// jobid, which is optional and means the process's own job: MPICH 4's
// parser refuses an empty value.)
func (c *Client2) Get(ctx context.Context, key string) (string, error) {
	if err := checkKey(key); err != nil {
		return "", err
	}
	for delay := time.Millisecond; ; delay = min(2*delay, maxPoll) {
		m, err := c.do(ctx, "kvs-get", "srcid", "-1", "key", key)
		if err != nil {
			return "", err
		}
		switch m["found"] {
		case "TRUE":
			v, ok := m["value"]
			if !ok {
				return "", fmt.Errorf("%w: kvs-get-response found=TRUE without value", ErrProtocol)
			}
			return v, nil
		case "FALSE":
		default:
			return "", fmt.Errorf("%w: kvs-get-response with found=%q", ErrProtocol, m["found"])
		}
		if err := sleep(ctx, delay); err != nil {
			return "", fmt.Errorf("pmi: get %s: %w", key, err)
		}
	}
}

// Barrier implements kvs.Store with kvs-fence, which also makes the keys
// put before it visible. If ctx ends first, the fence stays entered: it
// goes on in the background for Grace, then is cut.
func (c *Client2) Barrier(ctx context.Context) error {
	_, err := c.do(ctx, "kvs-fence")
	return err
}

// Close finalizes the session and closes the connection.
func (c *Client2) Close() error {
	return c.c.close(func(ctx context.Context) error {
		_, err := c.do(ctx, "finalize")
		return err
	})
}

// Encode2 frames a PMI-2 message: the length, then cmd=NAME; and each
// key=value; of kv (pairs), a ';' in a value doubled. Keys are not
// checked beyond holding no '=' or ';'.
func Encode2(cmd string, kv ...string) ([]byte, error) {
	if len(kv)%2 != 0 {
		return nil, fmt.Errorf("pmi: %s: odd number of key-value strings", cmd)
	}
	var b strings.Builder
	b.WriteString("      cmd=")
	b.WriteString(escape2(cmd))
	b.WriteByte(';')
	for i := 0; i < len(kv); i += 2 {
		if kv[i] == "" || strings.ContainsAny(kv[i], "=;") {
			return nil, fmt.Errorf("pmi: %s: bad key %q", cmd, kv[i])
		}
		b.WriteString(kv[i])
		b.WriteByte('=')
		b.WriteString(escape2(kv[i+1]))
		b.WriteByte(';')
	}
	msg := []byte(b.String())
	n := len(msg) - FrameLenSize
	if n > MaxFrame {
		return nil, fmt.Errorf("pmi: %s: a message of %d bytes; at most %d", cmd, n, MaxFrame)
	}
	copy(msg, strconv.Itoa(n)) // left-aligned, space-padded, as MPICH's client does
	return msg, nil
}

func escape2(v string) string {
	return strings.ReplaceAll(v, ";", ";;")
}

// ReadFrame2 reads one PMI-2 message and returns what follows its length.
func ReadFrame2(r *bufio.Reader) (string, error) {
	var hdr [FrameLenSize]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return "", err
	}
	n, err := ParseLen2(hdr[:])
	if err != nil {
		return "", err
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return "", err
	}
	return string(body), nil
}

// ParseLen2 reads a message's length field: decimal digits, padded with
// spaces on either side.
func ParseLen2(hdr []byte) (int, error) {
	s := strings.Trim(string(hdr), " ")
	n, err := strconv.Atoi(s)
	if err != nil || s == "" || s[0] == '+' || s[0] == '-' || n < 1 {
		return 0, fmt.Errorf("%w: length field %q is not a positive decimal", ErrProtocol, hdr)
	}
	return n, nil
}

// Parse2 splits a PMI-2 message (what follows the length) into its
// command and its fields: "cmd=NAME;" first, then key=value; pairs, each
// ended by a single ';' (";;" inside a value is a ';'). A key is not
// empty and holds no ';'; the first of repeated keys counts.
func Parse2(body string) (cmd string, fields map[string]string, err error) {
	fields = map[string]string{}
	first := true
	for rest := body; rest != ""; {
		eq := strings.IndexByte(rest, '=')
		if eq < 0 {
			return "", nil, fmt.Errorf("%w: %q: a field without '='", ErrProtocol, body)
		}
		key := rest[:eq]
		if key == "" || strings.IndexByte(key, ';') >= 0 {
			return "", nil, fmt.Errorf("%w: %q: bad key %q", ErrProtocol, body, key)
		}
		rest = rest[eq+1:]
		var v strings.Builder
		ended := false
		for i := 0; i < len(rest); i++ {
			if rest[i] != ';' {
				v.WriteByte(rest[i])
				continue
			}
			if i+1 < len(rest) && rest[i+1] == ';' {
				v.WriteByte(';')
				i++
				continue
			}
			rest, ended = rest[i+1:], true
			break
		}
		if !ended {
			return "", nil, fmt.Errorf("%w: %q: value of %s not ended by ';'", ErrProtocol, body, key)
		}
		if first {
			if key != "cmd" {
				return "", nil, fmt.Errorf("%w: %q does not begin with cmd=", ErrProtocol, body)
			}
			cmd, first = v.String(), false
			continue
		}
		if _, dup := fields[key]; !dup {
			fields[key] = v.String()
		}
	}
	if first {
		return "", nil, fmt.Errorf("%w: empty message", ErrProtocol)
	}
	return cmd, fields, nil
}
