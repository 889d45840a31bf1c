package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// shm_pingpong: two processes bounce one cache line through shared memory,
// the physical floor of cross-process notification that the shm provider's
// latencies are compared with. The parent maps a memfd, starts itself as
// the child with the segment's /proc path, and writes odd values; the
// child answers each with the next even one. One way = half a round trip.

const envPingChild = "RVMA_PERF_PINGPONG_CHILD"

const pingStop = ^uint64(0)

// pingWord maps the first 8 bytes of the segment at path.
func pingWord(path string) (*uint64, func(), error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	mem, err := unix.Mmap(int(f.Fd()), 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, nil, err
	}
	return (*uint64)(unsafe.Pointer(&mem[0])), func() { unix.Munmap(mem) }, nil
}

// pingChild is the answering process.
func pingChild(path string) error {
	w, unmap, err := pingWord(path)
	if err != nil {
		return err
	}
	defer unmap()
	for spins := 0; ; spins++ {
		v := atomic.LoadUint64(w)
		if v == pingStop {
			return nil
		}
		if v&1 == 1 {
			atomic.StoreUint64(w, v+1)
			spins = 0
			continue
		}
		if spins&1023 == 1023 {
			runtime.Gosched() // more processes than cores: let the peer run
		}
	}
}

func shmPingPong(ctx context.Context, o *options) (*Result, error) {
	fd, err := unix.MemfdCreate("rvma-perf-pingpong", 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, 4096); err != nil {
		return nil, err
	}
	path := "/proc/" + strconv.Itoa(os.Getpid()) + "/fd/" + strconv.Itoa(fd)
	w, unmap, err := pingWord(path)
	if err != nil {
		return nil, err
	}
	defer unmap()
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	child := exec.CommandContext(ctx, self)
	child.Env = childEnv(o, envPingChild+"="+path)
	child.Stderr = os.Stderr
	if err := child.Start(); err != nil {
		return nil, err
	}
	defer func() {
		atomic.StoreUint64(w, pingStop)
		child.Wait()
	}()
	v := uint64(0)
	first := true
	lat, el, err := pingPong(ctx, o, func() error {
		t0 := time.Now()
		v++
		atomic.StoreUint64(w, v) // odd: the child's turn
		v++
		for spins := 0; atomic.LoadUint64(w) != v; spins++ {
			if spins&1023 == 1023 {
				runtime.Gosched()
				if ctx.Err() != nil {
					return ctx.Err()
				}
				if first && time.Since(t0) > 10*time.Second {
					return errors.New("shm_pingpong: the child process does not answer")
				}
			}
		}
		first = false
		return nil
	})
	if err != nil {
		return nil, err
	}
	r, err := latencyResult("shm_pingpong", 8, lat, el)
	if r != nil {
		r.Provider = "shm"
	}
	return r, err
}

// envServerArgs carries the arguments of a server process that rvma-perf
// starts itself (--provider shm without --server or --connect), unit
// separator (0x1f) separated.
const envServerArgs = "RVMA_PERF_SERVER_ARGS"

// spawnServer starts this program as the server side of o's test on a
// free loopback port and returns the address once it listens, and a
// function that waits for the process to end.
func spawnServer(ctx context.Context, o *options) (string, func(), error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	addr := l.Addr().String()
	l.Close()
	self, err := os.Executable()
	if err != nil {
		return "", nil, err
	}
	args := []string{o.test, "--provider", o.provider, "--device", o.device, "--server", addr}
	cmd := exec.CommandContext(ctx, self)
	cmd.Env = childEnv(o, envServerArgs+"="+strings.Join(args, "\x1f"))
	// Its output is discarded: a failure shows on this side's connection.
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	wait := func() { cmd.Wait() }
	for start := time.Now(); ; time.Sleep(5 * time.Millisecond) {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			return addr, wait, nil
		}
		if time.Since(start) > 10*time.Second {
			cmd.Process.Kill()
			wait()
			return "", nil, fmt.Errorf("the server process did not listen on %s: %w", addr, err)
		}
	}
}

// childRole runs the role a parent rvma-perf gave this process through
// the environment (shm_pingpong's child, a spawned server or rma rank), and reports
// whether there was one.
func childRole() (bool, error) {
	if path := os.Getenv(envPingChild); path != "" {
		return true, pingChild(path)
	}
	if args := os.Getenv(envRankArgs); args != "" {
		os.Unsetenv(envRankArgs)
		return true, run(context.Background(), strings.Split(args, "\x1f"), os.Stdout, os.Stderr)
	}
	if args := os.Getenv(envServerArgs); args != "" {
		os.Unsetenv(envServerArgs)
		return true, run(context.Background(), strings.Split(args, "\x1f"), os.Stdout, os.Stderr)
	}
	return false, nil
}
