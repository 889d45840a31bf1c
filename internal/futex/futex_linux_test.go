package futex

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestWakeAll: every waiter on the word wakes, not one.
func TestWakeAll(t *testing.T) {
	var word uint32
	var asleep sync.WaitGroup
	done := make(chan time.Duration, 3)
	for range 3 {
		asleep.Add(1)
		go func() {
			asleep.Done()
			t0 := time.Now()
			// A timeout far beyond what a wake-up takes, so that only a
			// waiter left asleep reaches it.
			Wait(&word, 0, 20*time.Second)
			done <- time.Since(t0)
		}()
	}
	asleep.Wait()
	time.Sleep(50 * time.Millisecond) // into the kernel's wait (a late one returns at once: the word moved)
	atomic.AddUint32(&word, 1)
	WakeAll(&word)
	for i := range 3 {
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("waiter %d still asleep", i)
		}
	}
}
