// Package futex is the shared-memory wait and wake of Linux futexes, on
// words that several processes map (not private futexes), and a check
// that a process is alive: what rvma's shared-memory code needs to block
// and to notice dead peers without any lock a dead process could hold.
package futex

import (
	"math"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// futex operations (linux/futex.h); not private: the word is shared
// between processes.
const (
	waitOp = 0
	wakeOp = 1
)

// Wait blocks while *addr == val, for at most d (or until Wake).
func Wait(addr *uint32, val uint32, d time.Duration) {
	ts := unix.NsecToTimespec(d.Nanoseconds())
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), waitOp, uintptr(val), uintptr(unsafe.Pointer(&ts)), 0, 0)
}

// Wake wakes one waiter on addr.
func Wake(addr *uint32) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), wakeOp, 1, 0, 0, 0)
}

// WakeAll wakes every waiter on addr.
func WakeAll(addr *uint32) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), wakeOp, math.MaxInt32, 0, 0, 0)
}

// Alive reports whether process pid exists.
func Alive(pid int) bool { return unix.Kill(pid, 0) != unix.ESRCH }
