package mpi_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/internal/testutil"
)

// TestOSU builds the OSU Micro-Benchmarks' one-sided tests, unmodified,
// from the tree in $RVMA_OSU_DIR (its root or mpi/one-sided; never part
// of this repository: skipped without it) with rvmacc and runs each on 2
// ranks with every synchronisation over MPI_Win_allocate and its default
// over MPI_Win_create, briefly: every run must print a positive figure
// for every size; over MPI_Win_create_dynamic with the test's default
// synchronisation and lock_all.
// scripts/osu.sh runs the same tests side by side with MPICH and
// Open MPI.
func TestOSU(t *testing.T) {
	src := os.Getenv("RVMA_OSU_DIR")
	if src == "" {
		t.Skip("RVMA_OSU_DIR is not set: the OSU Micro-Benchmarks' one-sided tests are not tested " +
			"(set it to an osu-micro-benchmarks source tree)")
	}
	if fi, err := os.Stat(filepath.Join(src, "mpi", "one-sided")); err == nil && fi.IsDir() {
		src = filepath.Join(src, "mpi", "one-sided")
	}
	_, err := os.Stat(filepath.Join(src, "osu_1sc.c"))
	require.NoError(t, err, "RVMA_OSU_DIR has no OSU one-sided tests")
	dir := built(t)
	osu := filepath.Join(dir, "osu")
	require.NoError(t, os.MkdirAll(osu, 0o755))
	all := []string{"lock", "pscw", "fence", "flush", "flush_local", "lock_all"}
	tests := []struct {
		name  string
		syncs []string
		def   string // the test's default synchronisation
	}{
		{"put_latency", all, "flush"},
		{"get_latency", all, "flush"},
		{"put_bw", all, "flush"},
		{"get_bw", all, "flush"},
		{"put_bibw", []string{"pscw", "fence"}, "pscw"},
		{"fop_latency", all, "flush"},
		{"cas_latency", all, "flush"},
		{"acc_latency", all, "flush"},
		{"get_acc_latency", all, "flush"},
	}
	for _, tt := range tests {
		prog := filepath.Join(osu, "osu_"+tt.name)
		srcs := []string{filepath.Join(src, "osu_"+tt.name+".c")}
		if b, err := os.ReadFile(srcs[0]); err == nil && bytes.Contains(b, []byte(`"osu_1sc.h"`)) {
			srcs = append(srcs, filepath.Join(src, "osu_1sc.c"))
		}
		cmd := exec.Command("./rvmacc", append([]string{"-O2", "-I" + src, "-o", prog}, srcs...)...)
		cmd.Env = append(os.Environ(), "RVMA_LIBDIR="+filepath.Join(dir, "lib"), "RVMA_INCDIR="+filepath.Join(dir, "include"),
			"RVMA_CC="+testutil.CC())
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "rvmacc osu_%s:\n%s", tt.name, out)

		type cfg struct{ win, sync string }
		cfgs := []cfg{{"create", tt.def}, {"dynamic", tt.def}}
		if tt.def != "pscw" {
			cfgs = append(cfgs, cfg{"dynamic", "lock_all"})
		}
		for _, s := range tt.syncs {
			cfgs = append(cfgs, cfg{"allocate", s})
		}
		for _, c := range cfgs {
			stdout, stderr, err := osuRun(dir, prog, "-w", c.win, "-s", c.sync, "-i", "20", "-x", "2")
			name := fmt.Sprintf("osu_%s -w %s -s %s", tt.name, c.win, c.sync)
			require.NoError(t, err, "%s\nstdout:\n%s\nstderr:\n%s", name, stdout, stderr)
			n := 0
			for _, line := range strings.Split(stdout, "\n") {
				f := strings.Fields(line)
				if len(f) != 2 || f[0][0] < '0' || f[0][0] > '9' {
					continue
				}
				v, err := strconv.ParseFloat(f[1], 64)
				require.NoError(t, err, "%s: %q", name, line)
				require.Greater(t, v, 0.0, "%s: %q", name, line)
				n++
			}
			want := 23 // 1 B to 4 MiB
			switch tt.name {
			case "put_latency", "get_latency", "acc_latency", "get_acc_latency":
				want = 24 // and 0 B
			case "fop_latency", "cas_latency":
				want = 1
			}
			require.Equal(t, want, n, "%s: sizes\n%s", name, stdout)
		}
	}
}

func osuRun(dir, prog string, args ...string) (string, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(dir, "rvmarun"), append([]string{"-n", "2", "--tag-output=false", prog}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	return out.String(), errb.String(), err
}
