//go:build !linux

package main

import "syscall"

// rankAttr is how a rank starts: leading a process group, so that
// stopping it also stops what it started. Without Linux's parent-death
// signal, only the ranks' watch (launch.Watch) ends them with rvmarun.
func rankAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
