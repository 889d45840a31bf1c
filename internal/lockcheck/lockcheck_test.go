package lockcheck_test

import (
	"strings"
	"sync"
	"testing"

	"github.com/rvma/rvma/internal/lockcheck"
)

type aLocks struct{}

func (aLocks) LockClass() string { return "test: a.mu" }

type bLocks struct{}

func (bLocks) LockClass() string { return "test: b.mu" }

// panics runs f and returns the message it panicked with ("" if none).
func panics(f func()) (msg string) {
	defer func() {
		if r := recover(); r != nil {
			msg, _ = r.(string)
			if msg == "" {
				msg = "non-string panic"
			}
		}
	}()
	f()
	return ""
}

// TestRules: the assertions hold where the rules are kept, and, in a
// debug build, fire where they are broken.
func TestRules(t *testing.T) {
	var a, a2 lockcheck.Mutex[aLocks]
	var b lockcheck.Mutex[bLocks]

	// Kept: nothing fires.
	if m := panics(func() {
		lockcheck.AssertNotHeld[aLocks]("send")
		a.Lock()
		lockcheck.AssertHeld(&a, "a's state")
		lockcheck.AssertNotHolding(&a2, "a2's rule")
		lockcheck.AssertNotHeld[bLocks]("b's rule")
		a.Unlock()
		lockcheck.AssertNotHeld[aLocks]("send")
		lockcheck.Enter[bLocks]()
		lockcheck.AssertNotHeld[aLocks]("send")
		lockcheck.Exit[bLocks]()
		lockcheck.AssertNotHeld[bLocks]("b's rule")
	}); m != "" {
		t.Fatalf("a kept rule panicked: %s", m)
	}
	if !lockcheck.Enabled {
		return
	}

	for _, tc := range []struct {
		name string
		f    func()
		want string
	}{
		{"not held", func() {
			a.Lock()
			defer a.Unlock()
			lockcheck.AssertNotHeld[aLocks]("Port.Send")
		}, "Port.Send, but goroutine"},
		{"another of the class", func() {
			a2.Lock()
			defer a2.Unlock()
			lockcheck.AssertNotHeld[aLocks]("Port.Send")
		}, "holds test: a.mu"},
		{"held", func() { lockcheck.AssertHeld(&a, "refresh") }, "refresh, but goroutine"},
		{"holding", func() {
			a.Lock()
			defer a.Unlock()
			lockcheck.AssertNotHolding(&a, "after")
		}, "after, but goroutine"},
		{"relock", func() {
			a.Lock()
			defer a.Unlock()
			a.Lock()
		}, "which it holds already"},
		{"region", func() {
			lockcheck.Enter[bLocks]()
			defer lockcheck.Exit[bLocks]()
			lockcheck.AssertNotHeld[bLocks]("Wait")
		}, "holds test: b.mu"},
	} {
		if m := panics(tc.f); !strings.Contains(m, tc.want) {
			t.Errorf("%s: panic %q, want one containing %q", tc.name, m, tc.want)
		}
	}

	// A lock held by another goroutine is not this one's.
	b.Lock()
	var wg sync.WaitGroup
	wg.Add(1)
	var m string
	go func() {
		defer wg.Done()
		m = panics(func() { lockcheck.AssertNotHeld[bLocks]("elsewhere") })
	}()
	wg.Wait()
	if m != "" {
		t.Errorf("another goroutine's lock counted: %s", m)
	}
	if m := panics(func() { lockcheck.AssertHeld(&b, "mine") }); m != "" {
		t.Errorf("the holder's AssertHeld panicked: %s", m)
	}
	// Unlocked by another goroutine: no longer counted against this one.
	wg.Add(1)
	go func() { defer wg.Done(); b.Unlock() }()
	wg.Wait()
	if m := panics(func() { lockcheck.AssertNotHeld[bLocks]("after") }); m != "" {
		t.Errorf("a lock released elsewhere still counted: %s", m)
	}
}
