package kvs

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Recovery: the rendezvous is also where the ranks of a job that respawns
// dead ranks agree on membership. The launcher is the one process whose
// death ends the job anyway, and it sees every rank's death first (it
// waits for them), so it decides alone: no consensus among ranks that
// may die during it.
//
//	join RANK INC VALUE  ->  view GEN FAULTS INC0 VALUE0 INC1 VALUE1 ...
//	faults SINCE         ->  faults N STATE0 STATE1 ...
//	died RANK            ->  ok
//	respawned RANK INC   ->  ok
//
// A join enters the open round; the round completes once every rank's
// current incarnation has joined it, and every joiner gets the same view:
// the round's number, the fault count when it completed, and each rank's
// incarnation and value. A rank that dies while joined leaves the round,
// which then waits for its next incarnation. A join from an incarnation
// that is not current (or is dead) is refused (ErrStale). The first join
// of a round counts as a fault, so that ranks not yet joined learn that a
// recovery is under way.
//
// faults blocks until more than SINCE faults (deaths, rounds opened) have
// happened, and returns the count and every rank's state: its current
// incarnation, with a "d" prefix while it is dead.
//
// died and respawned are Server.Died and Server.Respawned for a launcher
// that is not the server's process: the daemon of another host (rvmarun
// -H), which sees its ranks die first. Only a server with a key accepts
// them, from clients that proved they hold it: without one, anything that
// reaches the port could declare ranks dead.

// ErrFinished refuses a join once a rank has finished (exited with
// success): there is no job left to recover into.
var ErrFinished = errors.New("kvs: a rank has finished")

// ErrStale refuses a join from an incarnation that is not its rank's
// current one.
var ErrStale = errors.New("kvs: stale incarnation")

// View is what a completed round of joins agreed.
type View struct {
	Gen    uint64   // the round's number, from 1
	Faults uint64   // faults when the round completed
	Inc    []uint32 // each rank's incarnation
	Values []string // each rank's value
}

// Faults is the job's fault count and every rank's state.
type Faults struct {
	N    uint64
	Inc  []uint32
	Dead []bool
}

// Recoverer is a Store that supports recovery (Mem, Server's clients).
type Recoverer interface {
	Store
	// Join enters rank's incarnation inc, with value (a token), into the
	// open round and returns the round's view once it completes.
	Join(ctx context.Context, rank int, inc uint32, value string) (View, error)
	// Faults returns once more than since faults have happened.
	Faults(ctx context.Context, since uint64) (Faults, error)
	// Started reports whether the job's first barrier has completed.
	Started(ctx context.Context) (bool, error)
}

// recovery is Mem's recovery state, under Mem.mu.
type recovery struct {
	finished int // a rank that finished, or -1
	inc      []uint32
	dead     []bool
	faults   uint64
	gen      uint64 // the open round
	joined   map[int]joinEntry
	views    map[uint64]View // completed rounds, the last few
}

type joinEntry struct {
	inc   uint32
	value string
}

func (s *Mem) rec() *recovery {
	if s.recov == nil {
		s.recov = &recovery{finished: -1, inc: make([]uint32, s.size), dead: make([]bool, s.size), gen: 1,
			joined: map[int]joinEntry{}, views: map[uint64]View{}}
	}
	return s.recov
}

// Died records that rank's current incarnation is gone: it leaves the
// open round, and its connections should be given up.
func (s *Mem) Died(rank int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if rank < 0 || rank >= s.size {
		return
	}
	r := s.rec()
	r.dead[rank] = true
	delete(r.joined, rank)
	r.faults++
	s.changed()
}

// Finished records that rank exited with success: joins fail from now on
// (ErrFinished), rather than wait for a rank that will not come.
func (s *Mem) Finished(rank int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r := s.rec(); r.finished < 0 && rank >= 0 && rank < s.size {
		r.finished = rank
		s.changed()
	}
}

// Respawned records rank's new incarnation inc (greater than its last),
// before it starts.
func (s *Mem) Respawned(rank int, inc uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if rank < 0 || rank >= s.size {
		return
	}
	r := s.rec()
	r.inc[rank], r.dead[rank] = inc, false
	delete(r.joined, rank)
	s.changed()
}

// Join implements Recoverer.
func (s *Mem) Join(ctx context.Context, rank int, inc uint32, value string) (View, error) {
	if err := checkToken(value); err != nil {
		return View{}, err
	}
	s.mu.Lock()
	if rank < 0 || rank >= s.size {
		s.mu.Unlock()
		return View{}, fmt.Errorf("kvs: join as rank %d of %d", rank, s.size)
	}
	r := s.rec()
	if r.inc[rank] != inc || r.dead[rank] {
		s.mu.Unlock()
		return View{}, fmt.Errorf("%w: rank %d incarnation %d (current %d)", ErrStale, rank, inc, r.inc[rank])
	}
	if r.finished >= 0 {
		s.mu.Unlock()
		return View{}, fmt.Errorf("%w: rank %d", ErrFinished, r.finished)
	}
	if len(r.joined) == 0 {
		r.faults++ // a round opens: the ranks not in it must hear
	}
	gen := r.gen
	r.joined[rank] = joinEntry{inc, value}
	s.completeLocked()
	s.changed()
	s.mu.Unlock()
	for {
		s.mu.Lock()
		v, done := r.views[gen]
		e, in := r.joined[rank]
		fin := r.finished
		if !done && fin >= 0 && in && e.inc == inc {
			delete(r.joined, rank)
		}
		c := s.cond
		s.mu.Unlock()
		switch {
		case done && v.Inc[rank] == inc:
			return v, nil
		case !done && fin >= 0:
			return View{}, fmt.Errorf("%w: rank %d", ErrFinished, fin)
		case done || !in || e.inc != inc:
			return View{}, fmt.Errorf("%w: rank %d incarnation %d died during the round", ErrStale, rank, inc)
		}
		select {
		case <-c:
		case <-ctx.Done():
			s.mu.Lock()
			if _, done := r.views[gen]; !done && r.joined[rank].inc == inc {
				delete(r.joined, rank)
			}
			s.mu.Unlock()
			return View{}, ctx.Err()
		}
	}
}

// completeLocked closes the open round if every rank's current
// incarnation has joined it.
func (s *Mem) completeLocked() {
	r := s.recov
	for rank := range s.size {
		e, ok := r.joined[rank]
		if !ok || e.inc != r.inc[rank] || r.dead[rank] {
			return
		}
	}
	v := View{Gen: r.gen, Faults: r.faults, Inc: make([]uint32, s.size), Values: make([]string, s.size)}
	for rank, e := range r.joined {
		v.Inc[rank], v.Values[rank] = e.inc, e.value
	}
	r.views[r.gen] = v
	delete(r.views, r.gen-8) // joiners of a round take its view at once
	r.gen++
	r.joined = map[int]joinEntry{}
}

// Faults implements Recoverer.
func (s *Mem) Faults(ctx context.Context, since uint64) (Faults, error) {
	for {
		s.mu.Lock()
		r := s.rec()
		var f Faults
		if r.faults > since {
			f = Faults{N: r.faults, Inc: append([]uint32(nil), r.inc...), Dead: append([]bool(nil), r.dead...)}
		}
		c := s.cond
		s.mu.Unlock()
		if f.N > 0 {
			return f, nil
		}
		select {
		case <-c:
		case <-ctx.Done():
			return Faults{}, ctx.Err()
		}
	}
}

// Joining reports whether the job's first barrier (the ranks'
// rendezvous) is under way: some rank published or waits in it. A rank
// that dies then cannot be respawned: whether its first incarnation
// entered the barrier is unknown (it holds no ranks), so its next one
// could neither enter it nor skip it safely.
func (s *Mem) Joining() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gen == 0 && (s.entered > 0 || len(s.m) > 0)
}

// Started reports whether the job's first barrier has completed: a
// respawned rank enters it if not (then nobody had joined when it died).
func (s *Mem) Started(context.Context) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gen > 0, nil
}

// Joining reports whether the job's first barrier is under way (see
// Mem.Joining).
func (s *Server) Joining() bool { return s.store.Joining() }

// Died records a rank's death (see Mem.Died): the launcher calls it.
func (s *Server) Died(rank int) { s.store.Died(rank) }

// Finished records that a rank exited with success (see Mem.Finished).
func (s *Server) Finished(rank int) { s.store.Finished(rank) }

// Respawned records a rank's new incarnation (see Mem.Respawned): the
// launcher calls it before starting the rank again.
func (s *Server) Respawned(rank int, inc uint32) { s.store.Respawned(rank, inc) }

func (s *Server) handleRecovery(ctx context.Context, f []string) (string, bool) {
	switch {
	case (len(f) == 2 && f[0] == "died") || (len(f) == 3 && f[0] == "respawned"):
		rank, err := strconv.Atoi(f[1])
		var inc uint64
		if err == nil && len(f) == 3 {
			inc, err = strconv.ParseUint(f[2], 10, 32)
		}
		switch {
		case err != nil:
			return "err malformed request", true
		case s.cfg.Key == nil:
			return "err " + f[0] + ": only a server with a key takes it", true
		case rank < 0 || rank >= s.store.size:
			return fmt.Sprintf("err %s: rank %d of %d", f[0], rank, s.store.size), true
		case len(f) == 2:
			s.Died(rank)
		default:
			s.Respawned(rank, uint32(inc))
		}
		return "ok", true
	case len(f) == 4 && f[0] == "join":
		rank, err1 := strconv.Atoi(f[1])
		inc, err2 := strconv.ParseUint(f[2], 10, 32)
		if err1 != nil || err2 != nil {
			return "err malformed request", true
		}
		v, err := s.store.Join(ctx, rank, uint32(inc), f[3])
		switch {
		case errors.Is(err, ErrStale):
			return "stale", true
		case errors.Is(err, ErrFinished):
			return "finished", true
		case err != nil && ctx.Err() != nil:
			return "", false
		case err != nil:
			return "err " + strings.ReplaceAll(err.Error(), "\n", " "), true
		}
		var b strings.Builder
		fmt.Fprintf(&b, "view %d %d", v.Gen, v.Faults)
		for i := range v.Inc {
			fmt.Fprintf(&b, " %d %s", v.Inc[i], v.Values[i])
		}
		return b.String(), true
	case len(f) == 1 && f[0] == "started":
		ok, _ := s.store.Started(ctx)
		return "val " + strconv.FormatBool(ok), true
	case len(f) == 2 && f[0] == "faults":
		since, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			return "err malformed request", true
		}
		fl, err := s.store.Faults(ctx, since)
		if err != nil {
			return "", false
		}
		var b strings.Builder
		fmt.Fprintf(&b, "faults %d", fl.N)
		for i, inc := range fl.Inc {
			b.WriteByte(' ')
			if fl.Dead[i] {
				b.WriteByte('d')
			}
			b.WriteString(strconv.FormatUint(uint64(inc), 10))
		}
		return b.String(), true
	}
	return "err malformed request", true
}

// Died tells the server that rank's current incarnation is gone, as
// Server.Died does in the server's process: for a launcher elsewhere.
func (c *Client) Died(ctx context.Context, rank int) error {
	return c.expectOK(ctx, "died "+strconv.Itoa(rank))
}

// Respawned tells the server rank's new incarnation inc before it starts,
// as Server.Respawned does in the server's process: for a launcher
// elsewhere. The server has the record when it returns.
func (c *Client) Respawned(ctx context.Context, rank int, inc uint32) error {
	return c.expectOK(ctx, fmt.Sprintf("respawned %d %d", rank, inc))
}

func (c *Client) expectOK(ctx context.Context, req string) error {
	line, err := c.do(ctx, req)
	if err == nil && line != "ok" {
		err = fmt.Errorf("kvs: unexpected reply %.80q", line)
	}
	return err
}

// Join implements Recoverer.
func (c *Client) Join(ctx context.Context, rank int, inc uint32, value string) (View, error) {
	if err := checkToken(value); err != nil {
		return View{}, err
	}
	line, err := c.do(ctx, fmt.Sprintf("join %d %d %s", rank, inc, value))
	if err != nil {
		return View{}, err
	}
	if line == "stale" {
		return View{}, fmt.Errorf("%w: rank %d incarnation %d", ErrStale, rank, inc)
	}
	if line == "finished" {
		return View{}, ErrFinished
	}
	f := strings.Fields(line)
	if len(f) < 3 || f[0] != "view" || len(f)%2 != 1 {
		return View{}, fmt.Errorf("kvs: unexpected reply %.80q", line)
	}
	var v View
	var err1, err2 error
	v.Gen, err1 = strconv.ParseUint(f[1], 10, 64)
	v.Faults, err2 = strconv.ParseUint(f[2], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return View{}, fmt.Errorf("kvs: unexpected reply: %w", err)
	}
	for i := 3; i < len(f); i += 2 {
		inc, err := strconv.ParseUint(f[i], 10, 32)
		if err != nil {
			return View{}, fmt.Errorf("kvs: unexpected reply: %w", err)
		}
		v.Inc = append(v.Inc, uint32(inc))
		v.Values = append(v.Values, f[i+1])
	}
	return v, nil
}

// Started implements Recoverer.
func (c *Client) Started(ctx context.Context) (bool, error) {
	line, err := c.do(ctx, "started")
	if err != nil {
		return false, err
	}
	return line == "val true", nil
}

// Faults implements Recoverer.
func (c *Client) Faults(ctx context.Context, since uint64) (Faults, error) {
	line, err := c.do(ctx, "faults "+strconv.FormatUint(since, 10))
	if err != nil {
		return Faults{}, err
	}
	return parseFaults(line)
}

func parseFaults(line string) (Faults, error) {
	f := strings.Fields(line)
	if len(f) < 2 || f[0] != "faults" {
		return Faults{}, fmt.Errorf("kvs: unexpected reply %.80q", line)
	}
	var fl Faults
	var err error
	if fl.N, err = strconv.ParseUint(f[1], 10, 64); err != nil {
		return Faults{}, fmt.Errorf("kvs: unexpected reply: %w", err)
	}
	for _, s := range f[2:] {
		d := strings.HasPrefix(s, "d")
		inc, err := strconv.ParseUint(strings.TrimPrefix(s, "d"), 10, 32)
		if err != nil {
			return Faults{}, fmt.Errorf("kvs: unexpected reply: %w", err)
		}
		fl.Inc = append(fl.Inc, uint32(inc))
		fl.Dead = append(fl.Dead, d)
	}
	return fl, nil
}
