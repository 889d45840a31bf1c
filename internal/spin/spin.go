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
	"fmt"
	"runtime"
	"sync/atomic"
	"time"
)

// yieldEvery is how many rounds pass between kernel yields: often enough
// that a waiting rank lets a peer on its core run within microseconds,
// rarely enough that a lone spinner stays cheap.
const yieldEvery = 16

// Pause is one round of a spin loop; i is the loop's round number.
func Pause(i int) {
	rounds.Add(1)
	if i%yieldEvery == yieldEvery-1 {
		osYield()
		return
	}
	runtime.Gosched()
}

// PauseShared is one round of a spin loop that waits for other processes
// only (a word in shared memory that their ranks write), where ranks share
// cores (Scarce): every round gives the core to the kernel, so that a peer
// on this core runs at once, and every 16th offers the processor to this
// process's other goroutines, which the wait does not need but must not
// starve (runtime.Gosched: now and then the scheduler picks the caller
// again first). A
// wait that needs a goroutine of its own process (a message's receiver)
// uses Pause, or that goroutine would hardly run.
func PauseShared(i int) {
	rounds.Add(1)
	if i%yieldEvery == yieldEvery-1 {
		runtime.Gosched()
		return
	}
	osYield()
}

// rounds counts Pause's calls in this process.
var rounds atomic.Uint64

// Rounds returns how many spin rounds this process has made: a value
// that moves while any goroutine of it busy-waits.
func Rounds() uint64 { return rounds.Load() }

// EnvSpin names the environment variable that overrides how long rvma's
// waits spin before they block (a Go duration such as "200us"). Longer
// spins trade processor time for wake-up latency; with more ranks than
// cores, spinning with Pause's kernel yields can beat blocking.
const EnvSpin = "RVMA_SPIN"

// override is the process's spin duration, once set; -1 while unset.
var override atomic.Int64

func init() { override.Store(-1) }

// Set makes s (a duration such as "200us", as RVMA_SPIN gives it) the
// process's spin duration; an empty s changes nothing. rma.Init calls it
// with RVMA_SPIN: the library reads no environment below Init.
func Set(s string) error {
	if s == "" {
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return fmt.Errorf("spin: %s=%q: want a duration of 0 or more", EnvSpin, s)
	}
	override.Store(int64(d))
	return nil
}

// Reset forgets what Set set, as if it never ran (for tests).
func Reset() { override.Store(-1) }

// Or returns the process's spin duration if one was set, or def.
func Or(def time.Duration) time.Duration {
	if d := override.Load(); d >= 0 {
		return time.Duration(d)
	}
	return def
}

// Scarce reports whether the process was told that ranks share
// processors: a spin duration of zero, or of a millisecond or more (what
// rvmarun sets when ranks outnumber cores: see its spinFor).
func Scarce() bool {
	d := override.Load()
	return d == 0 || d >= int64(time.Millisecond)
}

// Yield gives the processor to another thread or process that can run.
// Unlike Pause's, its kernel yield goes through the runtime's system call
// path (a loop of Yields alone never enters the scheduler otherwise, and
// a goroutine woken meanwhile would wait for a forced preemption), and it
// is not counted in Rounds.
func Yield() { osYieldHandoff() }
