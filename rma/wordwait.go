package rma

import (
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/rvma/rvma/internal/futex"
	"github.com/rvma/rvma/internal/spin"
)

// Words in a rank's memory that the other ranks of its host write (the
// host barrier's, hostbar.go; a window's tokens, pscwmem.go) begin with a
// wake word, whose low half is a futex word that writers bump to wake
// sleepers, and a count of the rank's goroutines asleep on it.
const (
	wordWake     = 0
	wordSleepers = 1
)

// wakeWord is the 32-bit futex word in the wake word's low half (little
// endian, as every platform with shm is).
func wakeWord(w []uint64) *uint32 { return (*uint32)(unsafe.Pointer(&w[wordWake])) }

// wakeSleepers wakes every goroutine asleep on w's wake word, if one is:
// a writer calls it after its store.
func wakeSleepers(w []uint64) {
	if atomic.LoadUint64(&w[wordSleepers]) != 0 {
		wake(w)
	}
}

// wake wakes every goroutine asleep on w's wake word.
func wake(w []uint64) {
	atomic.AddUint64(&w[wordWake], 1)
	futex.WakeAll(wakeWord(w))
}

// awaitWords waits until ready, which looks at this rank's words w (and
// may take what it found), reports true. It spins as the engine's waits
// do (RVMA_SPIN), driving the engine every 16 rounds (requests aimed at
// this rank are served meanwhile, as in a wait over messages), then
// sleeps on w's wake word. look runs every 64 rounds and after every
// sleep (at most a millisecond): it ends the wait, done or with an error.
// Where ranks share cores the spin gives the core to the kernel every
// round if everyRound is set (spin.PauseShared), else every 16th, and
// where many do (a spin of zero) the wait sleeps at once.
func awaitWords(c *Comm, w []uint64, ready func() bool, look func() (bool, error), everyRound bool) error {
	if ready() {
		return nil
	}
	scarce, spinFor := spin.Scarce(), spin.Or(20*time.Microsecond)
	if !scarce || spinFor > 0 {
		var deadline time.Time
		for i := 0; ; i++ {
			if ready() {
				return nil
			}
			if i&63 == 63 {
				if done, err := look(); done || err != nil {
					return err
				}
				now := time.Now()
				if deadline.IsZero() {
					deadline = now.Add(spinFor)
				} else if now.After(deadline) {
					break
				}
			}
			if i&15 == 15 {
				c.eng.Progress()
			}
			switch {
			case scarce && everyRound:
				spin.PauseShared(i)
			case scarce || i&63 == 63:
				spin.Pause(i)
			}
		}
	}
	wake := wakeWord(w)
	for {
		v := atomic.LoadUint32(wake)
		atomic.AddUint64(&w[wordSleepers], 1)
		ok := ready()
		if !ok {
			futex.Wait(wake, v, time.Millisecond)
		}
		atomic.AddUint64(&w[wordSleepers], ^uint64(0))
		if ok || ready() {
			return nil
		}
		c.eng.Progress()
		if done, err := look(); done || err != nil {
			return err
		}
	}
}
