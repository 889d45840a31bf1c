// Command halo3d is a 3-D Jacobi stencil on a grid of ranks that exchanges
// six faces per iteration, with a choice of synchronisation:
//
//	rvmarun -n 4 halo3d [-n 64] [--iters 100] [--warmup 10]
//	        [--sync sendrecv,fence,pscw,lock,notify] [--exchange-only] [--json]
//	rvmarun -n 4 --restart 1 --kill 1@1s halo3d --sync notify --checkpoint 10
//
// It solves the same problem as an MPI halo-exchange benchmark
// (an N^3 block of doubles per rank plus one ghost layer, a non-periodic
// process grid chosen like MPI_Dims_create, the global x=0 face fixed at
// 1.0 and the other global faces at 0.0, the interior starting at
// ((3gx+5gy+7gz) mod 11)/10), so its checksum (the global sum of the
// interior) can be compared with that program's and with a serial run,
// which rank 0 computes.
//
// Variants: sendrecv packs faces and sends them as messages (the two-sided
// baseline); fence, pscw and lock put the faces into the neighbours'
// ghost layers and synchronise as MPI's halo codes do (lock: flush, then
// an accumulate on a counter the target polls); notify puts them into an
// RVMA-notified window whose target waits for the bytes it expects, with
// no other synchronisation. Faces that are not contiguous travel without a
// put per element: strided layouts, packed for blocks of one element.
//
// With --checkpoint N the notify variant survives a rank's death under
// rvmarun --restart: its window keeps replicated snapshots every N
// iterations, and on ErrPeer every rank recovers and goes on from the
// restored iteration, to the fault-free checksum (see checkpoint.go).
package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"runtime/pprof"
	exectrace "runtime/trace"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/rvma/rvma/internal/spin"
	"github.com/rvma/rvma/rma"
)

type options struct {
	n, iters, warmup   int
	local              [3]int
	syncs              []string
	exchangeOnly       bool
	json               bool
	serial             bool
	checkpoint         int
	failRank, failStep int
	trace              bool
	execTrace          string // rank 0's Go execution trace of the variants (not the reference run)
}

func main() {
	var o options
	var local, syncs string
	flag.IntVar(&o.n, "n", 64, "interior points per rank along each axis")
	flag.StringVar(&local, "l", "", "local block NX,NY,NZ (overrides -n)")
	flag.IntVar(&o.iters, "iters", 100, "timed iterations")
	flag.IntVar(&o.warmup, "warmup", 10, "untimed iterations first")
	flag.StringVar(&syncs, "sync", "sendrecv,fence,pscw,lock,notify", "variants to run, comma-separated, in order")
	flag.BoolVar(&o.exchangeOnly, "exchange-only", false, "skip the stencil: time the exchange and its synchronisation only")
	flag.BoolVar(&o.json, "json", false, "print one JSON line per variant (rank 0)")
	flag.BoolVar(&o.serial, "serial", true, "rank 0 also solves the whole grid serially and checks the checksum")
	flag.IntVar(&o.checkpoint, "checkpoint", 0, "notify: snapshot the window every N iterations and replicate it at the next rank, and recover from a rank's death (rvmarun --restart); 0: off")
	flag.IntVar(&o.failRank, "fail-rank", -1, "notify: rank that kills itself with SIGKILL (incarnation 0 only; -1: none; rvmarun --kill kills from outside)")
	flag.IntVar(&o.failStep, "fail-step", 5, "iteration (warm-up included, from 1) in which --fail-rank does, after putting its faces")
	flag.BoolVar(&o.trace, "trace", false, "print wall-clock timestamps (Unix microseconds) of start, Init, failures and recoveries to stderr")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of rank 0 to this file")
	flag.StringVar(&o.execTrace, "exectrace", "", "write a Go execution trace of rank 0's variants (not its reference run) to this file (go tool trace)")
	flag.Parse()
	start := time.Now()
	o.local = [3]int{o.n, o.n, o.n}
	if local != "" {
		if _, err := fmt.Sscanf(local, "%d,%d,%d", &o.local[0], &o.local[1], &o.local[2]); err != nil {
			fail(fmt.Errorf("-l NX,NY,NZ: %w", err))
		}
	}
	o.syncs = strings.Split(syncs, ",")
	for _, s := range o.syncs {
		if !slices.Contains([]string{"sendrecv", "fence", "pscw", "lock", "notify"}, s) {
			fail(fmt.Errorf("unknown --sync variant %q", s))
		}
	}
	if o.iters < 1 || o.warmup < 0 || min(o.local[0], o.local[1], o.local[2]) < 1 {
		fail(fmt.Errorf("bad sizes"))
	}
	if o.checkpoint < 0 {
		fail(fmt.Errorf("--checkpoint %d: want 0 (off) or more", o.checkpoint))
	}
	if o.checkpoint > 0 && !slices.Equal(o.syncs, []string{"notify"}) {
		fail(fmt.Errorf("--checkpoint applies to --sync notify alone, not %q", syncs))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	comm, err := rma.Init(ctx, nil)
	if err != nil {
		fail(err)
	}
	if o.trace {
		trace(comm, "start", start)
		trace(comm, "init", time.Now())
	}
	if *cpuprofile != "" && comm.Rank() == 0 {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fail(err)
		}
		pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	ok, err := run(ctx, comm, o)
	if err != nil {
		// Said before Close, which waits for the other ranks: one that
		// failed may never come.
		fmt.Fprintln(os.Stderr, "halo3d:", err)
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		comm.Close(cctx)
		ccancel()
		os.Exit(2)
	}
	if err := comm.Close(ctx); err != nil {
		if !ok || o.checkpoint == 0 {
			fail(err)
		}
		// Recovering runs: the result is in and checked, and a rank
		// that died (or left first) while the ranks close changes
		// nothing of it.
		fmt.Fprintln(os.Stderr, "halo3d: closing:", err)
	}
	if !ok {
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "halo3d:", err)
	os.Exit(2)
}

// trace prints an event's wall-clock time (--trace), for measuring
// recovery across processes: "halo3d: trace RANK INC EVENT UNIX_MICROS".
func trace(c *rma.Comm, event string, t time.Time) {
	fmt.Fprintf(os.Stderr, "halo3d: trace %d %d %s %d\n", c.Rank(), c.Incarnation(), event, t.UnixMicro())
}

// dimsCreate splits p ranks over 3 dimensions as evenly as possible,
// largest first, as MPI_Dims_create does.
func dimsCreate(p int) [3]int {
	var primes []int
	for f := 2; f*f <= p; f++ {
		for p%f == 0 {
			primes = append(primes, f)
			p /= f
		}
	}
	if p > 1 {
		primes = append(primes, p)
	}
	d := [3]int{1, 1, 1}
	for i := len(primes) - 1; i >= 0; i-- {
		k := 0
		for j := 1; j < 3; j++ {
			if d[j] < d[k] {
				k = j
			}
		}
		d[k] *= primes[i]
	}
	slices.SortFunc(d[:], func(a, b int) int { return b - a })
	return d
}

// grid is one rank's block: two padded arrays (and a counter for the lock
// variant) in one window's memory.
type grid struct {
	nx, ny, nz int
	sx, sy     int // strides in elements (z stride 1)
	v          int // padded volume
	dims       [3]int
	coords     [3]int
	nbr        [3][2]int // neighbour rank per dim and side, -1 if none
	nbrs       []int
	mem        []byte
	u          [2][]float64
	counter    []byte
	// notify: z faces travel packed (and y faces with --checkpoint).
	// send[d][par][side] holds my packed face; stage[d][par][side] (in
	// the window, at stageOff) is where the neighbour on that side puts
	// its face in epochs of parity par.
	send     [3][2][2][]float64
	stage    [3][2][2][]float64
	stageOff [3][2][2]int
	// --checkpoint: x and y faces are staged too, so that no put lands
	// in an array, and the notified window
	// starts nbase bytes into mem: at u[1] with an even interval (the
	// state at a checkpoint is then always in u[1]; u[0] is outside and
	// the snapshots half as big), else at u[0].
	stageAll bool
	nbase    int
	// hdr (in the window, last) holds what a respawned rank must get
	// back with the window (--checkpoint): hdr[0] is the reference
	// checksum, NaN until the sendrecv run computed it.
	hdr []float64
}

// newGrid lays out rank's block in memory that alloc returns (zeroed,
// 8-byte aligned), given the number of bytes it needs.
func newGrid(rank, size int, local [3]int, checkpoint int, alloc func(n int) ([]byte, error)) (*grid, error) {
	g := &grid{nx: local[0], ny: local[1], nz: local[2], dims: dimsCreate(size), stageAll: checkpoint > 0}
	g.sy = g.nz + 2
	g.sx = (g.ny + 2) * g.sy
	g.v = (g.nx + 2) * g.sx
	g.coords = [3]int{rank / (g.dims[1] * g.dims[2]), rank / g.dims[2] % g.dims[1], rank % g.dims[2]}
	for d := range 3 {
		for s, delta := range []int{-1, 1} {
			c := g.coords
			c[d] += delta
			g.nbr[d][s] = -1
			if c[d] >= 0 && c[d] < g.dims[d] {
				g.nbr[d][s] = (c[0]*g.dims[1]+c[1])*g.dims[2] + c[2]
				g.nbrs = append(g.nbrs, g.nbr[d][s])
			}
		}
	}
	// Two arrays, six counters (lock), then the notify variant's staging
	// for y and z faces (and x faces), then the header.
	n := 2*g.v + 6 + 1
	for d := range 3 {
		if g.staged(d) {
			n += 4 * g.notifyBytes(d) / 8
		}
	}
	if checkpoint > 0 && checkpoint%2 == 0 {
		g.nbase = 8 * g.v
	}
	mem, err := alloc(8 * n)
	if err != nil {
		return nil, err
	}
	g.mem = mem
	words := unsafe.Slice((*float64)(unsafe.Pointer(&mem[0])), n)
	g.u = [2][]float64{words[:g.v], words[g.v : 2*g.v]}
	g.counter = g.mem[16*g.v : 16*g.v+48]
	o := 2*g.v + 6
	for d := range 3 {
		if !g.staged(d) {
			continue
		}
		f := g.notifyBytes(d) / 8
		for par := range 2 {
			for side := range 2 {
				if d > 0 {
					g.send[d][par][side] = make([]float64, f)
				}
				g.stage[d][par][side], g.stageOff[d][par][side] = words[o:o+f], 8*o
				o += f
			}
		}
	}
	g.hdr = words[o : o+1]
	return g, nil
}

func (g *grid) idx(i, j, k int) int { return i*g.sx + j*g.sy + k }

// staged reports whether the notify variant's neighbours put faces of
// dimension d into staging rather than into the arrays: z faces, whose
// blocks are single elements, travel packed; with --checkpoint all do.
// x and y faces (rows of nz) are otherwise put in place, one strided put
// each, which the origin places row by row into a neighbour on this host.
func (g *grid) staged(d int) bool { return d == 2 || g.stageAll }

// initArrays sets the initial state of both arrays.
func (g *grid) initArrays() {
	ox, oy, oz := g.coords[0]*g.nx, g.coords[1]*g.ny, g.coords[2]*g.nz
	for a := range 2 {
		initArray(g.u[a], g.nx, g.ny, g.nz, ox, oy, oz, g.coords[0] == 0)
	}
	clear(g.counter)
}

func initArray(u []float64, ax, ay, az, ox, oy, oz int, xlo bool) {
	ty := az + 2
	tx := (ay + 2) * ty
	clear(u)
	for i := 1; i <= ax; i++ {
		for j := 1; j <= ay; j++ {
			for k := 1; k <= az; k++ {
				u[i*tx+j*ty+k] = float64((3*(ox+i)+5*(oy+j)+7*(oz+k))%11) / 10.0
			}
		}
	}
	if xlo {
		for c := range (ay + 2) * (az + 2) {
			u[c] = 1.0
		}
	}
}

func jacobi(un, u []float64, ax, ay, az, tx, ty int) {
	for i := 1; i <= ax; i++ {
		for j := 1; j <= ay; j++ {
			c := i*tx + j*ty + 1
			// Equal-length slices let the compiler drop bounds checks; the
			// sum's order is the C program's, so results match bit for bit.
			row := un[c : c+az]
			up, dn := u[c-tx:c-tx+az], u[c+tx:c+tx+az]
			n, s := u[c-ty:c-ty+az], u[c+ty:c+ty+az]
			w, e := u[c-1:c-1+az], u[c+1:c+1+az]
			for k := range row {
				row[k] = (up[k] + dn[k] + n[k] + s[k] + w[k] + e[k]) / 6.0
			}
		}
	}
}

func interiorSum(u []float64, ax, ay, az, tx, ty int) float64 {
	s := 0.0
	for i := 1; i <= ax; i++ {
		for j := 1; j <= ay; j++ {
			for k := 1; k <= az; k++ {
				s += u[i*tx+j*ty+k]
			}
		}
	}
	return s
}

// face describes my boundary face on side s of dimension d and the
// neighbour's ghost layer it fills, as (byte offset, layout) pairs within
// one array; for z faces one pair per x row.
type facePart struct {
	src, dst int // byte offsets within the array
	l        rma.Layout
}

func (g *grid) face(d, s int) []facePart {
	n := [3]int{g.nx, g.ny, g.nz}
	mine := 1
	if s == 1 {
		mine = n[d]
	}
	ghost := n[d] + 1 // the neighbour's ghost plane on side 1-s
	if s == 1 {
		ghost = 0
	}
	switch d {
	case 0: // rows j=1..ny of plane i, ghost columns included: contiguous
		l := rma.Layout{Count: 1, Block: 8 * g.ny * g.sy, Stride: 8 * g.ny * g.sy}
		return []facePart{{8 * g.idx(mine, 1, 0), 8 * g.idx(ghost, 1, 0), l}}
	case 1: // one row of nz per i
		l := rma.Layout{Count: g.nx, Block: 8 * g.nz, Stride: 8 * g.sx}
		return []facePart{{8 * g.idx(1, mine, 1), 8 * g.idx(1, ghost, 1), l}}
	default: // one element per (i, j); with the ghost rows j=0 and ny+1
		// included (never read at the target) the stride is uniform, sy,
		// so the face is one strided put (packed: its blocks are 8 bytes)
		l := rma.Layout{Count: g.nx * (g.ny + 2), Block: 8, Stride: 8 * g.sy}
		return []facePart{{8 * g.idx(1, 0, mine), 8 * g.idx(1, 0, ghost), l}}
	}
}

// faceBytes is the size of a face's interior, as sendrecv packs it.
func (g *grid) faceBytes(d int) int {
	return 8 * [3]int{g.ny * g.nz, g.nx * g.nz, g.nx * g.ny}[d]
}

// notifyBytes is what a neighbour across dimension d puts into a notified
// window per epoch: x faces as put by face(), y and z faces packed.
func (g *grid) notifyBytes(d int) int {
	if d > 0 {
		return g.faceBytes(d)
	}
	return g.face(d, 0)[0].l.Size()
}

// putFaces puts my faces of array cur into the neighbours' ghost layers.
// With want it appends their requests to reqs; otherwise the caller's
// synchronisation completes them (plain puts ask for no completions).
func (g *grid) putFaces(ctx context.Context, w *rma.Win, cur int, want bool, reqs []*rma.Request) ([]*rma.Request, error) {
	base := cur * 8 * g.v
	for d := range 3 {
		for s := range 2 {
			r := g.nbr[d][s]
			if r < 0 {
				continue
			}
			if d == 0 && want && g.stageAll {
				// notify, --checkpoint: my x face (contiguous) into the
				// neighbour's staging.
				p := g.face(d, s)[0]
				req, err := w.Rput(ctx, g.mem[base+p.src:base+p.src+p.l.Extent()], r, g.stageOff[d][cur][1-s]-g.nbase)
				if err != nil {
					return reqs, err
				}
				reqs = append(reqs, req)
				continue
			}
			if d > 0 && want && g.staged(d) {
				// notify: z faces (y faces too with --checkpoint), packed
				// here, land contiguous in the neighbour's staging and are
				// unpacked after the epoch: a z face put in place would be
				// one placement per element.
				buf := g.send[d][cur][s]
				g.pack(g.u[cur], d, s, buf, false)
				b := unsafe.Slice((*byte)(unsafe.Pointer(&buf[0])), 8*len(buf))
				req, err := w.Rput(ctx, b, r, g.stageOff[d][cur][1-s]-g.nbase)
				if err != nil {
					return reqs, err
				}
				reqs = append(reqs, req)
				continue
			}
			for _, p := range g.face(d, s) {
				src := g.mem[base+p.src : base+p.src+p.l.Extent()]
				if !want {
					if err := w.PutLayout(ctx, src, p.l, r, base+p.dst, p.l); err != nil {
						return nil, err
					}
					continue
				}
				req, err := w.RputLayout(ctx, src, p.l, r, base+p.dst, p.l)
				if err != nil {
					return reqs, err
				}
				reqs = append(reqs, req)
			}
		}
	}
	return reqs, nil
}

// pack copies my face (d, s) of array u into buf, or unpacks buf into the
// ghost layer on side s when unpack is set.
func (g *grid) pack(u []float64, d, s int, buf []float64, unpack bool) {
	n := [3]int{g.nx, g.ny, g.nz}
	plane := 1
	switch {
	case unpack && s == 0:
		plane = 0
	case unpack && s == 1:
		plane = n[d] + 1
	case s == 1:
		plane = n[d]
	}
	// Straight loops, no function per element: this copy is the notify
	// variant's datatype engine, on its critical path.
	m := 0
	switch d {
	case 0: // x face: one contiguous block of ny rows
		for j := 1; j <= g.ny; j++ {
			at := g.idx(plane, j, 1)
			copyRow(u[at:at+g.nz], buf[m:m+g.nz], unpack)
			m += g.nz
		}
	case 1: // y face: a row of nz per x
		for i := 1; i <= g.nx; i++ {
			at := g.idx(i, plane, 1)
			copyRow(u[at:at+g.nz], buf[m:m+g.nz], unpack)
			m += g.nz
		}
	default: // z face: one element per (x, y), sy apart
		for i := 1; i <= g.nx; i++ {
			at := g.idx(i, 1, plane)
			row := buf[m : m+g.ny]
			if unpack {
				for j, x := range row {
					u[at+j*g.sy] = x
				}
			} else {
				for j := range row {
					row[j] = u[at+j*g.sy]
				}
			}
			m += g.ny
		}
	}
}

// copyRow copies buf into the grid's row, or the row into buf.
func copyRow(row, buf []float64, unpack bool) {
	if unpack {
		copy(row, buf)
	} else {
		copy(buf, row)
	}
}

// unstage unpacks the z faces (every face with --checkpoint) of
// an epoch of parity cur from the notify variant's staging into the ghost
// layers of array cur.
func (g *grid) unstage(cur int) {
	for d := range 3 {
		for s := range 2 {
			if !g.staged(d) || g.nbr[d][s] < 0 {
				continue
			}
			if d > 0 {
				g.pack(g.u[cur], d, s, g.stage[d][cur][s], true)
				continue
			}
			ghost := 0
			if s == 1 {
				ghost = g.nx + 1
			}
			at := g.idx(ghost, 1, 0)
			copy(g.u[cur][at:at+len(g.stage[d][cur][s])], g.stage[d][cur][s])
		}
	}
}

type variant struct {
	comm *rma.Comm
	g    *grid
	win  *rma.Win // plain window over the arrays and the counter
	nwin *rma.Win // notified window over the same memory
	bufs [3][2][]float64
	// notify: the puts of the last iteration, and a slice to reuse
	pending, spare []*rma.Request
	// sendrecv's tags start here: after a recovery, messages of an
	// interrupted run that still wait in an inbox match no receive
	tagBase int
	o       options
}

func f64s(b []byte) []float64 { return unsafe.Slice((*float64)(unsafe.Pointer(&b[0])), len(b)/8) }

func (v *variant) exchange(ctx context.Context, sync string, cur int, iter int64) error {
	g, w := v.g, v.win
	switch sync {
	case "sendrecv":
		var reqs []*rma.Request
		for d := range 3 {
			for s := range 2 {
				if r := g.nbr[d][s]; r >= 0 {
					g.pack(g.u[cur], d, s, v.bufs[d][s], false)
					b := unsafe.Slice((*byte)(unsafe.Pointer(&v.bufs[d][s][0])), 8*len(v.bufs[d][s]))
					req, err := v.comm.Isend(ctx, r, v.tagBase+2*d+s, b)
					if err != nil {
						return err
					}
					reqs = append(reqs, req)
				}
			}
		}
		for d := range 3 {
			for s := range 2 {
				if r := g.nbr[d][s]; r >= 0 {
					m, err := v.comm.Recv(ctx, r, v.tagBase+2*d+(1-s)) // sent towards side 1-s
					if err != nil {
						return err
					}
					g.pack(g.u[cur], d, s, f64s(m), true)
				}
			}
		}
		return rma.WaitAll(ctx, reqs...)
	case "fence":
		if err := w.Fence(ctx, rma.ModeNoPrecede); err != nil {
			return err
		}
		if _, err := g.putFaces(ctx, w, cur, false, nil); err != nil {
			return err
		}
		return w.Fence(ctx, rma.ModeNoStore|rma.ModeNoSucceed)
	case "pscw":
		if err := w.Post(ctx, g.nbrs, 0); err != nil {
			return err
		}
		if err := w.Start(ctx, g.nbrs, 0); err != nil {
			return err
		}
		if _, err := g.putFaces(ctx, w, cur, false, nil); err != nil {
			return err
		}
		if err := w.Complete(ctx); err != nil {
			return err
		}
		return w.Wait(ctx)
	case "lock":
		if _, err := g.putFaces(ctx, w, cur, false, nil); err != nil {
			return err
		}
		if err := w.FlushAll(ctx); err != nil {
			return err
		}
		// One counter per direction, not one per rank as in the MPI
		// program: with a single counter a neighbour already one
		// iteration ahead can make up for one that is behind, and the
		// target reads a ghost layer that has not arrived (it happens
		// with 4 ranks).
		one := binary.LittleEndian.AppendUint64(nil, 1)
		for d := range 3 {
			for s := range 2 {
				if r := g.nbr[d][s]; r >= 0 {
					if err := w.Accumulate(ctx, one, rma.Int64, rma.Sum, r, 16*g.v+8*(2*d+1-s)); err != nil {
						return err
					}
				}
			}
		}
		if err := w.FlushAll(ctx); err != nil {
			return err
		}
		// The unified memory model lets a rank read its own window: an
		// atomic load sees the accumulates, which are atomic updates.
		for d := range 3 {
			for s := range 2 {
				if g.nbr[d][s] < 0 {
					continue
				}
				c := (*int64)(unsafe.Pointer(&g.counter[8*(2*d+s)]))
				// Spin for up to 200us, yielding the core now and then
				// so that ranks sharing it (oversubscription) run, then
				// nap: a neighbour's puts are copies and take
				// microseconds, a timer nap tens of them at best.
				var deadline time.Time
				for i := 0; atomic.LoadInt64(c) < iter; i++ {
					if err := ctx.Err(); err != nil {
						return err
					}
					if i&63 == 63 {
						if now := time.Now(); deadline.IsZero() {
							deadline = now.Add(200 * time.Microsecond)
						} else if now.After(deadline) {
							time.Sleep(20 * time.Microsecond)
							continue
						}
					}
					spin.Pause(i)
				}
			}
		}
		w.Sync()
		return nil
	case "notify":
		// No synchronisation but the target's epoch. The puts of the
		// previous iteration read the array this iteration's stencil
		// overwrites, so they must have completed first (they have,
		// almost always: the neighbour's data of this epoch came later).
		prev := v.pending
		var err error
		if v.pending, err = g.putFaces(ctx, v.nwin, cur, true, v.spare[:0]); err != nil {
			return err
		}
		if iter == int64(v.o.failStep) && v.comm.Rank() == v.o.failRank && v.comm.Incarnation() == 0 {
			// A real failure (--fail-rank): the process is gone, its
			// memory with it, with its faces of this epoch on their way.
			if v.o.trace {
				trace(v.comm, "kill", time.Now())
			}
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
		if len(g.nbrs) > 0 { // a lone rank expects nothing
			if _, err := v.nwin.WaitEpoch(ctx); err != nil {
				return err
			}
		}
		g.unstage(cur)
		err = rma.WaitAll(ctx, prev...)
		v.spare = prev
		return err
	}
	return fmt.Errorf("unknown variant %q", sync)
}

type result struct {
	Example   string  `json:"example"`
	Sync      string  `json:"sync"`
	Ranks     int     `json:"ranks"`
	Dims      string  `json:"dims"`
	N         int     `json:"n"`
	Iters     int     `json:"iters"`
	Warmup    int     `json:"warmup"`
	Compute   bool    `json:"compute"`
	USPerIter float64 `json:"us_per_iter"`
	Checksum  float64 `json:"checksum"`
	OK        bool    `json:"ok"`
	// --checkpoint: the snapshot interval, and how many times the ranks
	// recovered from a death
	Checkpoint int `json:"checkpoint,omitempty"`
	Recoveries int `json:"recoveries,omitempty"`
}

func run(ctx context.Context, comm *rma.Comm, o options) (bool, error) {
	// The memory is the plain window's, allocated by the library (as
	// MPI_Win_allocate): on one host the ranks map each other's, so a put
	// is a copy by the origin, and so is a notified put into the window
	// made over part of it.
	v := &variant{comm: comm, o: o}
	g, err := newGrid(comm.Rank(), comm.Size(), o.local, o.checkpoint, func(n int) ([]byte, error) {
		var err error
		if v.win, err = comm.Allocate(ctx, n, nil); err != nil {
			return nil, err
		}
		return v.win.Bytes(), nil
	})
	if err != nil {
		return false, err
	}
	v.g = g
	for d := range 3 {
		for s := range 2 {
			v.bufs[d][s] = make([]float64, g.faceBytes(d)/8)
		}
	}
	expect := map[int]int{}
	for d := range 3 {
		for s := range 2 {
			if r := g.nbr[d][s]; r >= 0 {
				expect[r] = g.notifyBytes(d)
			}
		}
	}
	var ncfg *rma.NotifyConfig
	if len(expect) > 0 {
		ncfg = &rma.NotifyConfig{ExpectFrom: expect}
	} else {
		ncfg = &rma.NotifyConfig{Expect: 1} // a lone rank: nothing ever arrives
	}
	if o.checkpoint > 0 {
		ncfg.History, ncfg.Every, ncfg.Replicate = history(g.dims, o.checkpoint), o.checkpoint, true
	}
	if v.nwin, err = comm.Create(ctx, g.mem[g.nbase:], &rma.WinConfig{Notify: ncfg}); err != nil {
		return false, err
	}
	if o.checkpoint > 0 {
		return v.runCheckpointed(ctx)
	}
	// sendrecv's checksum is the reference, as in the MPI program.
	var ref float64
	haveRef := false
	order := o.syncs
	if order[0] != "sendrecv" {
		order = append([]string{"sendrecv-ref"}, order...)
	}
	allOK := true
	var results []result
	for _, sync := range order {
		name := strings.TrimSuffix(sync, "-ref")
		if o.execTrace != "" && comm.Rank() == 0 && sync != "sendrecv-ref" && !exectrace.IsEnabled() {
			// Where the scheduler kept a goroutine waiting shows there
			// (go tool trace -pprof=sched), not in a CPU profile.
			f, err := os.Create(o.execTrace)
			if err != nil {
				return false, err
			}
			defer f.Close()
			if err := exectrace.Start(f); err != nil {
				return false, err
			}
			defer exectrace.Stop()
		}
		var us, sum float64
		// Labelled, so that a --cpuprofile splits by variant (pprof
		// -tagfocus sync=notify).
		pprof.Do(ctx, pprof.Labels("sync", sync), func(ctx context.Context) {
			us, sum, err = v.run(ctx, name, o)
		})
		if err != nil {
			return false, fmt.Errorf("%s: %w", name, err)
		}
		if !haveRef {
			ref, haveRef = sum, true
		}
		if sync == "sendrecv-ref" {
			continue
		}
		r := result{Example: "halo3d", Sync: name, Ranks: comm.Size(), Dims: fmt.Sprintf("%dx%dx%d", g.dims[0], g.dims[1], g.dims[2]),
			N: o.local[0], Iters: o.iters, Warmup: o.warmup, Compute: !o.exchangeOnly, USPerIter: us, Checksum: sum, OK: close(sum, ref)}
		allOK = allOK && r.OK
		results = append(results, r)
		if comm.Rank() == 0 && o.json {
			b, _ := json.Marshal(r)
			fmt.Println(string(b))
		}
	}
	printSummary(comm, g, o, results)
	if o.serial && !o.exchangeOnly && comm.Rank() == 0 {
		sum, us := g.serial(o)
		allOK = printSerial(g, o, sum, us, ref) && allOK
	}
	if err := v.nwin.Free(ctx); err != nil {
		return false, err
	}
	if err := v.win.Free(ctx); err != nil {
		return false, err
	}
	return allOK, nil
}

// printSummary prints the variants' results as text (rank 0, without
// --json).
func printSummary(comm *rma.Comm, g *grid, o options, results []result) {
	if comm.Rank() != 0 || o.json {
		return
	}
	fmt.Printf("halo3d: %d ranks (%dx%dx%d), %dx%dx%d per rank, %d+%d iterations%s\n", comm.Size(), g.dims[0], g.dims[1], g.dims[2],
		o.local[0], o.local[1], o.local[2], o.warmup, o.iters, map[bool]string{true: ", exchange only", false: ""}[o.exchangeOnly])
	fence := 0.0
	for _, r := range results {
		if r.Sync == "fence" {
			fence = r.USPerIter
		}
	}
	for _, r := range results {
		ratio := ""
		if fence > 0 {
			ratio = fmt.Sprintf("  %.2fx fence", r.USPerIter/fence)
		}
		fmt.Printf("  %-9s %10.1f us/iter%s  checksum %.10f  ok=%v\n", r.Sync, r.USPerIter, ratio, r.Checksum, r.OK)
		if r.Checkpoint > 0 {
			fmt.Printf("            snapshots every %d iterations, replicated; recovered from %d failure(s)\n", r.Checkpoint, r.Recoveries)
		}
	}
}

// serial solves the whole grid on this rank and returns the checksum and
// the time per iteration in microseconds.
func (g *grid) serial(o options) (float64, float64) {
	t0 := time.Now()
	sum := serial(o.local[0]*g.dims[0], o.local[1]*g.dims[1], o.local[2]*g.dims[2], o.warmup+o.iters)
	return sum, float64(time.Since(t0).Microseconds()) / float64(o.warmup+o.iters)
}

// printSerial prints the serial solution's result and whether it equals
// the reference.
func printSerial(g *grid, o options, sum, us, ref float64) bool {
	gx, gy, gz := o.local[0]*g.dims[0], o.local[1]*g.dims[1], o.local[2]*g.dims[2]
	r := result{Example: "halo3d", Sync: "serial-ref", Ranks: 1, Dims: "1x1x1", N: o.local[0], Iters: o.iters, Warmup: o.warmup,
		Compute: true, USPerIter: us, Checksum: sum, OK: close(sum, ref)}
	if o.json {
		b, _ := json.Marshal(r)
		fmt.Println(string(b))
	} else {
		fmt.Printf("  %-9s %10.1f us/iter  checksum %.10f  ok=%v (the whole %dx%dx%d grid on rank 0)\n", r.Sync, r.USPerIter, r.Checksum, r.OK, gx, gy, gz)
	}
	return r.OK
}

func close(a, b float64) bool {
	m := math.Max(math.Abs(a), math.Abs(b))
	return math.Abs(a-b) <= 1e-9*math.Max(m, 1)
}

// run runs one variant from the initial state and returns the slowest
// rank's time per iteration and the global checksum.
func (v *variant) run(ctx context.Context, sync string, o options) (float64, float64, error) {
	g, comm := v.g, v.comm
	g.initArrays()
	if err := comm.Barrier(ctx); err != nil {
		return 0, 0, err
	}
	if sync == "lock" {
		if err := v.win.LockAll(ctx); err != nil {
			return 0, 0, err
		}
	}
	cur := 0
	var t0 time.Time
	for it := 1; it <= o.warmup+o.iters; it++ {
		if it == o.warmup+1 {
			if err := comm.Barrier(ctx); err != nil {
				return 0, 0, err
			}
			t0 = time.Now()
		}
		if err := v.exchange(ctx, sync, cur, int64(it)); err != nil {
			return 0, 0, err
		}
		if !o.exchangeOnly {
			jacobi(g.u[1-cur], g.u[cur], g.nx, g.ny, g.nz, g.sx, g.sy)
		}
		cur = 1 - cur
	}
	el := []float64{time.Since(t0).Seconds()}
	if err := rma.WaitAll(ctx, v.pending...); err != nil {
		return 0, 0, err
	}
	v.pending = nil
	if sync == "lock" {
		if err := v.win.UnlockAll(ctx); err != nil {
			return 0, 0, err
		}
	}
	if err := comm.AllreduceFloat64(ctx, rma.ReduceMax, el); err != nil {
		return 0, 0, err
	}
	sum := []float64{interiorSum(g.u[cur], g.nx, g.ny, g.nz, g.sx, g.sy)}
	if err := comm.AllreduceFloat64(ctx, rma.ReduceSum, sum); err != nil {
		return 0, 0, err
	}
	// Epochs of the notified window left unconsumed would spill into the
	// next run: every rank has waited for all of its epochs here.
	if err := comm.Barrier(ctx); err != nil {
		return 0, 0, err
	}
	return el[0] / float64(o.iters) * 1e6, sum[0], nil
}

func serial(gx, gy, gz, steps int) float64 {
	ty := gz + 2
	tx := (gy + 2) * ty
	n := (gx + 2) * tx
	a, b := make([]float64, n), make([]float64, n)
	initArray(a, gx, gy, gz, 0, 0, 0, true)
	initArray(b, gx, gy, gz, 0, 0, 0, true)
	for range steps {
		jacobi(b, a, gx, gy, gz, tx, ty)
		a, b = b, a
	}
	return interiorSum(a, gx, gy, gz, tx, ty)
}
