package main

import "syscall"

// rankAttr is how a rank starts. It leads a process group, so that
// stopping it also stops what it started (a shell's children hold its
// output open); and it gets SIGKILL when rvmarun dies, even by SIGKILL.
func rankAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
