package main

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// envCPU pins a child process (the shm server, shm_pingpong's partner)
// to one CPU, as --bind asks.
const envCPU = "RVMA_PERF_CPU"

// pinTo binds every thread of this process to cpu (threads started later
// inherit it): the -bind-to core of the MPI peers, so that the two
// processes of a shm test do not share a core or migrate.
func pinTo(cpu int) error {
	var set unix.CPUSet
	set.Set(cpu)
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return err
	}
	for _, t := range tasks {
		tid, _ := strconv.Atoi(t.Name())
		if err := unix.SchedSetaffinity(tid, &set); err != nil {
			return fmt.Errorf("bind to CPU %d: %w", cpu, err)
		}
	}
	return nil
}

// childEnv is the environment of a child process: pinned to CPU 1 when
// this one is bound.
func childEnv(o *options, extra ...string) []string {
	env := append(os.Environ(), extra...)
	if o.bind {
		env = append(env, envCPU+"=1")
	}
	return env
}
