//go:build !rvmadebug

package lockcheck

import "sync"

// Enabled reports whether the checks are compiled in (the rvmadebug tag).
const Enabled = false

// Mutex is a mutual exclusion lock of class C. In this build it is
// sync.Mutex itself.
type Mutex[C Class] = sync.Mutex

// AssertNotHeld panics, in debug builds, if the calling goroutine holds a
// lock of class C (or is in a region of it); rule says what was about to
// happen.
func AssertNotHeld[C Class](rule string) {}

// AssertHeld panics, in debug builds, unless the calling goroutine holds
// m; rule says what needs it.
func AssertHeld(m *sync.Mutex, rule string) {}

// AssertNotHolding panics, in debug builds, if the calling goroutine holds
// m; rule says what must not run under it.
func AssertNotHolding(m *sync.Mutex, rule string) {}

// Enter marks, in debug builds, the calling goroutine as in a region of
// class C until the matching Exit.
func Enter[C Class]() {}

// Exit ends a region that Enter began.
func Exit[C Class]() {}
