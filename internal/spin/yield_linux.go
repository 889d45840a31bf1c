package spin

import "golang.org/x/sys/unix"

func osYield() { unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }
