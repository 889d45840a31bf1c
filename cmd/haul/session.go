package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/rvma/rvma/internal/launch"
	"github.com/rvma/rvma/internal/units"
	"github.com/rvma/rvma/reliability"
	"github.com/rvma/rvma/verbs"
)

type common struct {
	vias    []string // relay per path
	json    bool
	verbose bool
	chunk   int
	slots   int
	rates   []float64 // bytes/s per path (the sender's; one value for all)
	rate    float64   // bytes/s, all paths together
	auto    bool      // --rate auto (the sender's): a controller paces, and rate is the probe train's pace
	peerT   time.Duration
	keyFile string
	key     []byte // authenticates the CM's handshakes; nil: none
	encrypt bool   // sender: seal the payload; receiver: accept only senders that do
	cpuprof string // write a CPU profile of the run here
}

type recvOpts struct {
	common
	listen string
	out    string
	wait   time.Duration // for a sender to resume after the last went silent
	// stateHook, set by tests, wraps the state file's writes (to fail as
	// a full disk would).
	stateHook func(writeAt) writeAt
	// sealedHook, set by tests, sees each sealed region (region ≥ 0,
	// round 0) and repair round (region -1) before it is opened, to
	// tamper with it as an attacker on the path would.
	sealedHook func(round uint32, region int, sealed []byte)
	// chunkDelay, set by tests, slows the receiver down: it takes that
	// long over each chunk, as one that cannot keep up.
	chunkDelay time.Duration
	// noWindow, set by tests, turns flow control off (the receiver
	// advertises no window), to compare with it on.
	noWindow bool
}

type sendOpts struct {
	common
	to      string
	paths   int
	workers int
	path    string
	scheme  reliability.Scheme
	k, m    int
	region  int64
	probes  int
	hashing hashing
}

func commonFlags(fs *flag.FlagSet, c *common) (chunk, rate, via *string) {
	via = fs.String("via", "", "send the data path through this relay address (linkem's side facing this end); with several paths, one per path, comma-separated")
	fs.BoolVar(&c.json, "json", false, "print the final report as one JSON line")
	fs.BoolVar(&c.verbose, "v", false, "print each message's counters (sender) or the device's (receiver)")
	chunk = fs.String("chunk", "", "chunk size, a multiple of the MTU (default one MTU, 4096)")
	rate = fs.String("rate", "auto", "injection rate: auto (found from the path's delivery rate and round trip), or per path as tc spells it (500mbit), or one per path, comma-separated")
	fs.IntVar(&c.slots, "slots", 8, "messages in flight (a power of two, 1..64)")
	fs.DurationVar(&c.peerT, "peer-timeout", 10*time.Second, "give up when the peer is silent this long")
	fs.StringVar(&c.cpuprof, "cpuprofile", "", "write a CPU profile of the run to this file (go tool pprof reads it)")
	fs.StringVar(&c.keyFile, "key-file", "", "the pre-shared key, made by haul keygen (the file must be readable by its owner only): both ends authenticate the connection setup with it, and refuse a peer without it")
	return chunk, rate, via
}

// finish parses the common flags for paths paths and relays relays (the
// receiver learns their counts from the sender: 0 skips the checks).
func (c *common) finish(chunk, rate, via string, paths, relays int) error {
	if c.keyFile != "" {
		k, err := launch.ReadKeyFile(c.keyFile)
		if err != nil {
			return fmt.Errorf("--key-file: %w", err)
		}
		c.key = k
	}
	if c.encrypt && c.key == nil {
		return errors.New("--encrypt needs --key-file: the payload's key is derived from it")
	}
	if chunk != "" {
		n, err := units.ParseSize(chunk)
		if err != nil {
			return err
		}
		c.chunk = int(n)
	}
	if via != "" {
		c.vias = strings.Split(via, ",")
		if relays > 0 && len(c.vias) != relays {
			return fmt.Errorf("--via: %d relays for %d paths (one for each path of each worker)", len(c.vias), relays)
		}
	}
	c.auto = rate == "" || rate == "auto"
	rates := []string{"1gbit"}
	if !c.auto {
		rates = strings.Split(rate, ",")
	}
	if paths > 0 && len(rates) != 1 && len(rates) != paths {
		return fmt.Errorf("--rate: %d rates for %d paths", len(rates), paths)
	}
	for len(rates) < max(paths, 1) {
		rates = append(rates, rates[0])
	}
	c.rates, c.rate = nil, 0
	for _, r := range rates {
		bits, err := units.ParseRate(r)
		if err != nil {
			return err
		}
		c.rates = append(c.rates, bits/8)
		c.rate += bits / 8
	}
	return nil
}

func parseRecv(args []string, stderr io.Writer) (*recvOpts, error) {
	o := &recvOpts{}
	fs := flag.NewFlagSet("haul recv", flag.ContinueOnError)
	fs.SetOutput(stderr)
	chunk, rate, via := commonFlags(fs, &o.common)
	fs.StringVar(&o.listen, "listen", "", "host:port to listen on (TCP for setup, UDP for data; more paths take further ports)")
	fs.StringVar(&o.out, "out", "", "file to write (it appears once complete and verified; until then PATH.haul.part and the state file PATH.haul)")
	fs.DurationVar(&o.wait, "wait", defaultWait, "when the sender goes silent, wait this long for it to be restarted and resume (0: give up at once)")
	fs.BoolVar(&o.encrypt, "encrypt", false, "accept only senders that encrypt the payload (send --encrypt); needs --key-file")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if o.listen == "" || o.out == "" || fs.NArg() != 0 {
		return nil, errors.New("recv needs --listen ADDR and --out PATH, and no other arguments")
	}
	if o.wait < 0 {
		return nil, fmt.Errorf("--wait %v: want a duration of 0 or more", o.wait)
	}
	err := o.finish(*chunk, *rate, *via, 0, 0)
	o.auto = false // the receiver sends only its verdict and requests: paced at 1 Gbit/s
	return o, err
}

func parseSend(args []string, stderr io.Writer) (*sendOpts, error) {
	o := &sendOpts{}
	fs := flag.NewFlagSet("haul send", flag.ContinueOnError)
	fs.SetOutput(stderr)
	chunk, rate, via := commonFlags(fs, &o.common)
	fs.StringVar(&o.to, "to", "", "the receiver's host:port")
	fs.IntVar(&o.paths, "paths", 1, "paths (1..16): the data spreads over this many UDP sockets and connections, each paced at its --rate and relayed by its --via")
	fs.IntVar(&o.workers, "workers", 1, "workers (1..16): the regions spread over this many connections, each with its own sockets, queues and goroutines at both ends, so that one transfer uses as many cores; --rate is shared among them, and --via names a relay per path of each worker")
	scheme := fs.String("scheme", "auto", "loss repair: auto (the model chooses), sr (selective repeat) or ec (erasure coding)")
	fs.IntVar(&o.k, "k", 32, "EC data chunks per stripe")
	fs.IntVar(&o.m, "m", 0, "EC parity chunks per stripe (default: the model picks 1, 2, 4 or 8)")
	fs.BoolVar(&o.encrypt, "encrypt", false, "encrypt the payload with AES-256-GCM under a key of this transfer's own, derived from --key-file's")
	fs.IntVar(&o.probes, "probes", 1000, "probes sent before the data to measure the path's loss and RTT, for the model's first choice (0: none; then it starts from no loss)")
	digest := fs.String("digest", "blake3", "how the file is checked end to end: blake3 (a BLAKE3 tree of the regions, which haul digest prints) or sha256 (the file's SHA-256, which sha256sum prints, at twice the CPU or more)")
	region := fs.String("region", "", "bytes per message, the unit of pipelining and of resume (default 16MiB, more for files over 64GiB: at most 4096 regions)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if o.to == "" || fs.NArg() != 1 {
		return nil, errors.New("send needs --to ADDR and one PATH")
	}
	o.path = fs.Arg(0)
	var err error
	var ok bool
	if o.hashing, ok = hashingLabeled(*digest); !ok {
		return nil, fmt.Errorf("--digest %q: want blake3 or sha256", *digest)
	}
	if o.scheme, err = reliability.ParseScheme(*scheme); err != nil {
		return nil, err
	}
	if o.k < 1 || o.k > 128 || o.m < 0 || o.m > 128 || o.k+o.m > 256 {
		return nil, fmt.Errorf("--k %d --m %d: want 1 <= k <= 128, 0 <= m <= 128, k+m <= 256", o.k, o.m)
	}
	if *region != "" {
		if o.region, err = parseRegion(*region); err != nil {
			return nil, err
		}
	}
	if o.probes < 0 || o.probes > 1<<16 {
		return nil, fmt.Errorf("--probes %d: want 0..65536", o.probes)
	}
	if o.paths < 1 || o.paths > 16 {
		return nil, fmt.Errorf("--paths %d: want 1..16", o.paths)
	}
	if o.workers < 1 || o.workers > 16 {
		return nil, fmt.Errorf("--workers %d: want 1..16", o.workers)
	}
	if err := o.finish(*chunk, *rate, *via, o.paths, o.paths*o.workers); err != nil {
		return o, err
	}
	// The workers share the rate: each paces at its part.
	for i := range o.rates {
		o.rates[i] /= float64(o.workers)
	}
	o.rate /= float64(o.workers)
	return o, nil
}

// noMAC says whether the data path goes without a MAC on its packets:
// when there is no --key-file. The MAC's key then crosses the connection
// setup in the clear, so the MAC stops nobody the keyed checksum does not
// (blind injection), while it costs an AES-GMAC pass over every packet at
// each end, a seventh of haul's CPU on loopback; each region's SHA-256
// still checks the bytes end to end. With a key the MAC stays.
func (c *common) noMAC() bool { return c.key == nil }

// offer is the sender's request, in the CM's private data.
type offer struct {
	Name string `json:"name"`
	Size int64  `json:"size"`
	// Digest is the file's, as Hashing computes it (digest.go), in hex.
	// Its key is the one of the releases before BLAKE3, whose digest was
	// always the SHA-256 (here as in pathHello, verdict and the state
	// file): those ends then interoperate with --digest sha256, and
	// refuse blake3-list by its name rather than a missing field.
	Digest string `json:"sha256"`
	Region int64  `json:"region"`
	// Manifest is the SHA-256 of the region hashes (digest.go), back to
	// back: the receiver checks the hashes it is sent (the first message
	// when it asks for them) against it, and each region against its
	// hash.
	Manifest string `json:"manifest"`
	// Hashing names the region hashes' scheme: hashBlake3 or hashChain.
	Hashing string `json:"hashing,omitempty"`
	K       int    `json:"k"`
	M       int    `json:"m"`
	Paths   int    `json:"paths,omitempty"` // further paths dial after this one with a pathHello
	// Workers is the connections the regions are spread over (the j-th
	// region to send on worker j mod Workers), each with Paths paths;
	// every path but worker 0's first dials with a pathHello.
	Workers int `json:"workers,omitempty"`
	// Wire is the version of the data path's format (sdrwire) the sender
	// speaks; the receiver refuses another (0: a haul from before it was
	// sent, which speaks version 2).
	Wire int `json:"wire,omitempty"`
	// Nonce, with --encrypt, is the sender's half of the session key's
	// salt (see crypt.go); its presence asks for an encrypted payload.
	Nonce []byte `json:"nonce,omitempty"`
}

// pathHello is the private data of every path but the first.
type pathHello struct {
	Path   int    `json:"path"`
	Worker int    `json:"worker,omitempty"`
	Digest string `json:"sha256"` // the offer's
}

// answer is the receiver's reply: the regions it already has, and
// whether it needs the region hashes (then the sender's first message).
type answer struct {
	Have   []byte `json:"have"` // bitmap of complete, verified regions
	Hashes bool   `json:"hashes,omitempty"`
	// With an encrypted payload: the receiver's half of the salt, and its
	// chunk size, which the sealed chunks fill.
	Nonce   []byte `json:"nonce,omitempty"`
	Chunk   int    `json:"chunk,omitempty"`
	Wire    int    `json:"wire,omitempty"`    // as the offer's
	Hashing string `json:"hashing,omitempty"` // as the offer's
}

// verdict is the receiver's last message: did the file check out, or why
// it stopped before the end (the sender stops then rather than time out).
type verdict struct {
	OK     bool   `json:"ok"`
	Digest string `json:"sha256"`
	Error  string `json:"error,omitempty"`
}

const verdictSize = 512

// defaultWait is how long a receiver waits for a sender to resume.
const defaultWait = 2 * time.Minute

// endpoint is one side's device, QPs (one per path) and reliability
// connection.
type endpoint struct {
	dev  *verbs.Device
	pd   *verbs.PD
	cq   *verbs.CQ
	qps  []*verbs.QP
	conn *reliability.Conn
}

func (e *endpoint) close() {
	if e.conn != nil {
		e.conn.Close()
	}
	if e.dev != nil {
		e.dev.Close()
	}
}

func (c *common) relCfg(k, m, maxParity int, scheme reliability.Scheme, paths int) reliability.Config {
	cfg := reliability.Config{Chunk: c.chunk, Slots: c.slots, Rate: c.rate, Scheme: scheme, K: k, M: m,
		MaxParity: maxParity, PeerTimeout: c.peerT, RTT: 20 * time.Millisecond}
	if c.auto {
		// The controller paces; the probe train goes at the old default
		// of 1 Gbit/s, which its echoes' dispersion measures below.
		cfg.AutoRate = true
		return cfg
	}
	if len(c.rates) == paths {
		cfg.PathRates = c.rates
	}
	return cfg
}

// open opens a udp device with one socket per path (the first on local,
// the others on local's address and a free port) and a QP per path, ready
// for the CM. With noMAC its QPs ask for the keyed checksum rather than
// a MAC on the packets sent to them (verbs.DeviceConfig.NoMAC).
func open(ctx context.Context, local netip.AddrPort, paths int, cfg reliability.Config, noMAC bool) (*endpoint, error) {
	e := &endpoint{}
	uri := "udp://" + local.String()
	for range paths - 1 {
		uri += "," + netip.AddrPortFrom(local.Addr(), 0).String()
	}
	var err error
	if e.dev, err = verbs.Open(ctx, uri, &verbs.DeviceConfig{NoMAC: noMAC}); err != nil {
		return nil, err
	}
	if e.pd, err = e.dev.AllocPD(); err != nil {
		e.close()
		return nil, err
	}
	if e.cq, err = e.dev.CreateCQ(verbs.CQConfig{Capacity: 4 * paths * reliability.DefaultRecvDepth}); err != nil {
		e.close()
		return nil, err
	}
	for i := range paths {
		qc := reliability.QPConfig(e.cq, cfg)
		qc.GID = i
		qp, err := e.pd.CreateQP(qc)
		if err != nil {
			e.close()
			return nil, err
		}
		e.qps = append(e.qps, qp)
	}
	return e, nil
}

// localFor returns the local address the kernel would use toward to.
func localFor(to string) (netip.AddrPort, error) {
	c, err := net.Dial("udp", to)
	if err != nil {
		return netip.AddrPort{}, err
	}
	defer c.Close()
	a := c.LocalAddr().(*net.UDPAddr).AddrPort()
	return netip.AddrPortFrom(a.Addr().Unmap(), 0), nil
}

// viaGID is path i's relay (none without --via).
func (c *common) viaGID(i int) (verbs.GID, error) {
	if len(c.vias) == 0 {
		return verbs.GID{}, nil
	}
	if i >= len(c.vias) {
		return verbs.GID{}, fmt.Errorf("--via: no relay for path %d (%d given)", i, len(c.vias))
	}
	g, err := netip.ParseAddrPort(strings.TrimSpace(c.vias[i]))
	if err != nil {
		return g, fmt.Errorf("--via %q: %w", c.vias[i], err)
	}
	return g, nil
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// parseRegion parses --region.
func parseRegion(s string) (int64, error) {
	r, err := units.ParseSize(s)
	if err != nil || r < minRegion || r > maxRegion || r%hashBlock != 0 {
		return 0, fmt.Errorf("--region %q: want %d bytes to 4GiB, a multiple of %d", s, minRegion, hashBlock)
	}
	return r, nil
}
