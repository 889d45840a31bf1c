package rma

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	mrand "math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rvma/rvma/internal/kvs"
	"github.com/rvma/rvma/internal/launch"
	"github.com/rvma/rvma/internal/lockcheck"
	"github.com/rvma/rvma/internal/pmi"
	"github.com/rvma/rvma/internal/progress"
	"github.com/rvma/rvma/internal/spin"
	"github.com/rvma/rvma/mailbox"
	"github.com/rvma/rvma/multipath"
	"github.com/rvma/rvma/verbs"
	"github.com/rvma/rvma/verbs/cm"
)

// Environment variables read by Init (see the package documentation).
const (
	EnvRank        = "RVMA_RANK"        // set by rvmarun: this process's rank
	EnvSize        = "RVMA_SIZE"        // set by rvmarun: the number of ranks
	EnvKVS         = "RVMA_KVS"         // set by rvmarun: the rendezvous server's TCP address
	EnvIncarnation = "RVMA_INCARNATION" // set by rvmarun --restart: 0 at the first start, one more at each respawn of the rank
	EnvRendezvous  = "RVMA_RENDEZVOUS"  // Slurm jobs, Open MPI jobs across nodes: host:port where rank 0 serves the rendezvous
	EnvPMI         = "RVMA_PMI"         // "1" or "2": the PMI version spoken over PMI_FD; default PMI-2 if the launcher accepts it, else PMI-1
	EnvProvider    = "RVMA_PROVIDER"    // auto (default), udp or shm
	EnvHost        = "RVMA_HOST"        // this rank's host identity for auto (default: boot id and PID namespace)
	EnvAddr        = "RVMA_ADDR"        // local IP address for the UDP provider; default 127.0.0.1
	EnvMTU         = "RVMA_MTU"         // UDP provider's MTU (payload bytes per packet); default the largest the interface carries (61440 on loopback)
	EnvPaths       = "RVMA_PATHS"       // paths (local addresses) per connection; default 1
	EnvRCTimeout   = "RVMA_RC_TIMEOUT"  // Config.Connect.Timeout, a duration ("50ms"); default verbs' (20ms)
	EnvNoGSO       = "RVMA_DISABLE_GSO" // "1": Config.Device.NoGSO
	EnvNoGRO       = "RVMA_DISABLE_GRO" // "1": Config.Device.NoGRO
	EnvSHMCMA      = "RVMA_SHM_CMA"     // "0": Config.Device.NoCMA
)

// Config configures Init and NewWorld. The zero value means defaults.
type Config struct {
	// Provider is the verbs provider: "auto" (default, or RVMA_PROVIDER)
	// connects ranks of one host (see Host) through shared memory and the
	// others through UDP, over one composite device; "udp" or "shm"
	// forces one provider for every pair ("shm": every rank on one host);
	// "loop" is for in-process worlds only (NewWorld's default).
	Provider string
	// Host identifies this rank's host for "auto": ranks of equal Host
	// connect through shared memory. Default RVMA_HOST, else the kernel's
	// boot id and PID namespace (what processes that can map each other's
	// memory through /proc share), with, under Open MPI's mpirun across
	// nodes, the node's name.
	Host string
	// Hosts, for NewWorld with "auto", is each rank's Host (one per rank),
	// so that one process can stand for several hosts. Default: Host.
	Hosts []string
	// Addr is the local IP address for the UDP provider and the connection
	// manager, or a comma-separated list of addresses, one per path (the
	// first also serves the connection manager). Default RVMA_ADDR, else,
	// under Open MPI's mpirun across nodes, an address the other nodes
	// reach (rank 0's route toward mpirun, the others' toward rank 0),
	// else 127.0.0.1.
	Addr string
	// Paths is the number of paths of every connection between two ranks
	// (Virtuoso-style multipath, see the package documentation): the UDP
	// provider opens one local address per path (cycling through Addr's
	// list; with one address, one port per path), the loop provider that
	// many GIDs. Default RVMA_PATHS, else 1; range 1..64.
	Paths int
	// Multipath tunes the paths when Paths > 1: the balancer, and Small,
	// the size from which a contiguous put or get is split over the paths
	// (smaller operations, non-contiguous ones, atomics, accumulates and
	// synchronisation use the connection's first path). Its Paths and
	// Connect fields are set from this Config. Default: multipath's.
	Multipath multipath.Config
	// LongHaul sends puts into notified windows toward some peers over
	// the reliability layer (see LongHaulConfig). Default: from
	// RVMA_LONGHAUL ("all" or ranks), else none.
	LongHaul *LongHaulConfig
	// Devices, if set, are the ranks' devices for NewWorld, one per rank,
	// opened by the caller (for example inside network namespaces); the
	// communicators own them from then on. Addr then only serves the
	// connection manager.
	Devices []*verbs.Device
	// MTU is the UDP provider's largest payload per packet. Default
	// RVMA_MTU, else the largest the interface carries in one datagram
	// (61440 on loopback, 8192 with 9000-byte jumbo frames, 1024 on
	// 1500-byte Ethernet): fewer packets cost less per byte on both sides;
	// range 256..64880 (udpfab.MaxMTU).
	MTU int
	// Timeout bounds bootstrap and each connection set-up. Default 60s.
	Timeout time.Duration
	// CloseTimeout bounds how long Close waits for the other ranks once an
	// operation of this communicator has failed (a failed rank may never
	// come). Default 2s.
	CloseTimeout time.Duration
	// Device holds the verbs device's own options: NoMAC (the MAC on UDP
	// packets off, for fabrics where nobody outside the job can capture
	// or send packets; every rank of a job must agree), NoGSO, NoGRO,
	// NoCMA. Default verbs' (Logger: Config.Logger).
	Device verbs.DeviceConfig
	// Connect holds the QP attributes of every connection: among them the
	// RC retransmission timeout's floor (Timeout, default 20ms, or
	// RVMA_RC_TIMEOUT; rvmarun --rc-timeout), its cap (MaxTimeout, 2s) and
	// the retries (7), which bound how long a dead peer takes to fail
	// operations (about 5 s). Default: verbs' defaults.
	Connect verbs.ConnectConfig
	// Logger receives diagnostics. Default slog.Default().
	Logger *slog.Logger

	// probeEvery, for tests, replaces the constant of that name.
	probeEvery time.Duration
}

// deviceURI is the device a rank opens: loop is the in-process fabric
// loopName, shm one whose ports every rank of the host reaches.
func (c *Config) deviceURI(loopName string) string {
	switch c.Provider {
	case "loop":
		return loopName + "?gids=" + strconv.Itoa(c.Paths)
	case "shm":
		uri := "shm://rvma?gids=" + strconv.Itoa(c.Paths)
		if c.MTU > 0 {
			uri += "&mtu=" + strconv.Itoa(c.MTU)
		}
		return uri
	case "auto":
		// The UDP ports first: GID 0 and the paths are UDP as with "udp";
		// one shm port after them serves the ranks of this host.
		return c.udpURI() + "+shm://rvma"
	}
	return c.udpURI()
}

// hostIdentity names what ranks that can share memory have in common: the
// kernel instance (boot id) and the PID namespace (so /proc reaches the
// peer's memory).
func hostIdentity() string {
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "" // no shared memory detection: every pair uses UDP
	}
	ns, _ := os.Readlink("/proc/self/ns/pid")
	return strings.TrimSpace(string(boot)) + "/" + ns
}

// cmAddr is the address the connection manager and the multipath
// listener bind.
func (c *Config) cmAddr() string {
	a, _, _ := strings.Cut(c.Addr, ",")
	return net.JoinHostPort(strings.TrimSpace(a), "0")
}

// udpURI is the UDP device this configuration opens: one socket per path.
func (c *Config) udpURI() string {
	addrs := strings.Split(c.Addr, ",")
	parts := make([]string, c.Paths)
	for i := range parts {
		parts[i] = net.JoinHostPort(strings.TrimSpace(addrs[i%len(addrs)]), "0")
	}
	mtu := "max"
	if c.MTU > 0 {
		mtu = strconv.Itoa(c.MTU)
	}
	return "udp://" + strings.Join(parts, ",") + "?mtu=" + mtu
}

func (c *Config) withDefaults() Config {
	var d Config
	if c != nil {
		d = *c
	}
	if d.Provider == "" {
		d.Provider = "auto"
	}
	if d.Host == "" {
		d.Host = hostIdentity()
	}
	if d.Addr == "" {
		d.Addr = "127.0.0.1"
	}
	if d.Paths == 0 {
		d.Paths = 1
	}
	d.Multipath.Paths = d.Paths
	if d.Multipath.Connect == (verbs.ConnectConfig{}) {
		d.Multipath.Connect = d.Connect
	}
	if d.Timeout <= 0 {
		d.Timeout = 60 * time.Second
	}
	if d.CloseTimeout <= 0 {
		d.CloseTimeout = 2 * time.Second
	}
	if d.Logger == nil {
		d.Logger = slog.Default()
	}
	if d.Device.Logger == nil {
		d.Device.Logger = d.Logger
	}
	return d
}

// fromEnv is c with what it leaves unset taken from the environment a
// launcher gives a rank (the README's table of variables). Only Init
// calls it: NewWorld and every constructor below depend on their Config
// alone. It also sets the process's spin duration from RVMA_SPIN.
func (c *Config) fromEnv() (Config, error) {
	var d Config
	if c != nil {
		d = *c
	}
	str := func(v *string, name string) {
		if *v == "" {
			*v = os.Getenv(name)
		}
	}
	var errs []error
	num := func(v *int, name string) {
		if s := os.Getenv(name); *v == 0 && s != "" {
			n, err := strconv.Atoi(s)
			if err != nil {
				errs = append(errs, fmt.Errorf("%w: %s=%q is not a number", ErrBootstrap, name, s))
			}
			*v = n
		}
	}
	str(&d.Provider, EnvProvider)
	str(&d.Host, EnvHost)
	str(&d.Addr, EnvAddr)
	num(&d.MTU, EnvMTU)
	num(&d.Paths, EnvPaths)
	if s := os.Getenv(EnvRCTimeout); d.Connect.Timeout == 0 && s != "" {
		t, err := time.ParseDuration(s)
		if err != nil {
			errs = append(errs, fmt.Errorf("%w: %s=%q is not a duration", ErrBootstrap, EnvRCTimeout, s))
		}
		d.Connect.Timeout = t
	}
	if d.LongHaul == nil {
		lh, err := longHaulFromEnv()
		errs = append(errs, err)
		d.LongHaul = lh
	}
	d.Device.NoGSO = d.Device.NoGSO || os.Getenv(EnvNoGSO) == "1"
	d.Device.NoGRO = d.Device.NoGRO || os.Getenv(EnvNoGRO) == "1"
	d.Device.NoCMA = d.Device.NoCMA || os.Getenv(EnvSHMCMA) == "0"
	errs = append(errs, spin.Set(os.Getenv(spin.EnvSpin)))
	return d, errors.Join(errs...)
}

// check validates the configuration after defaults.
func (c *Config) check() error {
	switch c.Provider {
	case "auto", "udp", "shm", "loop":
	default:
		return fmt.Errorf("%w: unknown provider %q (want auto, udp, shm or loop)", ErrBootstrap, c.Provider)
	}
	if c.Paths < 1 || c.Paths > 64 {
		return fmt.Errorf("%w: %d paths, want 1..64", ErrBootstrap, c.Paths)
	}
	return nil
}

// Comm is a group of ranks that communicate: the world of a job.
//
// Lock order, outermost first (a lock may be taken while holding those
// before it, never the other way): a Win's mu; a txState's mu; a Win's
// unsigMu; the engine's lock (c.eng.Locked, OnDone callbacks, Wait
// conditions); a peer's mu; qpnMu; then verbs' locks (a QP's, inside
// QP methods). winMu, hostMu, mpMu, haulMu, a peer's sendMu, mpMu and
// haulMu, and the registration cache's and send pool's locks are taken
// on their own or innermost. Nothing waits for the network or for an
// Op while holding the engine's lock or a peer's mu. Builds with -tags
// rvmadebug check the rules stated as "held" or "not held" in this
// package (see internal/lockcheck).
type Comm struct {
	// Set by newComm before c is shared, then read-only: no lock.
	rank, size int
	cfg        Config
	store      kvs.Store
	ownStore   bool
	kvServer   *kvs.Server
	published  string // boot.published until the rendezvous barrier
	key        []byte // the job's: authenticates the rendezvous and every connection handshake
	inc        uint32 // this process's incarnation of its rank (0 unless respawned)
	world      *world // NewWorld's: what respawning a rank in process takes (tests)
	dev        *verbs.Device
	pd         *verbs.PD
	cq         *verbs.CQ
	srq        *verbs.SRQ
	eng        *progress.Engine
	doneReq    *Request  // of every operation that completed in its call (Win.orDone)
	ops        sync.Pool // of *winOp: flush markers' records, reused
	target     *mailbox.Target
	ln         *cm.Listener
	mpLn       *multipath.Listener // with Config.Paths > 1: where other ranks' multipath connections arrive
	bg         context.Context     // ends at teardown; bounds waits on paths
	bgStop     context.CancelFunc
	done       chan struct{} // closed by teardown
	peers      []*peer       // one per rank; each guards its own state
	shmGID     int           // provider "auto": the shm port's GID index (-1 without one)
	recv       recvPool      // a slot belongs to its posted receive, then to OnRecv until reposted

	// mpMu guards mpIn: the multipath connections that arrived (kept for
	// Close).
	mpMu sync.Mutex
	mpIn []*multipath.Conn

	// haulMu guards the long-haul connections other ranks dialed, each
	// served by a goroutine.
	haulMu   sync.Mutex
	haulIn   []*haulPeer
	haulHalf map[int]*haulPeer // pairs whose second connection has not arrived

	// qpnMu guards byQPN.
	qpnMu sync.Mutex
	byQPN map[uint32]int // local QP number -> peer rank

	// hostMu guards hosts: provider "auto", the other ranks' hosts as they
	// published them, looked up on first use.
	hostMu sync.Mutex
	hosts  map[int]string

	// winMu guards wins, dyns and nextWin. The poller reads wins (and
	// dyns, for dynamic windows: dynamic.go) to find an active message's
	// window: a window is added once the fields its handler reads are set
	// (see Win).
	winMu   sync.Mutex
	wins    map[uint32]*Win
	dyns    map[uint32]*DynWin
	nextWin uint32

	// msg is guarded by the engine's lock, but for msg.partial (OnRecv's)
	// and msg.send (its own lock): see msgState.
	msg msgState
	reg regCache // its own lock

	// rec is the recovery state (recover.go); its own lock.
	rec recovery

	// Atomics.
	collSeq  atomic.Uint32 // collective sequence number; collectives are called in order
	troubled atomic.Bool   // an operation or connection failed (see Close)
	hb       hostBarrier   // barriers through memory, where every rank shares the host
	// recovered is set by Recover: windows' epochs keep to messages
	// (pscwmem.go), which carry the recovery's generation.
	recovered atomic.Bool
	ticks     atomic.Uint64 // probeEvery periods since the start (see wakeProbes)

	// Goroutines and teardown.
	mpWG      sync.WaitGroup // the multipath accept loop
	haulWG    sync.WaitGroup // the long-haul serving goroutines
	bridges   sync.WaitGroup // goroutines finishing operations bridged from other CQs
	backlogs  atomic.Bool    // some peer may have a backlog (msg.go: flushBacklogs)
	retrying  atomic.Bool    // a backlogRetry timer is armed (msg.go: retryBacklogs)
	acceptWG  sync.WaitGroup // the connection accept loop
	closeOnce sync.Once
}

type peer struct {
	ready chan struct{} // under mu: closed once qp is connected (or err set); replaced when Recover drops the connection

	// mu guards the connection's state. A connection is made without it
	// (dialing or accepting says one is under way), but for a rank's
	// connection to itself, which does not block. The engine's lock and
	// a txState's mu may be held when it is taken (Comm.broken, txDrain).
	mu        lockcheck.Mutex[peerLocks]
	qp        *verbs.QP
	inc       uint32 // the incarnation of the peer qp is connected to
	err       error
	dialing   bool
	accepting bool

	// sendMu is held while one message's fragments are posted, so they
	// follow each other on the QP, and while the backlog is posted. It
	// guards no field.
	sendMu sync.Mutex
	// backlog holds, in order, messages the poller could not post for
	// want of room (msg.go: sendMsgNoWait); backlogMu guards it and is
	// held only briefly.
	backlogMu sync.Mutex
	backlog   []backlogged

	// mpMu guards mp, this rank's multipath connection to the peer, for
	// large puts and gets (Config.Paths > 1), dialed on first use with
	// mpMu held.
	mpMu sync.Mutex
	mp   *multipath.Conn

	// haulMu guards haul, this rank's reliability connection to the peer
	// (Config.LongHaul), dialed on first use with haulMu held.
	haulMu sync.Mutex
	haul   *haulPeer

	// pathsDone and haulDone finish the operations that complete on mp
	// and on haul, in the order they started (completer.go).
	pathsDone, haulDone completer
}

// peerLocks is the lock class of peers' mu (see internal/lockcheck).
type peerLocks struct{}

func (peerLocks) LockClass() string { return "an rma peer's mu" }

// Rank returns this process's rank.
func (c *Comm) Rank() int { return c.rank }

// Size returns the number of ranks.
func (c *Comm) Size() int { return c.size }

// Device returns the verbs device the communicator runs on.
func (c *Comm) Device() *verbs.Device { return c.dev }

// Init bootstraps the communicator of this process from its environment,
// first match wins: rvmarun's variables (RVMA_RANK, RVMA_SIZE, RVMA_KVS);
// a PMI server over PMI_FD (MPICH's Hydra mpiexec, Slurm's srun
// --mpi=pmi2), spoken in PMI-2 if it accepts it, else PMI-1 (RVMA_PMI=1
// or 2 forces one); Open MPI's mpirun (OMPI_COMM_WORLD_RANK and _SIZE:
// within one node rank 0 publishes the rendezvous in a file of the job's
// session directory, across nodes through the nodes' PMIx servers, and
// every rank then binds an address the other nodes reach unless
// Config.Addr or RVMA_ADDR names one); Slurm
// without PMI (SLURM_PROCID, SLURM_NTASKS and RVMA_RENDEZVOUS=host:port,
// where rank 0 serves the rendezvous); otherwise a world of size 1. It is
// collective: it returns once every rank has published its address.
func Init(ctx context.Context, cfg *Config) (*Comm, error) {
	env, err := cfg.fromEnv()
	if err != nil {
		return nil, err
	}
	conf := env.withDefaults()
	if conf.Provider == "loop" {
		return nil, fmt.Errorf("%w: the loop provider is in-process; use NewWorld", ErrBootstrap)
	}
	if err := conf.check(); err != nil {
		return nil, err
	}
	// A rank started with SIGINT ignored ("&" in a script) would not stop
	// on its launcher's SIGINT.
	if err := launch.ResetSignals(); err != nil {
		conf.Logger.Warn("rma: cannot reset ignored signals", "err", err)
	}
	ctx, cancel := context.WithTimeout(ctx, conf.Timeout)
	defer cancel()
	b, err := bootstrap(ctx)
	if err != nil {
		return nil, err
	}
	if env.Addr == "" && b.addr != "" {
		conf.Addr = b.addr
	}
	if env.Host == "" && b.host != "" {
		conf.Host = b.host
	}
	dev, err := verbs.Open(ctx, conf.deviceURI(""), &conf.Device)
	if err != nil && conf.Provider == "auto" {
		conf.Logger.Debug("rma: no shared memory; every peer over UDP", "err", err)
		conf.Provider = "udp"
		dev, err = verbs.Open(ctx, conf.deviceURI(""), &conf.Device)
	}
	if err != nil {
		b.store.Close()
		if b.srv != nil {
			b.srv.Close()
		}
		if b.published != "" {
			os.Remove(b.published)
		}
		return nil, fmt.Errorf("%w: %w", ErrBootstrap, err)
	}
	c, err := newComm(ctx, b, dev, conf)
	if err != nil {
		dev.Close()
		if b.srv != nil {
			b.srv.Close()
		}
		return nil, err
	}
	return c, nil
}

func envInt(name string) (int, bool, error) {
	s, ok := os.LookupEnv(name)
	if !ok {
		return 0, false, nil
	}
	v, err := strconv.Atoi(s)
	if err != nil {
		return 0, true, fmt.Errorf("%w: %s=%q is not a number", ErrBootstrap, name, s)
	}
	return v, true, nil
}

// boot is what a rank learns from its launcher: its place in the job, the
// rendezvous (and whether this process owns it, and serves it), and the
// job's key, which every connection of the control plane is authenticated
// with.
type boot struct {
	rank, size int
	store      kvs.Store
	own        bool        // store is this rank's to close
	srv        *kvs.Server // rank 0 serves the rendezvous (Slurm, Open MPI)
	key        []byte
	published  string // a file that publishes the rendezvous, removed once every rank has joined (Open MPI)
	addr       string // the address to bind when the user named none: one other nodes reach (Open MPI across nodes)
	host       string // the host identity when the user named none (Open MPI across nodes: the kernel's and the node's name)
	inc        uint32 // the rank's incarnation (rvmarun --restart)
	// recover, when the launcher can respawn ranks, is where the ranks
	// agree after a failure, and watch a second connection to it on which
	// a goroutine waits for faults (nil: Recover is not supported).
	recover, watch kvs.Recoverer
}

func bootstrap(ctx context.Context) (boot, error) {
	fail := func(err error) (boot, error) { return boot{}, err }
	check := func(rank, size int, src string) error {
		if size < 1 || rank < 0 || rank >= size {
			return fmt.Errorf("%w: %s gives rank %d of %d", ErrBootstrap, src, rank, size)
		}
		return nil
	}
	// 1. rvmarun.
	if r, ok, err := envInt(EnvRank); ok || err != nil {
		s, _, err2 := envInt(EnvSize)
		if err = errors.Join(err, err2, check(r, s, "RVMA_RANK/RVMA_SIZE")); err != nil {
			return fail(err)
		}
		addr := os.Getenv(EnvKVS)
		if addr == "" {
			return fail(fmt.Errorf("%w: RVMA_RANK is set but RVMA_KVS is not", ErrBootstrap))
		}
		key, err := launch.KeyFromEnv()
		if err != nil {
			return fail(fmt.Errorf("%w: %w", ErrBootstrap, err))
		}
		// End with rvmarun, even when started through a wrapper, which
		// rvmarun's parent-death signal does not reach past. Watched
		// before the dial below, which retries a refused rendezvous for
		// a minute: rvmarun's is up before its ranks start, so a refusal
		// means it is gone.
		launch.Watch(context.Background(), addr, &launch.WatchConfig{Key: key})
		cl, err := kvs.Dial(ctx, addr, key)
		if err != nil {
			return fail(fmt.Errorf("%w: %w", ErrBootstrap, err))
		}
		b := boot{rank: r, size: s, store: cl, own: true, key: key}
		if inc, ok, err := envInt(EnvIncarnation); ok || err != nil {
			// An rvmarun that respawns ranks: recovery is possible.
			if err == nil && (inc < 0 || inc > math.MaxUint32) {
				err = fmt.Errorf("%w: %s=%d", ErrBootstrap, EnvIncarnation, inc)
			}
			if err != nil {
				cl.Close()
				return fail(err)
			}
			watch, err := kvs.Dial(ctx, addr, key)
			if err != nil {
				cl.Close()
				return fail(fmt.Errorf("%w: %w", ErrBootstrap, err))
			}
			b.inc, b.recover, b.watch = uint32(inc), cl, watch
		}
		return b, nil
	}
	// 2. PMI over PMI_FD: Hydra's mpiexec, Slurm's srun --mpi=pmi2.
	version, err := pmiVersion()
	if err != nil {
		return fail(err)
	}
	if cl, ok, err := pmi.FromEnv(ctx, version); ok {
		if err != nil {
			if version != 0 {
				err = fmt.Errorf("%w (%s=%d)", err, EnvPMI, version)
			}
			return fail(fmt.Errorf("%w: %w", ErrBootstrap, err))
		}
		key, err := pmiKey(ctx, cl)
		if err != nil {
			cl.Close()
			return fail(fmt.Errorf("%w: %w", ErrBootstrap, err))
		}
		return boot{rank: cl.Rank(), size: cl.Size(), store: cl, own: true, key: key}, nil
	}
	// 3. Open MPI's mpirun.
	if b, ok, err := ompiBootstrap(ctx); ok {
		return b, err
	}
	// 4. Slurm without PMI-2.
	if r, ok, err := envInt("SLURM_PROCID"); ok || err != nil {
		s, _, err2 := envInt("SLURM_NTASKS")
		if err = errors.Join(err, err2, check(r, s, "SLURM_PROCID/SLURM_NTASKS")); err != nil {
			return fail(err)
		}
		addr := os.Getenv(EnvRendezvous)
		if addr == "" {
			return fail(fmt.Errorf("%w: a Slurm job without PMI needs srun --mpi=pmi2 (rank and rendezvous through PMI-2), or %s=host:port where rank 0 serves the rendezvous", ErrBootstrap, EnvRendezvous))
		}
		return rendezvousAt(ctx, r, s, addr, "a Slurm job")
	}
	// 5. Singleton.
	return boot{rank: 0, size: 1, store: kvs.NewMem(1), own: true, key: launch.NewKey()}, nil
}

// rendezvousAt is the bootstrap of rank r of s when the user names the
// rendezvous's address (Slurm without PMI, Open MPI across nodes): rank 0
// serves it there. Such launchers pass no secret: the job's key comes
// from a file the user made (RVMA_KEY_FILE), or RVMA_KEY; job names the
// launcher in errors.
func rendezvousAt(ctx context.Context, r, s int, addr, job string) (boot, error) {
	key, err := launch.KeyFromEnv()
	if err != nil {
		return boot{}, fmt.Errorf("%w: %s: %w", ErrBootstrap, job, err)
	}
	var srv *kvs.Server
	if r == 0 {
		if srv, err = kvs.ListenConfig(addr, s, &kvs.ServerConfig{Key: key}); err != nil {
			return boot{}, fmt.Errorf("%w: %s: rank 0 serves the rendezvous at %s=%s: %w", ErrBootstrap, job, EnvRendezvous, addr, err)
		}
	}
	cl, err := kvs.Dial(ctx, addr, key)
	if err != nil {
		if srv != nil {
			srv.Close()
		}
		return boot{}, fmt.Errorf("%w: %s: %w", ErrBootstrap, job, err)
	}
	return boot{rank: r, size: s, store: cl, own: true, srv: srv, key: key}, nil
}

// pmiVersion is the PMI version RVMA_PMI forces: 1, 2, or 0 (unset: ask
// for PMI-2, speak PMI-1 if the launcher answers so).
func pmiVersion() (int, error) {
	switch s := os.Getenv(EnvPMI); s {
	case "":
		return 0, nil
	case "1", "2":
		return int(s[0] - '0'), nil
	default:
		return 0, fmt.Errorf("%w: %s=%q: want 1 or 2 (unset: PMI-2 if the launcher speaks it, else PMI-1)", ErrBootstrap, EnvPMI, s)
	}
}

// pmiKey is the job's key under a PMI launcher: RVMA_KEY or RVMA_KEY_FILE
// if set, else one that rank 0 makes and publishes through PMI, whose
// key-value space the launcher serves to the job's processes only (over
// the descriptors it gave them).
func pmiKey(ctx context.Context, cl pmi.Session) ([]byte, error) {
	key, err := launch.KeyFromEnv()
	if !errors.Is(err, launch.ErrNoKey) {
		return key, err
	}
	if cl.Rank() == 0 {
		key = launch.NewKey()
		if err := cl.Put(ctx, "rvma-key", launch.EncodeKey(key)); err != nil {
			return nil, err
		}
	}
	if err := cl.Barrier(ctx); err != nil {
		return nil, err
	}
	if cl.Rank() == 0 {
		return key, nil
	}
	s, err := cl.Get(ctx, "rvma-key")
	if err != nil {
		return nil, err
	}
	return launch.DecodeKey(s)
}

// NewWorld starts size ranks in this process, as goroutines' communicators
// over the in-process loop provider (or with cfg.Provider "udp", "shm" or
// "auto", over those; Config.Hosts can then stand for several hosts). It is what tests and examples use instead of a
// launcher. Close every Comm, concurrently, when done.
func NewWorld(ctx context.Context, size int, cfg *Config) ([]*Comm, error) {
	conf := cfg.withDefaults()
	if cfg == nil || cfg.Provider == "" {
		conf.Provider = "loop"
	}
	if size < 1 {
		return nil, fmt.Errorf("%w: world of %d ranks", ErrBootstrap, size)
	}
	if err := conf.check(); err != nil {
		return nil, err
	}
	if conf.Devices != nil && len(conf.Devices) != size {
		return nil, fmt.Errorf("%w: %d devices for %d ranks", ErrBootstrap, len(conf.Devices), size)
	}
	if conf.Hosts != nil && len(conf.Hosts) != size {
		return nil, fmt.Errorf("%w: %d hosts for %d ranks", ErrBootstrap, len(conf.Hosts), size)
	}
	ctx, cancel := context.WithTimeout(ctx, conf.Timeout)
	defer cancel()
	var id [8]byte
	rand.Read(id[:])
	fabric := "loop://world-" + hex.EncodeToString(id[:])
	store := kvs.NewMem(size)
	key := launch.NewKey()
	comms := make([]*Comm, size)
	errs := make([]error, size)
	var wg sync.WaitGroup
	for r := range size {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var dev *verbs.Device
			if conf.Devices != nil {
				dev = conf.Devices[r]
			} else {
				var err error
				if dev, err = verbs.Open(ctx, conf.deviceURI(fabric), &conf.Device); err != nil {
					errs[r] = err
					return
				}
			}
			rc := conf
			if conf.Hosts != nil {
				rc.Host = conf.Hosts[r]
			}
			comms[r], errs[r] = newComm(ctx, boot{rank: r, size: size, store: store, key: key, recover: store, watch: store}, dev, rc)
			if errs[r] != nil {
				dev.Close()
			} else if conf.Devices == nil {
				comms[r].world = &world{uri: conf.deviceURI(fabric), store: store, key: key, cfg: rc}
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, c := range comms {
			if c != nil {
				c.teardown()
			}
		}
		return nil, fmt.Errorf("%w: %w", ErrBootstrap, err)
	}
	return comms, nil
}

// world is what a rank of NewWorld's needs to be started again.
type world struct {
	uri   string
	store *kvs.Mem
	key   []byte
	cfg   Config
}

func newComm(ctx context.Context, b boot, dev *verbs.Device, cfg Config) (_ *Comm, err error) {
	rank, size, store := b.rank, b.size, b.store
	c := &Comm{rank: rank, size: size, cfg: cfg, store: store, ownStore: b.own, kvServer: b.srv, published: b.published, key: b.key, dev: dev, inc: b.inc,
		byQPN: map[uint32]int{}, wins: map[uint32]*Win{}, dyns: map[uint32]*DynWin{}, done: make(chan struct{}), haulHalf: map[int]*haulPeer{}}
	c.bg, c.bgStop = context.WithCancel(context.Background())
	c.peers = make([]*peer, size)
	for i := range c.peers {
		c.peers[i] = &peer{ready: make(chan struct{})}
	}
	c.rec.init(c, b)
	defer func() {
		if err != nil {
			c.teardown()
		}
	}()
	if c.pd, err = dev.AllocPD(); err != nil {
		return nil, err
	}
	// The engine's waiters spin; the CQ itself must not, so that the
	// background poller sleeps when idle.
	if c.cq, err = dev.CreateCQ(verbs.CQConfig{Capacity: cqCapacity, Spin: -1}); err != nil {
		return nil, err
	}
	if c.srq, err = c.pd.CreateSRQ(verbs.SRQConfig{MaxWR: recvSlots, MaxSGE: 1}); err != nil {
		return nil, err
	}
	if err = c.recv.init(c.pd, c.srq); err != nil {
		return nil, err
	}
	c.reg.pd = c.pd
	c.msg.init(c.size)
	c.eng = progress.New(c.cq, progress.Config{OnRecv: c.onRecv, AfterPoll: c.flushBacklogs, Background: true, Err: c.errOf})
	c.doneReq = &Request{op: c.eng.Done(), name: "rma", rank: -1}
	go c.wakeProbes()
	c.target = mailbox.NewTarget(dev, nil)
	c.shmGID = -1
	if cfg.Provider == "auto" && cfg.Host != "" {
		c.shmGID = shmPort(dev)
	}
	if size > 1 {
		if c.shmGID >= 0 {
			if err = store.Put(ctx, c.rendezvousKey("host", rank, c.inc), cfg.Host); err != nil {
				return nil, err
			}
		}
		// Every other rank may dial at once (LockAll toward one target,
		// all on one host): the bounds on pending handshakes, which keep
		// outsiders' silent connections from crowding the job out, must
		// hold a job's worth.
		lc := &cm.ListenerConfig{Key: c.key, MaxPending: max(256, 2*size), MaxPendingPerHost: max(64, 2*size)}
		if c.ln, err = cm.Listen(ctx, cfg.cmAddr(), lc); err != nil {
			return nil, err
		}
		if err = store.Put(ctx, c.rendezvousKey("cm", rank, c.inc), c.ln.Addr().String()); err != nil {
			return nil, err
		}
		c.acceptWG.Add(1)
		go c.acceptLoop()
		if cfg.Paths > 1 {
			if err = c.listenPaths(ctx); err != nil {
				return nil, err
			}
		}
	}
	if c.inc > 0 {
		// A respawned rank: the others passed the rendezvous barrier long
		// ago, and it joins them in Recover; unless the first incarnation
		// died before anyone had joined (rvmarun respawns no rank while
		// the others join), when it joins them there.
		started, err := b.recover.Started(ctx)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrBootstrap, err)
		}
		if started {
			c.rec.start()
			return c, nil
		}
		c.rec.fresh.Store(false)
		c.rec.mu.Lock()
		c.rec.fault, c.rec.cancel = context.WithCancelCause(context.Background())
		c.rec.mu.Unlock()
	}
	if err = store.Barrier(ctx); err != nil {
		return nil, fmt.Errorf("%w: rendezvous barrier: %w", ErrBootstrap, err)
	}
	c.unpublish() // every rank has joined: the file is of no more use
	c.rec.start()
	return c, nil
}

// Close ends the communicator. It is collective: it waits (bounded by
// ctx) until every rank has called it, so that no rank tears down a
// connection another still uses; then it frees everything. Once an
// operation of the communicator has failed, it waits at most
// Config.CloseTimeout: the ranks that failed may never come.
func (c *Comm) Close(ctx context.Context) error {
	if c.closed() {
		return ErrClosed
	}
	var err error
	if c.size > 1 {
		if c.troubled.Load() {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, c.cfg.CloseTimeout)
			defer cancel()
		}
		if _, err = c.disseminate(ctx, "barrier", noRank, true); err != nil {
			err = opErr("close", -1, fmt.Errorf("the other ranks did not all close: %w", err))
			c.cfg.Logger.Warn("rma: closing without every rank", "rank", c.rank, "err", err)
		}
	}
	c.teardown()
	return err
}

func (c *Comm) teardown() {
	c.closeOnce.Do(func() {
		c.hb.close() // before the device (and the words) go
		close(c.done)
		c.bgStop()
		c.rec.stop()
		if c.ln != nil {
			c.ln.Close()
		}
		c.bridges.Wait()
		c.closePaths()
		c.acceptWG.Wait()
		c.closeHauls()
		if c.eng != nil {
			c.eng.Close()
		}
		c.dev.Close()
		if c.ownStore && c.store != nil {
			c.store.Close()
		}
		if c.kvServer != nil {
			c.kvServer.Close()
		}
		c.unpublish()
	})
}

// unpublish removes the file that published the rendezvous, if any.
func (c *Comm) unpublish() {
	if c.published != "" {
		os.Remove(c.published)
		c.published = ""
	}
}

func (c *Comm) closed() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

func (c *Comm) checkRank(op string, r int) error {
	if r < 0 || r >= c.size {
		return opErr(op, r, fmt.Errorf("%w: %d ranks", ErrRank, c.size))
	}
	return nil
}

// shmPort is the GID index of the device's first shm port, or -1.
func shmPort(dev *verbs.Device) int {
	for i := range dev.GIDs() {
		if dev.Provider(i) == verbs.ProviderSHM {
			return i
		}
	}
	return -1
}

// newQP creates a QP for a connection to rank r. Its number maps to r
// from the start: the peer may send as soon as its side is connected,
// before this side's connect call returns.
func (c *Comm) newQP(ctx context.Context, r int) (*verbs.QP, error) {
	gid, err := c.gidFor(ctx, r)
	if err != nil {
		return nil, err
	}
	qp, err := c.pd.CreateQP(verbs.QPConfig{Type: verbs.RC, SendCQ: c.cq, RecvCQ: c.cq, SRQ: c.srq,
		MaxSendWR: 4096, MaxSendSGE: maxSGE, GID: gid})
	if err != nil {
		return nil, err
	}
	c.qpnMu.Lock()
	c.byQPN[qp.Num()] = r
	c.qpnMu.Unlock()
	return qp, nil
}

// gidFor is the GID index of the connection to rank r: the shm port for a
// rank of this host under "auto", else the first port.
func (c *Comm) gidFor(ctx context.Context, r int) (int, error) {
	if c.shmGID < 0 {
		return 0, nil
	}
	if r == c.rank {
		return c.shmGID, nil
	}
	c.hostMu.Lock()
	h, ok := c.hosts[r]
	c.hostMu.Unlock()
	if !ok {
		var err error
		if h, err = c.lookup(ctx, "host", r, c.rec.incOf(r)); err != nil {
			return 0, err
		}
		c.hostMu.Lock()
		if c.hosts == nil {
			c.hosts = map[int]string{}
		}
		c.hosts[r] = h
		c.hostMu.Unlock()
	}
	if h == c.cfg.Host {
		return c.shmGID, nil
	}
	return 0, nil
}

// Transport names the provider of this rank's connection to rank r:
// "shm", "udp" or "loop", or "" before the first operation toward r
// connected it.
func (c *Comm) Transport(r int) string {
	if r < 0 || r >= c.size {
		return ""
	}
	p := c.peers[r]
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.qp == nil {
		return ""
	}
	return string(c.dev.Provider(p.qp.GIDIndex()))
}

// dropQP destroys a QP whose connection failed.
func (c *Comm) dropQP(qp *verbs.QP) {
	c.qpnMu.Lock()
	delete(c.byQPN, qp.Num())
	c.qpnMu.Unlock()
	qp.Destroy()
}

// Reasons a rank's listener refuses a connection: both ranks dialed at
// once (the dialer waits for the other's dial); the dialer's incarnation
// is newer than the last agreed (it retries, until this rank recovers);
// an incarnation is dead.
const (
	rejectCrossed    = "crossed"
	rejectRecovering = "recovering"
	rejectStale      = "stale incarnation"
)

// lookup reads what rank r's incarnation inc published. It is not cut
// short by ctx's end (a cut request closes the rendezvous's connection for
// good): the entry is there already, but for a rank still starting, which
// the job's timeout bounds.
func (c *Comm) lookup(ctx context.Context, what string, r int, inc uint32) (string, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.Timeout)
	defer cancel()
	return c.store.Get(ctx, c.rendezvousKey(what, r, inc))
}

// rendezvousKey is the rendezvous's key for what rank r's incarnation
// inc publishes (its connection manager's address, its host).
func (c *Comm) rendezvousKey(what string, r int, inc uint32) string {
	if inc == 0 {
		return fmt.Sprintf("rvma-%s-%d", what, r)
	}
	return fmt.Sprintf("rvma-%s-%d.%d", what, r, inc)
}

// conn returns the QP connected to rank r, connecting on first use. When
// both ranks dial each other at once, the lower rank's dial wins and the
// other waits for it to arrive through its listener.
func (c *Comm) conn(ctx context.Context, r int) (*verbs.QP, error) {
	p := c.peers[r]
	p.mu.Lock()
	qp, err := p.qp, p.err
	p.mu.Unlock()
	if qp != nil || err != nil {
		return qp, err
	}
	// Connecting may wait for a rank that died: a fault ends the wait.
	ctx, in := c.interruptible(ctx)
	defer in.end()
	qp, err = c.connect(ctx, r)
	if err != nil && !errors.Is(err, ErrPeer) {
		if e := in.err(ctx.Err()); e != nil && errors.Is(e, ErrPeer) {
			err = opErr("connect", r, e)
		}
	}
	return qp, err
}

// connect is conn's slow path.
func (c *Comm) connect(ctx context.Context, r int) (*verbs.QP, error) {
	p := c.peers[r]
	p.mu.Lock()
	if p.qp != nil || p.err != nil {
		qp, err := p.qp, p.err
		p.mu.Unlock()
		return qp, err
	}
	if r == c.rank {
		p.mu.Unlock()
		if err := c.selfConnect(); err != nil {
			return nil, err
		}
		return c.awaitPeer(ctx, r)
	}
	if p.dialing || p.accepting {
		p.mu.Unlock()
		return c.awaitPeer(ctx, r)
	}
	p.dialing = true
	p.mu.Unlock()

	qp, err := c.dial(ctx, r)
	p.mu.Lock()
	p.dialing = false
	if err == nil {
		c.established(r, p, qp)
		p.mu.Unlock()
		return qp, nil
	}
	p.mu.Unlock()
	var rej *cm.RejectError
	if errors.As(err, &rej) && rej.Reason == rejectCrossed {
		return c.awaitPeer(ctx, r)
	}
	return nil, opErr("connect", r, fmt.Errorf("%w: %w", ErrPeer, err))
}

// established records a connected QP; p.mu is held.
func (c *Comm) established(r int, p *peer, qp *verbs.QP) {
	lockcheck.AssertHeld(&p.mu, "rma: a connection is recorded")
	p.qp, p.inc = qp, c.rec.incOf(r)
	close(p.ready)
}

func (c *Comm) awaitPeer(ctx context.Context, r int) (*verbs.QP, error) {
	p := c.peers[r]
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	p.mu.Lock()
	ready := p.ready
	p.mu.Unlock()
	select {
	case <-ready:
	case <-ctx.Done():
		return nil, opErr("connect", r, fmt.Errorf("%w: %w", ErrPeer, ctx.Err()))
	case <-c.done:
		return nil, opErr("connect", r, ErrClosed)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.qp, p.err
}

func (c *Comm) dial(ctx context.Context, r int) (*verbs.QP, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	// The incarnation the ranks last agreed on: a stale entry of a dead
	// one is never read, and the next one's is waited for.
	inc := c.rec.incOf(r)
	addr, err := c.lookup(ctx, "cm", r, inc)
	if err != nil {
		return nil, err
	}
	qp, err := c.newQP(ctx, r)
	if err != nil {
		return nil, err
	}
	var me [12]byte
	binary.BigEndian.PutUint32(me[:], uint32(c.rank))
	binary.BigEndian.PutUint32(me[4:], c.inc)
	binary.BigEndian.PutUint32(me[8:], inc)
	for backoff := time.Millisecond; ; backoff = min(2*backoff, 100*time.Millisecond) {
		_, err := cm.Dial(ctx, addr, qp, &cm.Config{Connect: &c.cfg.Connect, PrivateData: me[:], Key: c.key})
		if err == nil {
			return qp, nil
		}
		var rej *cm.RejectError
		if !errors.Is(err, cm.ErrBusy) && !(errors.As(err, &rej) && rej.Reason == rejectRecovering) || ctx.Err() != nil {
			c.dropQP(qp)
			return nil, err
		}
		// The listener had too many handshakes pending (outsiders'
		// silent connections, or more of the job than it holds): try
		// again, as a SYN retransmits, until the deadline.
		if err := qp.Reset(); err != nil {
			c.dropQP(qp)
			return nil, err
		}
		select {
		case <-time.After(backoff/2 + time.Duration(mrand.Int64N(int64(backoff)))):
		case <-ctx.Done():
			c.dropQP(qp)
			return nil, err
		}
	}
}

func (c *Comm) acceptLoop() {
	defer c.acceptWG.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-c.done
		cancel()
	}()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		req, err := c.ln.Accept(ctx)
		if err != nil {
			return
		}
		pd := req.PrivateData()
		if len(pd) == 5 && (pd[4] == haulHeader || pd[4] == haulData) && int(binary.BigEndian.Uint32(pd)) < c.size &&
			req.Type() == verbs.UC && c.cfg.LongHaul != nil {
			wg.Add(1)
			go func() {
				defer wg.Done()
				actx, acancel := context.WithTimeout(ctx, c.cfg.Timeout)
				defer acancel()
				c.acceptHaul(actx, req, int(binary.BigEndian.Uint32(pd)), pd[4])
			}()
			continue
		}
		if len(pd) != 12 || int(binary.BigEndian.Uint32(pd)) >= c.size || req.Type() != verbs.RC {
			req.Reject("not a rank of this job")
			continue
		}
		r := int(binary.BigEndian.Uint32(pd))
		if reason := c.rec.admit(r, binary.BigEndian.Uint32(pd[4:]), binary.BigEndian.Uint32(pd[8:])); reason != "" {
			req.Reject(reason)
			continue
		}
		p := c.peers[r]
		p.mu.Lock()
		if p.qp != nil || p.accepting || (p.dialing && c.rank < r) {
			p.mu.Unlock()
			req.Reject(rejectCrossed)
			continue
		}
		p.accepting = true
		p.mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			actx, acancel := context.WithTimeout(ctx, c.cfg.Timeout)
			defer acancel()
			qp, err := c.newQP(actx, r)
			if err == nil {
				if err = req.Accept(actx, qp, &cm.Config{Connect: &c.cfg.Connect}); err != nil {
					c.dropQP(qp)
				}
			}
			p.mu.Lock()
			defer p.mu.Unlock()
			p.accepting = false
			if err != nil {
				c.cfg.Logger.Debug("rma: accept failed", "rank", c.rank, "peer", r, "err", err)
				return // the dialer fails or retries; this side stays unconnected
			}
			c.established(r, p, qp)
		}()
	}
}

// selfConnect connects a QP to itself (loopback), for operations a rank
// aims at itself.
func (c *Comm) selfConnect() error {
	p := c.peers[c.rank]
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.qp != nil || p.err != nil {
		return p.err
	}
	qp, err := c.newQP(c.bg, c.rank)
	if err == nil {
		ep := qp.Endpoint()
		if err = qp.Connect(ep, &c.cfg.Connect); err != nil {
			c.dropQP(qp)
		}
	}
	if err != nil {
		p.err = opErr("connect", c.rank, err)
		close(p.ready)
		return p.err
	}
	c.established(c.rank, p, qp)
	return nil
}

// peerOf maps a local QP number to its peer's rank.
func (c *Comm) peerOf(qpn uint32) (int, bool) {
	c.qpnMu.Lock()
	defer c.qpnMu.Unlock()
	r, ok := c.byQPN[qpn]
	return r, ok
}
