package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// What a job costs, to refuse one the host cannot hold before any rank
// starts rather than fail halfway through starting them.
const (
	// fdsPerRank counts rvmarun's open files per rank: the read ends of
	// the rank's stdout and stderr pipes, the pidfd os/exec holds for it,
	// and two rendezvous connections (the rank's client and its launcher
	// watch).
	fdsPerRank = 5
	// fdsBase covers the rest: stdio, the listener, the poller, and what
	// starting one rank holds for a moment (the pipes' write ends, exec's
	// status pipe, /dev/null).
	fdsBase = 32
	// memBase and memPerPeer estimate a rank's memory: what a rank needs
	// whatever the job, and what each peer it connects to adds (send
	// queues and shm rings grow with use). Measured as the drop of
	// MemAvailable while halo3d ran under rvmarun at 128 ranks: 11 MiB a
	// rank over udp, 9 over shm (a rank of it connects to about 10
	// peers); a rank that connects to every other still needs some 48 KiB
	// a peer at rest, up to 1 MiB for a shm peer that floods it.
	memBase    = 16 << 20
	memPerPeer = 64 << 10
	// maxRanks caps n in rankMem, so that its product cannot overflow:
	// a rank of a job that large is still taken to need 1 PiB.
	maxRanks = 1 << 30
)

// checkHost reports whether n ranks of a job of size ranks fit in the
// open-file limit and in the memory available; memPerRank (MiB) overrides
// the memory estimate.
func checkHost(n, size, memPerRank int) error {
	if err := checkFDs(n); err != nil {
		return err
	}
	avail, source, ok := memAvailable()
	if !ok {
		return nil // no /proc: nothing to check against
	}
	return fitMem(n, rankMem(size, memPerRank), avail, source)
}

// checkFDs raises the soft limit on open files to the hard one, as the Go
// runtime does at start (in case it could not then), and checks n ranks
// against it.
func checkFDs(n int) error {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return nil
	}
	if lim.Cur < lim.Max {
		raised := lim
		raised.Cur = raised.Max
		if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised) == nil {
			lim = raised
		}
	}
	return fitFDs(n, uint64(lim.Cur), uint64(lim.Max))
}

func fitFDs(n int, soft, hard uint64) error {
	if soft >= fdsBase && uint64(n) <= (soft-fdsBase)/fdsPerRank {
		return nil
	}
	return fmt.Errorf("-n %d needs about %.0f open files in rvmarun (%d a rank), over its limit of %d (RLIMIT_NOFILE, hard limit %d): "+
		"start fewer ranks, or raise the limit (ulimit -n, up to the hard limit; the hard limit in /etc/security/limits.conf, or LimitNOFILE= for a systemd service)",
		n, fdsBase+float64(n)*fdsPerRank, fdsPerRank, soft, hard)
}

// rankMem is the memory one rank of n is taken to need.
func rankMem(n, memPerRankMiB int) uint64 {
	if memPerRankMiB > 0 {
		return uint64(min(memPerRankMiB, 1<<40)) << 20 // 1 EiB: no overflow
	}
	return memBase + uint64(min(n, maxRanks)-1)*memPerPeer
}

func fitMem(n int, perRank, avail uint64, source string) error {
	if uint64(n) <= avail/perRank {
		return nil
	}
	return fmt.Errorf("-n %d needs about %.0f MiB of memory (%d MiB a rank), but %s has %d MiB available: "+
		"start fewer ranks or free memory; if your ranks need less than estimated, say how much with --mem-per-rank",
		n, float64(n)*float64(perRank)/(1<<20), perRank>>20, source, avail>>20)
}

// memAvailable returns the memory available to new processes: MemAvailable
// from /proc/meminfo, or less if this process's cgroup has a limit.
func memAvailable() (avail uint64, source string, ok bool) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, "", false
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, found := strings.CutPrefix(l, "MemAvailable:"); found {
			kb, err := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				return 0, "", false
			}
			avail, source, ok = kb<<10, "the host (MemAvailable in /proc/meminfo)", true
		}
	}
	if room, file, limited := cgroupRoom(); ok && limited && room < avail {
		avail, source = room, "the cgroup ("+file+")"
	}
	return avail, source, ok
}

// cgroupRoom returns what this process's memory cgroup still allows: its
// limit less its usage, in cgroup v2 (memory.max) or v1
// (memory.limit_in_bytes). Limits of ancestor cgroups are not looked at.
func cgroupRoom() (room uint64, file string, limited bool) {
	b, _ := os.ReadFile("/proc/self/cgroup")
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		// Lines are ID:CONTROLLERS:PATH; v2's has ID 0 and no controllers.
		f := strings.SplitN(sc.Text(), ":", 3)
		if len(f) != 3 {
			continue
		}
		var dirs []string
		var limitFile, usageFile string
		switch {
		case f[0] == "0" && f[1] == "":
			dirs = []string{filepath.Join("/sys/fs/cgroup", f[2]), "/sys/fs/cgroup"}
			limitFile, usageFile = "memory.max", "memory.current"
		case strings.Contains(","+f[1]+",", ",memory,"):
			dirs = []string{filepath.Join("/sys/fs/cgroup/memory", f[2]), "/sys/fs/cgroup/memory"}
			limitFile, usageFile = "memory.limit_in_bytes", "memory.usage_in_bytes"
		default:
			continue
		}
		// In a container the cgroup's files are at the mount's root.
		for _, d := range dirs {
			limit, err1 := readUint(filepath.Join(d, limitFile))
			usage, err2 := readUint(filepath.Join(d, usageFile))
			if err1 != nil || err2 != nil {
				continue
			}
			if limit >= 1<<60 { // "max", or v1's unlimited
				break
			}
			return limit - min(usage, limit), filepath.Join(d, limitFile), true
		}
	}
	return 0, "", false
}

func readUint(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return 1 << 63, nil
	}
	return strconv.ParseUint(s, 10, 64)
}
