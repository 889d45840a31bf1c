// Package spin is the one way rvma's busy-waiting loops give up the
// processor. runtime.Gosched lets other goroutines of this process run,
// but when several processes share cores (more ranks than cores, the
// oversubscribed case) a spinning process keeps its core from the very
// peer it waits for until the kernel preempts it, milliseconds later. So
// every few rounds Pause also yields the OS thread to the kernel
// (sched_yield), as MPI libraries do when told they are oversubscribed.
//
// Pause is safe for concurrent use.
package spin

import (
	"os"
	"runtime"
	"sync"
	"time"
)

// yieldEvery is how many rounds pass between kernel yields: often enough
// that a waiting rank lets a peer on its core run within microseconds,
// rarely enough that a lone spinner stays cheap.
const yieldEvery = 16

// Pause is one round of a spin loop; i is the loop's round number.
func Pause(i int) {
	if i%yieldEvery == yieldEvery-1 {
		osYield()
		return
	}
	runtime.Gosched()
}

// EnvSpin names the environment variable that overrides how long rvma's
// waits spin before they block (a Go duration such as "200us"). Longer
// spins trade processor time for wake-up latency; with more ranks than
// cores, spinning with Pause's kernel yields can beat blocking.
const EnvSpin = "RVMA_SPIN"

var override = sync.OnceValues(func() (time.Duration, bool) {
	d, err := time.ParseDuration(os.Getenv(EnvSpin))
	return d, err == nil && d >= 0
})

// Or returns the spin duration set in RVMA_SPIN, or def.
func Or(def time.Duration) time.Duration {
	if d, ok := override(); ok {
		return d
	}
	return def
}
