package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/rvma/rvma/internal/kvs"
	"github.com/rvma/rvma/internal/launch"
	"github.com/rvma/rvma/reliability"
	"github.com/rvma/rvma/rma"
	"github.com/rvma/rvma/verbs"
)

// The rma tests run their two ranks as two processes, as MPI runs them,
// when rvma-perf is one rank of a job (started by rvmarun -n 2, or by
// MPICH's mpiexec, whose PMI rma.Init speaks), or when --bind asks for
// ranks bound to cores: rvma-perf is then the launcher, serving the
// rendezvous as rvmarun does and starting itself twice, rank r bound to
// CPU r. Otherwise the ranks are goroutines of this process (rmaTest).

// envRankArgs carries the arguments of a rank that rvma-perf starts
// itself, unit separator (0x1f) separated.
const envRankArgs = "RVMA_PERF_RANK_ARGS"

// launchedRank returns this process's rank in a job its launcher started,
// or false.
func launchedRank() (int, bool) {
	for _, v := range []string{rma.EnvRank, "PMI_RANK"} {
		if s, ok := os.LookupEnv(v); ok {
			r, _ := strconv.Atoi(s)
			return r, true
		}
	}
	return 0, false
}

// rmaConfig is the rma configuration both layouts share.
func rmaConfig(o *options) *rma.Config {
	cfg := &rma.Config{Provider: o.provider, Addr: o.addr, Paths: o.paths, Device: verbs.DeviceConfig{NoMAC: o.noMAC}}
	if o.delay > 0 {
		// RC tuned for the long link, as one would: a timeout above the
		// round trip and a window of its bandwidth-delay product.
		cfg.Connect = verbs.ConnectConfig{Timeout: 4*o.delay + 20*time.Millisecond, Window: 8192}
	}
	if o.longhaul {
		cfg.LongHaul = &rma.LongHaulConfig{Reliability: reliability.Config{RTT: 2*o.delay + time.Millisecond}}
	}
	return cfg
}

// rmaAsRank runs this process's rank of the test; rank 0 returns the
// result, the others nil.
func rmaAsRank(ctx context.Context, o *options) (*Result, error) {
	if o.provider == "loop" {
		return nil, errors.New("ranks in separate processes need --provider shm, udp or auto")
	}
	if r, _ := launchedRank(); o.bind && os.Getenv(envCPU) == "" {
		// Under a launcher that did not bind: one core per rank.
		if err := pinTo(r % runtime.NumCPU()); err != nil {
			return nil, err
		}
	}
	c, err := rma.Init(ctx, rmaConfig(o))
	if err != nil {
		return nil, err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c.Close(cctx)
	}()
	if c.Size() != 2 {
		return nil, fmt.Errorf("%s needs a job of 2 ranks, not %d", o.test, c.Size())
	}
	faults, err := rmaFaults(o)
	if err != nil {
		return nil, err
	}
	if faults.Active() {
		if err := c.Device().SetFaults(-1, faults); err != nil {
			return nil, err
		}
	}
	res, err := rmaRank(ctx, c, o)
	if err != nil || res == nil {
		return res, err
	}
	if st := c.Paths(1); st != nil {
		res.Paths = len(st)
		for _, p := range st {
			res.PathGbps = append(res.PathGbps, float64(p.Bytes)*8/res.Seconds/1e9)
		}
	}
	res.Ranks = "processes"
	return res, nil
}

// rankArgs is the command line of a rank that rvma-perf starts: o's
// settings for this one measurement, the result as JSON.
func rankArgs(o *options) []string {
	a := []string{o.test, "--provider", o.provider, "--addr", o.addr, "--size", strconv.Itoa(o.size),
		"--iters", strconv.Itoa(o.iters), "--duration", o.duration.String(), "--warmup", strconv.Itoa(o.warmup),
		"--depth", strconv.Itoa(o.depth), "--paths", strconv.Itoa(o.paths), "--json"}
	if o.bind {
		a = append(a, "--bind")
	}
	if o.loss != "" {
		a = append(a, "--loss", o.loss)
	}
	if o.delay > 0 {
		a = append(a, "--delay", o.delay.String())
	}
	if o.longhaul {
		a = append(a, "--longhaul")
	}
	if o.noMAC {
		a = append(a, "--no-mac")
	}
	if o.accFloat {
		a = append(a, "--acc-float")
	}
	return a
}

// rmaSpawn starts the two ranks of o's test as processes of this program
// and returns rank 0's result. It serves their rendezvous, as rvmarun
// would, with a fresh key passed in their environment only.
func rmaSpawn(ctx context.Context, o *options) (*Result, error) {
	if o.provider == "loop" {
		return nil, errors.New("--bind runs the ranks as two processes: use --provider shm, udp or auto")
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	key := launch.NewKey()
	srv, err := kvs.ListenConfig("127.0.0.1:0", 2, &kvs.ServerConfig{Key: key})
	if err != nil {
		return nil, err
	}
	defer srv.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var outs [2]bytes.Buffer
	exits := make(chan error, 2)
	for r := range 2 {
		cmd := exec.CommandContext(ctx, self)
		cmd.Env = append(os.Environ(), envRankArgs+"="+strings.Join(rankArgs(o), "\x1f"),
			rma.EnvRank+"="+strconv.Itoa(r), rma.EnvSize+"=2", rma.EnvKVS+"="+srv.Addr(),
			launch.EnvPID+"="+strconv.Itoa(os.Getpid()), launch.EnvKey+"="+launch.EncodeKey(key))
		if o.bind {
			cmd.Env = append(cmd.Env, envCPU+"="+strconv.Itoa(r%runtime.NumCPU()))
			if _, set := os.LookupEnv("GOMAXPROCS"); !set {
				// One processor per bound rank, as rvmarun gives ranks
				// that share the cores.
				cmd.Env = append(cmd.Env, "GOMAXPROCS=1")
			}
		}
		cmd.Stdout, cmd.Stderr = &outs[r], os.Stderr
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		go func() {
			err := cmd.Wait()
			if err != nil {
				err = fmt.Errorf("rank %d: %w", r, err)
				cancel() // the other would wait for the dead one until RC gives up
			}
			exits <- err
		}()
	}
	err = errors.Join(<-exits, <-exits)
	if err != nil {
		return nil, err
	}
	var res Result
	line := bytes.TrimSpace(outs[0].Bytes())
	if i := bytes.LastIndexByte(line, '\n'); i >= 0 {
		line = line[i+1:]
	}
	if err := json.Unmarshal(line, &res); err != nil {
		return nil, fmt.Errorf("rank 0 printed no result (%q): %w", outs[0].String(), err)
	}
	return &res, nil
}

// rankEnv reports whether a launcher started this process as a rank.
func rankEnv() bool {
	_, ok := launchedRank()
	return ok
}
