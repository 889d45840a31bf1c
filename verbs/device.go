package verbs

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rvma/rvma/internal/fabric"
	"github.com/rvma/rvma/internal/lockcheck"
	"github.com/rvma/rvma/internal/loopfab"
	"github.com/rvma/rvma/internal/shmfab"
	"github.com/rvma/rvma/internal/udpfab"
	"github.com/rvma/rvma/internal/wire"
)

// Faults configures seeded fault injection on a device's sends (see
// Device.SetFaults). Probabilities are per packet.
type Faults = fabric.Faults

// DeviceConfig configures Open. The zero value (or nil) means defaults.
type DeviceConfig struct {
	// Logger receives the device's diagnostics. Default: slog.Default().
	Logger *slog.Logger
	// NoMAC makes QPs on UDP ports take packets with the keyed checksum
	// instead of a MAC: for fabrics where nobody outside the job can
	// capture or send packets. Default false: every packet a UDP port
	// receives must carry a valid AES-GMAC tag under the receiving QP's
	// key and a counter not seen before. Shared-memory and in-process
	// ports, which no other user can reach, never use a MAC.
	NoMAC bool
	// NoGSO and NoGRO turn off UDP segmentation and receive offload
	// (probed at open, with a fallback of their own); NoCMA keeps shm
	// ports from reaching other processes' ordinary memory directly
	// (process_vm_readv/writev), so registered caller memory goes through
	// the rings. For kernels or containers where these misbehave.
	// Default false.
	NoGSO, NoGRO, NoCMA bool
}

// Device is an opened soft RDMA NIC: a set of GIDs (local addresses), each
// backed by a provider port, and the transport engine that runs RC and UC
// queue pairs over them.
//
// A Device is safe for concurrent use.
type Device struct {
	// Immutable after Open: read without a lock.
	uri   string
	log   *slog.Logger
	ports []*fabric.FaultPort
	gids  []GID
	kinds []Provider       // provider of each GID
	noMAC bool             // DeviceConfig.NoMAC
	alloc fabric.Allocator // shm: AllocMR memory is shared with the host's processes

	// Atomics.
	closed atomic.Bool
	// handling counts receive handlers running; Close waits for them, so
	// what they received is acknowledged before the QPs go away. A counter,
	// not a lock: handlers nest when the loop fabric delivers inline.
	handling atomic.Int32
	mbox     atomic.Pointer[mailboxBox] // replaced whole by SetMailboxHandler
	stats    deviceStats                // counters, each an atomic
	idle     chan struct{}              // made at Open; after Close began: the last handler returned

	// qps, lkeys and rkeys are copy-on-write maps: every received packet
	// and work request reads them without a lock, and writers replace
	// them whole under mu (see cow). The keys' maps are split in shards,
	// so that registering a region copies a shard's entries, not every
	// region's: a caller registering run after run (MPI's gets of a
	// struct type from C) spent half its time copying a 1024-entry map.
	qps   atomic.Pointer[map[uint32]*QP]
	lkeys keyShards
	rkeys keyShards

	// mu serialises the writers of qps, lkeys and rkeys, and guards the
	// fields below. Lock order: PD.mu, then mu, then CQ.mu; no QP's mu
	// is held when it is taken (QP.Destroy releases its own first).
	mu     lockcheck.Mutex[deviceLocks]
	nextIO uint64
	nextPD uint64
	pds    map[*PD]struct{}
	cqs    map[*CQ]struct{}

	// atomicMu serialises atomics on memory that is not 8-byte aligned in
	// the host address space (alignment in IOVA space is checked per WR).
	// It guards no field.
	atomicMu sync.Mutex
}

// deviceLocks is the lock class of Devices' mu (see internal/lockcheck).
type deviceLocks struct{}

func (deviceLocks) LockClass() string { return "a verbs Device's mu" }

type deviceStats struct {
	rxPackets, rxDropped, unknownQP, badSource, badSecret, badPort atomic.Uint64
	badMAC, replayed                                               atomic.Uint64
	outOfWindow, duplicates, malformed, discarded                  atomic.Uint64
	rnrNaks, timeouts, seqNaks                                     atomic.Uint64
}

// DeviceStats counts packets the device received and why it dropped some.
type DeviceStats struct {
	RxPackets  uint64 // packets handed to the engine
	RxDropped  uint64 // all drops, the sum of the reasons below and others
	UnknownQP  uint64 // destination QP does not exist
	BadSource  uint64 // not from the connected peer's GID
	BadSecret  uint64 // wrong per-connection secret
	BadMAC     uint64 // missing or wrong MAC (UDP ports)
	Replayed   uint64 // a valid MAC on a packet counter seen before: a replay
	BadPort    uint64 // arrived on a GID the QP is not bound to
	OutOfOrder uint64 // outside the PSN window or out of sequence
	Duplicates uint64 // duplicate requests (re-acknowledged, not re-executed)
	Malformed  uint64 // inconsistent headers or lengths
	// Discarded counts packets dropped for the receiving QP's state: not
	// ready to receive, a response on a QP that is not sending, the rest
	// of a UC message that lost a packet or was refused.
	Discarded uint64
	// Undecodable counts datagrams a port could not decode (they never
	// reach the engine, so they are not in RxPackets or RxDropped).
	Undecodable uint64
	// Direct counts operations executed through shared memory with no
	// packet for the data (shm): WRITEs, READs and atomics this device's
	// requesters made in peers' memory, and mailbox payloads its
	// responders pulled from initiators.
	Direct uint64

	// Requester events: receiver-not-ready NAKs received (each a wait of
	// the RNR timer), retransmission timeouts, and sequence-error NAKs
	// (each a go-back).
	RNRNaks, Timeouts, SeqNaks uint64
}

type mailboxBox struct{ h MailboxHandler }

// Open opens a device from a provider URI:
//
//	loop://NAME[?gids=N&mtu=BYTES]
//	udp://IP:PORT[,IP:PORT...][?mtu=BYTES|max]
//
// Devices that open the same loop fabric NAME reach each other in this
// process. gids (default 1, range 1..256) sets the number of local
// addresses; mtu (default 65536, range 256..1048576) the largest payload.
//
//	shm://NAME[?gids=N&mtu=BYTES]
//
// shm devices of one NAME reach each other across the processes of a host
// through shared memory (package internal/shmfab); gids (default 1)
// sets the number of local addresses, mtu (default 65536, range
// 256..1048576) the largest payload.
//
// URIs joined by "+" open one device with the ports of each, in order, for
// example "udp://10.0.0.1:0+shm://job": a QP then reaches peers of the
// provider of the GID it binds to (see Device.Provider), and memory
// regions, PDs and CQs serve QPs of every provider.
//
// A udp device has one GID per address, each a UDP socket (port 0 picks a
// free port; Device.GIDs reports the one chosen). IPv4 and IPv6 addresses
// may be mixed, but a QP only reaches peers of its GID's family. mtu
// (payload bytes, range 256..64880) defaults to RoCE's 4096, or less when
// the interface that owns the address cannot carry it unfragmented; "max"
// asks for the largest the interface carries in one datagram, a multiple
// of 4096 (61440 on loopback), for fewer packets per byte.
func Open(ctx context.Context, uri string, cfg *DeviceConfig) (*Device, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if cfg == nil {
		cfg = &DeviceConfig{}
	}
	d := &Device{uri: uri, log: cfg.Logger, noMAC: cfg.NoMAC, pds: map[*PD]struct{}{}, cqs: map[*CQ]struct{}{}, nextIO: 1 << 40}
	if d.log == nil {
		d.log = slog.Default()
	}
	var ports []fabric.Port
	var kinds []Provider
	for _, part := range splitURI(uri) {
		ps, kind, err := openPorts(part, d.log, cfg)
		if err != nil {
			for _, p := range ports {
				p.Close()
			}
			return nil, fmt.Errorf("verbs: open %q: %w", uri, err)
		}
		ports = append(ports, ps...)
		for range ps {
			kinds = append(kinds, kind)
		}
	}
	d.kinds = kinds
	return newDevice(d, ports), nil
}

// splitURI splits a composite URI, "udp://...+shm://...", into its parts:
// a part starts at every "+" followed by a scheme and "://".
func splitURI(uri string) []string {
	var parts []string
	start := 0
	for i := 1; i < len(uri); i++ {
		if uri[i] != '+' {
			continue
		}
		j := i + 1
		for j < len(uri) && (uri[j] >= 'a' && uri[j] <= 'z' || j > i+1 && uri[j] >= '0' && uri[j] <= '9') {
			j++
		}
		if j > i+1 && strings.HasPrefix(uri[j:], "://") {
			parts = append(parts, uri[start:i])
			start = i + 1
		}
	}
	return append(parts, uri[start:])
}

// openPorts opens the ports of one provider URI and names the provider.
func openPorts(uri string, log *slog.Logger, cfg *DeviceConfig) ([]fabric.Port, Provider, error) {
	if rest, ok := strings.CutPrefix(uri, "udp://"); ok {
		ports, err := openUDP(rest, &udpfab.Config{Logger: log, NoGSO: cfg.NoGSO, NoGRO: cfg.NoGRO})
		return ports, ProviderUDP, err
	}
	u, err := url.Parse(uri)
	if err != nil {
		return nil, "", fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	var ports []fabric.Port
	switch u.Scheme {
	case string(ProviderLoop):
		name := u.Host + u.Path
		if name == "" {
			return nil, "", fmt.Errorf("%w: loop fabric needs a name", ErrInvalidArgument)
		}
		q := u.Query()
		n, err := intParam(q, "gids", 1)
		if err != nil {
			return nil, "", err
		}
		mtu, err := intParam(q, "mtu", loopfab.DefaultMTU)
		if err != nil {
			return nil, "", err
		}
		lp, err := loopfab.Open(name, n, mtu)
		if err != nil {
			return nil, "", fmt.Errorf("%w: %v", ErrInvalidArgument, err)
		}
		for _, p := range lp {
			ports = append(ports, p)
		}
		return ports, ProviderLoop, nil
	case string(ProviderSHM):
		name := u.Host + u.Path
		if name == "" {
			return nil, "", fmt.Errorf("%w: shm fabric needs a name", ErrInvalidArgument)
		}
		q := u.Query()
		n, err := intParam(q, "gids", 1)
		if err == nil && (n < 1 || n > 256) {
			err = fmt.Errorf("%w: gids=%d", ErrInvalidArgument, n)
		}
		if err != nil {
			return nil, "", err
		}
		mtu, err := intParam(q, "mtu", shmfab.DefaultMTU)
		if err != nil {
			return nil, "", err
		}
		for range n {
			p, err := shmfab.Open(name, mtu)
			if err == nil && cfg.NoCMA {
				p.NoCMA()
			}
			if err != nil {
				for _, p := range ports {
					p.Close()
				}
				return nil, "", fmt.Errorf("%w: %v", ErrInvalidArgument, err)
			}
			ports = append(ports, p)
		}
		return ports, ProviderSHM, nil
	}
	return nil, "", fmt.Errorf("%w %q", ErrUnknownProvider, u.Scheme)
}

// Provider names a provider: a URI's scheme.
type Provider string

// Providers.
const (
	ProviderUDP  Provider = "udp"
	ProviderSHM  Provider = "shm"
	ProviderLoop Provider = "loop"
)

// Provider names the provider behind GID index gid (""
// if out of range). A composite device has several.
func (d *Device) Provider(gid int) Provider {
	if gid < 0 || gid >= len(d.kinds) {
		return ""
	}
	return d.kinds[gid]
}

// CrossMemoryAttach reports how shm devices reach registered memory that
// is not from AllocMR: with process_vm_readv/writev, one system call and
// no intermediate copy (true), or, where the kernel forbids it, through
// the rings like any packet (false); the string says which mechanism or
// why not. It is decided once per process, at the first shm device.
// Memory from AllocMR is always reached by a plain copy.
func CrossMemoryAttach() (bool, string) { return shmfab.CMA() }

// openUDP opens one port per address of "IP:PORT[,IP:PORT...][?mtu=N]".
func openUDP(spec string, ucfg *udpfab.Config) ([]fabric.Port, error) {
	hosts, query, _ := strings.Cut(spec, "?")
	q, err := url.ParseQuery(query)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	var ports []fabric.Port
	fail := func(err error) ([]fabric.Port, error) {
		for _, p := range ports {
			p.Close()
		}
		return nil, err
	}
	for _, h := range strings.Split(hosts, ",") {
		ap, err := netip.ParseAddrPort(h)
		if err != nil {
			return fail(fmt.Errorf("%w: address %q: %v", ErrInvalidArgument, h, err))
		}
		var mtu int
		if q.Get("mtu") == "max" {
			mtu = udpfab.LargestMTUFor(ap.Addr())
		} else if mtu, err = intParam(q, "mtu", udpfab.DefaultMTUFor(ap.Addr())); err != nil {
			return fail(err)
		}
		p, err := udpfab.Open(ap, mtu, ucfg)
		if err != nil {
			return fail(fmt.Errorf("%w: %v", ErrInvalidArgument, err))
		}
		ports = append(ports, p)
	}
	return ports, nil
}

func intParam(q url.Values, key string, def int) (int, error) {
	s := q.Get(key)
	if s == "" {
		return def, nil
	}
	v, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("%w: %s=%q", ErrInvalidArgument, key, s)
	}
	return v, nil
}

func newDevice(d *Device, ports []fabric.Port) *Device {
	empty := map[uint32]*QP{}
	d.qps.Store(&empty)
	d.idle = make(chan struct{}, 1)
	d.lkeys.init()
	d.rkeys.init()
	for i, p := range ports {
		fp := fabric.NewFaultPort(p)
		if d.alloc == nil {
			d.alloc = fp.Allocator()
		}
		d.ports = append(d.ports, fp)
		d.gids = append(d.gids, p.Addr())
		p.SetHandler(&portHandler{dev: d, gid: i})
	}
	return d
}

// URI returns the URI the device was opened with.
func (d *Device) URI() string { return d.uri }

// GIDs returns the device's local addresses; QPs bind to one by index.
func (d *Device) GIDs() []GID { return append([]GID(nil), d.gids...) }

// MaxMTU returns the largest payload the port behind GID index gid carries.
func (d *Device) MaxMTU(gid int) int {
	if gid < 0 || gid >= len(d.ports) {
		return 0
	}
	return d.ports[gid].MaxPayload()
}

// SetFaults sets fault injection on the sends of GID index gid, or of every
// GID when gid is -1. Faults{} turns injection off.
func (d *Device) SetFaults(gid int, f Faults) error {
	if gid < -1 || gid >= len(d.ports) {
		return fmt.Errorf("verbs: SetFaults: %w: GID index %d", ErrInvalidArgument, gid)
	}
	for i, p := range d.ports {
		if gid == -1 || gid == i {
			p.SetFaults(f)
		}
	}
	return nil
}

// SetMailboxHandler installs the receiver of mailbox writes (see
// MailboxHandler). With none installed, mailbox writes are refused with a
// remote access error.
func (d *Device) SetMailboxHandler(h MailboxHandler) {
	if h == nil {
		d.mbox.Store(nil)
		return
	}
	d.mbox.Store(&mailboxBox{h})
}

// Progress handles, in the caller's goroutine, the packets that have
// arrived at the device's ports, and returns how many. A device also makes
// progress on its own; polling it saves a goroutine hand-off per packet,
// which is what an application that busy-polls memory (rather than a CQ)
// wants. CQ.Poll and CQ.Wait call it for their device. It never blocks.
func (d *Device) Progress() int {
	n := 0
	for _, p := range d.ports {
		n += p.Progress()
	}
	return n
}

// Stats returns the device's receive counters.
func (d *Device) Stats() DeviceStats {
	s := &d.stats
	ds := DeviceStats{
		RxPackets: s.rxPackets.Load(), RxDropped: s.rxDropped.Load(), UnknownQP: s.unknownQP.Load(),
		BadSource: s.badSource.Load(), BadSecret: s.badSecret.Load(), BadPort: s.badPort.Load(),
		BadMAC: s.badMAC.Load(), Replayed: s.replayed.Load(),
		OutOfOrder: s.outOfWindow.Load(), Duplicates: s.duplicates.Load(), Malformed: s.malformed.Load(),
		Discarded: s.discarded.Load(), RNRNaks: s.rnrNaks.Load(), Timeouts: s.timeouts.Load(), SeqNaks: s.seqNaks.Load(),
	}
	for _, p := range d.ports {
		ps := p.Stats()
		ds.Undecodable += ps.Dropped
		ds.Direct += ps.Direct
	}
	return ds
}

// Close destroys every QP, closes the ports and invalidates every object of
// the device. Later calls on any of them return ErrClosed. It first lets
// receive handling already in progress finish, so what was received is
// acknowledged; it must not be called from a MailboxHandler of the device.
func (d *Device) Close() error {
	if d.closed.Swap(true) {
		return ErrClosed
	}
	// Let receive handlers in progress finish, so that a peer whose last
	// message was received gets its acknowledgement.
	for d.handling.Load() != 0 {
		<-d.idle
	}
	for _, qp := range *d.qps.Load() {
		qp.Destroy()
	}
	d.mu.Lock()
	for cq := range d.cqs {
		cq.close()
	}
	d.mu.Unlock()
	for _, p := range d.ports {
		p.Close()
	}
	return nil
}

// keyShards maps memory keys to regions in keyShardN copy-on-write
// shards, by the key's low bits (keys are random).
type keyShards [keyShardN]atomic.Pointer[map[uint32]*MR]

const keyShardN = 64

func (k *keyShards) init() {
	for i := range k {
		m := map[uint32]*MR{}
		k[i].Store(&m)
	}
}

// get returns the region of key, or nil; without a lock.
func (k *keyShards) get(key uint32) *MR { return (*k[key%keyShardN].Load())[key] }

// set maps key to mr (nil: removes it); d.mu held.
func (k *keyShards) set(d *Device, key uint32, mr *MR) {
	cow(d, &k[key%keyShardN], func(m map[uint32]*MR) {
		if mr == nil {
			delete(m, key)
		} else {
			m[key] = mr
		}
	})
}

// cow applies f to a copy of the map in p, one of d's, and publishes it;
// d.mu is held.
func cow[K comparable, V any](d *Device, p *atomic.Pointer[map[K]V], f func(map[K]V)) {
	lockcheck.AssertHeld(&d.mu, "verbs: a device's map is replaced")
	old := *p.Load()
	m := make(map[K]V, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	f(m)
	p.Store(&m)
}

// portHandler dispatches the packets arriving at one GID. A port runs it
// from one goroutine at a time, so its outbox needs no lock.
type portHandler struct {
	dev *Device
	gid int
	out outbox
}

func (h *portHandler) HandlePackets(pkts []*wire.Packet) {
	d := h.dev
	d.handling.Add(1)
	defer d.handlerDone()
	if d.closed.Load() {
		return
	}
	now := time.Now()
	qps := *d.qps.Load()
	d.stats.rxPackets.Add(uint64(len(pkts)))
	for _, p := range pkts {
		qp := qps[p.DestQP]
		switch {
		case qp == nil:
			d.drop(&d.stats.unknownQP)
		case qp.gid != h.gid:
			d.drop(&d.stats.badPort)
		default:
			qp.receive(p, now, &h.out)
			if h.out.readsMemory() {
				// READ responses point into registered memory. Send them
				// before a later packet of the batch completes a receive:
				// once the application sees that completion it may write
				// the memory (a target's Wait returns when the origin's
				// message arrives, and a retransmitted READ may precede it).
				h.out.flush(d.ports[h.gid])
			}
		}
	}
	for _, qp := range h.out.touched {
		qp.flushAck(&h.out)
	}
	clear(h.out.touched)
	h.out.touched = h.out.touched[:0]
	h.out.flush(d.ports[h.gid])
}

// handlerDone ends a receive handler's count, and tells a Close waiting
// for handlers when it was the last. Close sets closed before it reads the
// count, so the last handler to return after that sees closed and signals.
func (d *Device) handlerDone() {
	if d.handling.Add(-1) == 0 && d.closed.Load() {
		select {
		case d.idle <- struct{}{}:
		default:
		}
	}
}

func (d *Device) drop(reason *atomic.Uint64) {
	reason.Add(1)
	d.stats.rxDropped.Add(1)
}

// outbox collects the packets a QP emits while its lock is held, so they
// are sent after it is released (a send may re-enter the engine).
type outbox struct {
	pkts    []*wire.Packet
	touched []*QP // QPs with a coalesced ACK pending
	// held lists the QPs whose first transmissions are in pkts: those
	// packets read their requests' memory when sent, so the QPs complete
	// no request until the outbox is flushed (see QP.unflushed).
	held []*QP
	// entered lists the regions READ responses in pkts read: each stays
	// entered (MR.enter) until the outbox is sent, so that Deregister
	// does not free them under the send.
	entered []*MR
}

// readsMemory says whether some packet's payload is registered memory
// (a READ response), not a copy.
func (o *outbox) readsMemory() bool { return len(o.entered) > 0 }

// enter enters mr for o's READ responses (false if it is gone).
func (o *outbox) enter(mr *MR) bool {
	if !mr.enter() {
		return false
	}
	o.entered = append(o.entered, mr)
	return true
}

// flushHook, set by tests only, is called before an outbox holding first
// transmissions or READ responses is sent.
var flushHook atomic.Pointer[func(held []*QP)]

// hold notes that o carries first transmissions of qp's requests (qp.mu
// held).
func (o *outbox) hold(qp *QP) {
	for _, h := range o.held {
		if h == qp {
			return
		}
	}
	o.held = append(o.held, qp)
	qp.unflushed.Add(1)
}

var outboxPool = sync.Pool{New: func() any { return &outbox{pkts: make([]*wire.Packet, 0, 64)} }}

func (o *outbox) flush(p fabric.Port) {
	lockcheck.AssertNotHeld[qpLocks]("verbs: Port.Send (an outbox flush) while a QP's mu is held: a send may re-enter the engine")
	if h := flushHook.Load(); h != nil && (len(o.held) > 0 || o.readsMemory()) {
		(*h)(o.held)
	}
	if len(o.pkts) > 0 {
		p.Send(o.pkts)
		clear(o.pkts)
		o.pkts = o.pkts[:0]
	}
	for i, mr := range o.entered {
		mr.exit()
		o.entered[i] = nil
	}
	o.entered = o.entered[:0]
	if len(o.held) > 0 {
		held := o.held
		o.held = o.held[:0]
		for i, qp := range held {
			held[i] = nil
			qp.flushed()
		}
	}
}
