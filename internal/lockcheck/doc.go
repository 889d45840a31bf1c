// Package lockcheck turns rvma's locking rules into checks in debug
// builds (go build -tags rvmadebug; make test-debug), and into nothing at
// all otherwise.
//
// A rule is about a class of locks: "no goroutine calls Port.Send while
// it holds a QP's mu" is about the mu of every QP. A class is a type of
// its own, usually an empty struct with a LockClass method that names it
// in panic messages:
//
//	type qpLocks struct{}
//
//	func (qpLocks) LockClass() string { return "verbs: QP.mu" }
//
//	type QP struct {
//		mu lockcheck.Mutex[qpLocks]
//		...
//	}
//
// In a normal build Mutex[C] is an alias of sync.Mutex and the assertions
// are empty functions the compiler inlines away: the locks cost what they
// cost before. Under the rvmadebug tag a Mutex records the goroutine that
// holds it (a goroutine id read from runtime.Stack, which is slow: debug
// builds only), and each class counts the locks of the class every
// goroutine holds. Then:
//
//   - AssertNotHeld[C] panics if the calling goroutine holds any lock of
//     class C: put it where a rule says "never while holding" (before a
//     send that may re-enter the engine, before a user's callback);
//   - AssertHeld panics unless the calling goroutine holds the given
//     mutex: put it in functions documented as "m is held";
//     AssertNotHolding panics if it does;
//   - a Mutex locked again by the goroutine that holds it panics instead
//     of deadlocking;
//   - Enter[C] and Exit[C] mark a region of code as holding class C
//     without a mutex (a callback that must not wait for what it
//     is part of, for example), for AssertNotHeld[C] to refuse.
//
// The panics say which rule broke, the goroutine, and the class.
package lockcheck

// Class names a class of locks (or of regions, see Enter). Implement it on
// an empty struct type; its zero value is never used but through
// LockClass.
type Class interface {
	LockClass() string
}
