package spin

import "golang.org/x/sys/unix"

// osYield is sched_yield(2) made as the runtime makes it, raw: a thread
// that yields keeps its processor. Through the runtime's system call path
// a long yield (another process ran the core) let the runtime hand the
// processor to a goroutine that then blocked in a system call of its own,
// and the yielder, runnable again, waited for the processor for up to
// milliseconds.
func osYield() { unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }

// osYieldHandoff is sched_yield(2) through the runtime's system call
// path: a yield the kernel makes long lets the runtime hand the processor
// to another goroutine, which a loop of nothing but yields needs.
func osYieldHandoff() { unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }
