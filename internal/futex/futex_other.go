//go:build !linux

// Package futex is the shared-memory wait and wake of Linux futexes; on
// other systems Wait sleeps and Wake does nothing.
package futex

import "time"

// Wait sleeps for d at most.
func Wait(addr *uint32, val uint32, d time.Duration) { time.Sleep(min(d, time.Millisecond)) }

// Wake does nothing here.
func Wake(addr *uint32) {}

// WakeAll does nothing here.
func WakeAll(addr *uint32) {}

// Alive assumes the process lives.
func Alive(pid int) bool { return true }
