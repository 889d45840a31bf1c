package main

import (
	"bytes"
	"context"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/rvma/rvma/internal/testutil"
)

// The C test suite (test/*.c) runs against librvma built into a temporary
// directory, each program under rvmarun as a job of real processes, with
// cgo's pointer checks on (GODEBUG=cgocheck=1; RVMA_CAPI_CGOCHECK2=1 builds
// the library with GOEXPERIMENT=cgocheck2, which also checks every store
// of a pointer into C memory, and RVMA_CAPI_RACE=1 with the race detector:
// both rebuild every package, minutes on a small machine, so they are not
// the default).

// builds is what the tests build once (removed by TestMain).
var builds testutil.Built

func TestMain(m *testing.M) { builds.Main(m) }

// programs lists the C tests.
func programs(t *testing.T) []string {
	files, err := filepath.Glob("test/*.c")
	if err != nil || len(files) == 0 {
		t.Fatalf("no C tests: %v", err)
	}
	var names []string
	for _, f := range files {
		names = append(names, strings.TrimSuffix(filepath.Base(f), ".c"))
	}
	return names
}

// built builds librvma (shared and static), rvmarun and the C tests once,
// and returns where.
func built(t *testing.T) string {
	t.Helper()
	return builds.Dir(t, "the C API's tests", func() (string, error) { return buildAll(programs(t)) })
}

func buildAll(progs []string) (string, error) {
	dir, err := os.MkdirTemp("", "capi-test")
	if err != nil {
		return "", err
	}
	run := func(env []string, name string, args ...string) error {
		cmd := exec.Command(name, args...)
		cmd.Env = append(os.Environ(), env...)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
		return nil
	}
	var env, flags []string
	if os.Getenv("RVMA_CAPI_CGOCHECK2") == "1" {
		env = append(env, "GOEXPERIMENT=cgocheck2")
	}
	if os.Getenv("RVMA_CAPI_RACE") == "1" {
		flags = append(flags, "-race")
	}
	steps := [][]string{
		append(append([]string{"build"}, flags...), "-buildmode=c-shared", "-o", filepath.Join(dir, "librvma.so"), "."),
		append(append([]string{"build"}, flags...), "-buildmode=c-archive", "-o", filepath.Join(dir, "static", "librvma.a"), "."),
		{"build", "-o", filepath.Join(dir, "rvmarun"), "../cmd/rvmarun"},
	}
	for _, s := range steps {
		if err := run(env, "go", s...); err != nil {
			return dir, err
		}
	}
	cflags := []string{"-std=c11", "-O1", "-g", "-Wall", "-Wextra", "-Werror", "-pthread", "-Iinclude", "-Itest"}
	for _, p := range progs {
		args := append(slices.Clone(cflags), "-o", filepath.Join(dir, p), "test/"+p+".c",
			"-L"+dir, "-lrvma", "-Wl,-rpath,"+dir)
		if err := run(nil, testutil.CC(), args...); err != nil {
			return dir, err
		}
	}
	// One program linked against the archive, as a static user would.
	args := append(slices.Clone(cflags), "-o", filepath.Join(dir, "basic-static"), "test/basic.c",
		filepath.Join(dir, "static", "librvma.a"), "-lpthread", "-ldl", "-lm")
	return dir, run(nil, testutil.CC(), args...)
}

// job runs prog under rvmarun with n ranks and the extra rvmarun flags,
// and checks that it said it passed.
func job(t *testing.T, dir, prog string, n int, flags ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	args := append([]string{"-n", fmt.Sprint(n)}, flags...)
	cmd := exec.CommandContext(ctx, filepath.Join(dir, "rvmarun"), append(args, filepath.Join(dir, prog))...)
	cmd.Env = append(os.Environ(), "GODEBUG=cgocheck=1")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	name := strings.TrimSuffix(prog, "-static")
	if want := fmt.Sprintf("%s: ok on %d ranks", name, n); err != nil || !strings.Contains(out.String(), want) {
		t.Fatalf("rvmarun %s %s: %v (want %q)\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), prog, err, want, out.String(), errb.String())
	}
}

// TestC runs every C test on 2 ranks and 4 (the providers' default: shared
// memory here), and the data-moving ones on 3 ranks over UDP, where
// windows the library allocates are C memory rather than shared.
func TestC(t *testing.T) {
	dir := built(t)
	for _, p := range programs(t) {
		t.Run(p, func(t *testing.T) {
			job(t, dir, p, 2)
			job(t, dir, p, 4)
			if p == "fence" || p == "notify" || p == "errors" || p == "match" || p == "shared" || p == "dynamic" {
				job(t, dir, p, 3, "--provider", "udp")
			}
		})
	}
	t.Run("static", func(t *testing.T) { job(t, dir, "basic-static", 2) })
}

// TestHeaderMatchesLibrary checks that rvma.h declares exactly the
// functions librvma exports: the library's Go side cannot include the
// prototypes (cgo would declare them again, without const), so nothing
// else ties them together.
func TestHeaderMatchesLibrary(t *testing.T) {
	dir := built(t)
	h, err := os.ReadFile("include/rvma.h")
	if err != nil {
		t.Fatal(err)
	}
	var declared []string
	for _, m := range regexp.MustCompile(`(?m)^(?:int|const char \*)\s*(rvma_\w+)\(`).FindAllSubmatch(h, -1) {
		declared = append(declared, string(m[1]))
	}
	f, err := elf.Open(filepath.Join(dir, "librvma.so"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	var exported []string
	for _, s := range syms {
		if strings.HasPrefix(s.Name, "rvma_") && s.Section != elf.SHN_UNDEF && elf.ST_TYPE(s.Info) == elf.STT_FUNC {
			exported = append(exported, s.Name)
		}
	}
	sort.Strings(declared)
	sort.Strings(exported)
	if !slices.Equal(declared, exported) {
		t.Fatalf("rvma.h declares\n%v\nlibrvma.so exports\n%v", declared, exported)
	}
	if len(declared) < 60 {
		t.Fatalf("only %d functions found in rvma.h: is the pattern right?", len(declared))
	}
}

// TestHeaderCompiles checks that rvma.h stands alone in strict C99 and in
// C++.
func TestHeaderCompiles(t *testing.T) {
	testutil.HeaderCompiles(t, "include", "#include \"rvma.h\"\nint main(void) { return rvma_strerror(0) == 0; }\n")
}

// TestHandles checks the table behind the handles: kinds, generations
// and reuse.
func TestHandles(t *testing.T) {
	var a table[int]
	a.kind = kindWin
	var b table[int]
	b.kind = kindRequest
	h1, _ := a.add(1)
	if v, ok := a.get(h1); !ok || v != 1 {
		t.Fatalf("get %#x: %v %v", h1, v, ok)
	}
	if _, ok := b.get(h1); ok {
		t.Fatal("a window handle is a request handle")
	}
	if _, ok := a.get(0); ok {
		t.Fatal("handle 0 is valid")
	}
	if v, ok := a.remove(h1); !ok || v != 1 {
		t.Fatal("remove")
	}
	if _, ok := a.remove(h1); ok {
		t.Fatal("removed twice")
	}
	h2, _ := a.add(2)
	if h2 == h1 || uint32(h2) != uint32(h1) {
		t.Fatalf("slot not reused with a new generation: %#x then %#x", h1, h2)
	}
	if _, ok := a.get(h1); ok {
		t.Fatal("a stale handle finds the slot's new value")
	}
	for i := range 3 * chunkSize {
		if _, ok := a.add(i); !ok {
			t.Fatal("table full early")
		}
	}
	if got := len(a.drain()); got != 3*chunkSize+1 {
		t.Fatalf("drained %d", got)
	}
	if _, ok := a.get(h2); ok {
		t.Fatal("a drained handle is valid")
	}
	if _, ok := a.get(^uint64(0)); ok {
		t.Fatal("a made-up handle is valid")
	}
}

// TestOverhead measures what a call through librvma costs over the same
// call from Go (make perf-capi; skipped otherwise): bench/overhead.c and
// bench/overhead/main.go run the same loop, 2 ranks on shm, alternating,
// RVMA_CAPI_BENCH_RUNS times each (default 3); it prints every run and
// the medians.
func TestOverhead(t *testing.T) {
	if os.Getenv("RVMA_CAPI_BENCH") != "1" {
		t.Skip("RVMA_CAPI_BENCH=1 runs the overhead benchmark (make perf-capi)")
	}
	dir := built(t)
	if out, err := exec.Command(testutil.CC(), "-O2", "-Iinclude", "-o", filepath.Join(dir, "overhead-c"), "bench/overhead.c",
		"-L"+dir, "-lrvma", "-Wl,-rpath,"+dir).CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if out, err := exec.Command("go", "build", "-o", filepath.Join(dir, "overhead-go"), "./bench/overhead").CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	runs := 3
	fmt.Sscan(os.Getenv("RVMA_CAPI_BENCH_RUNS"), &runs)
	iters := "1000000"
	if s := os.Getenv("RVMA_CAPI_BENCH_ITERS"); s != "" {
		iters = s
	}
	measure := func(bin, op string) float64 {
		out, err := exec.Command(filepath.Join(dir, "rvmarun"), "-n", "2", "--provider", "shm", "--tag-output=false",
			filepath.Join(dir, bin), op, iters).CombinedOutput()
		var ns float64
		var name string
		var n int
		if err == nil {
			_, err = fmt.Sscanf(strings.TrimSpace(string(out)), "%s %d %g ns/iteration", &name, &n, &ns)
		}
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", bin, op, err, out)
		}
		return ns
	}
	median := func(v []float64) float64 {
		s := slices.Sorted(slices.Values(v))
		return s[len(s)/2]
	}
	for _, op := range []string{"rank", "putflush", "fopflush"} {
		var c, g []float64
		for range runs {
			c = append(c, measure("overhead-c", op))
			g = append(g, measure("overhead-go", op))
		}
		t.Logf("%-8s C  %v ns/iteration", op, c)
		t.Logf("%-8s Go %v ns/iteration", op, g)
		t.Logf("%-8s median C %.1f, Go %.1f: C adds %.1f ns per iteration (minima %.1f, %.1f: %.1f)", op,
			median(c), median(g), median(c)-median(g), slices.Min(c), slices.Min(g), slices.Min(c)-slices.Min(g))
	}
}
