package multipath

import "math"

// PathState is what a Balancer sees of one path.
type PathState struct {
	Up bool
	// Capacity is the path's estimated bandwidth in bytes per second
	// (probes and live completions, EWMA); 0 until measured.
	Capacity float64
	// Outstanding is the number of bytes posted on the path and not yet
	// completed.
	Outstanding int
}

// A Balancer decides how a request's bytes are spread over the paths.
// Implementations must be safe for concurrent use.
type Balancer interface {
	// Split returns how many of n bytes each path carries (summing to n;
	// zero for paths that are down).
	Split(n int, paths []PathState) []int
	// Pick returns the path for a request sent whole (small requests,
	// atomics).
	Pick(paths []PathState) int
}

// Equal splits every request evenly over the paths that are up.
type Equal struct{}

// Proportional splits a request in proportion to the paths' estimated
// capacities, so that all sub-flows finish together (Virtuoso's
// equation 1); paths not yet measured count as the mean of the measured
// ones, or equal when none is.
type Proportional struct{}

// Adaptive splits so that every path finishes its outstanding bytes plus
// its share at the same time: a path that is already busy gets less (the
// earliest-expected-finish rule); Pick takes the path with the earliest
// expected finish.
type Adaptive struct{}

func upWeights(paths []PathState, w func(PathState) float64) []float64 {
	ws := make([]float64, len(paths))
	for i, p := range paths {
		if p.Up {
			ws[i] = w(p)
		}
	}
	return ws
}

// caps returns each path's capacity, unknown ones replaced by the mean of
// the known (1 if none is known).
func caps(paths []PathState) []float64 {
	sum, n := 0.0, 0
	for _, p := range paths {
		if p.Up && p.Capacity > 0 {
			sum += p.Capacity
			n++
		}
	}
	mean := 1.0
	if n > 0 {
		mean = sum / float64(n)
	}
	return upWeights(paths, func(p PathState) float64 {
		if p.Capacity > 0 {
			return p.Capacity
		}
		return mean
	})
}

// apportion splits n in proportion to ws (largest remainders).
func apportion(n int, ws []float64) []int {
	out := make([]int, len(ws))
	total := 0.0
	for _, w := range ws {
		total += w
	}
	if total <= 0 {
		return out
	}
	given := 0
	for i, w := range ws {
		out[i] = int(float64(n) * w / total)
		given += out[i]
	}
	for given < n { // hand out the rest, heaviest first
		best := -1
		for i, w := range ws {
			if w > 0 && (best < 0 || w > ws[best]) {
				best = i
			}
		}
		out[best] += n - given
		given = n
	}
	return out
}

func pickMin(paths []PathState, key func(i int, p PathState) float64) int {
	best, bk := -1, math.Inf(1)
	for i, p := range paths {
		if !p.Up {
			continue
		}
		if k := key(i, p); best < 0 || k < bk {
			best, bk = i, k
		}
	}
	return best
}

// Split implements Balancer.
func (Equal) Split(n int, paths []PathState) []int {
	return apportion(n, upWeights(paths, func(PathState) float64 { return 1 }))
}

// Pick implements Balancer: the path with the fewest outstanding bytes.
func (Equal) Pick(paths []PathState) int {
	return pickMin(paths, func(_ int, p PathState) float64 { return float64(p.Outstanding) })
}

// Split implements Balancer.
func (Proportional) Split(n int, paths []PathState) []int { return apportion(n, caps(paths)) }

// Pick implements Balancer: the highest capacity among the least loaded.
func (Proportional) Pick(paths []PathState) int {
	c := caps(paths)
	return pickMin(paths, func(i int, p PathState) float64 { return float64(p.Outstanding+1) / c[i] })
}

// Split implements Balancer: water-filling on expected finish times.
func (Adaptive) Split(n int, paths []PathState) []int {
	c := caps(paths)
	// Find the finish time T at which sum(max(0, T*c_i - out_i)) = n.
	lo, hi := 0.0, 1.0
	fill := func(T float64) float64 {
		s := 0.0
		for i, p := range paths {
			if c[i] > 0 {
				s += math.Max(0, T*c[i]-float64(p.Outstanding))
			}
		}
		return s
	}
	for fill(hi) < float64(n) {
		hi *= 2
	}
	for range 60 {
		mid := (lo + hi) / 2
		if fill(mid) < float64(n) {
			lo = mid
		} else {
			hi = mid
		}
	}
	ws := make([]float64, len(paths))
	for i, p := range paths {
		if c[i] > 0 {
			ws[i] = math.Max(0, hi*c[i]-float64(p.Outstanding))
		}
	}
	return apportion(n, ws)
}

// Pick implements Balancer: the earliest expected finish.
func (Adaptive) Pick(paths []PathState) int {
	c := caps(paths)
	return pickMin(paths, func(i int, p PathState) float64 { return float64(p.Outstanding) / c[i] })
}
