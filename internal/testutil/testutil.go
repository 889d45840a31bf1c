// Package testutil holds helpers that several packages' tests share: a
// buffer that a process's output copier (or a logger) writes while a test
// reads it, a check that a process is gone, and a bounded wait for a
// process that must fail. It is for tests only.
package testutil

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// SyncBuffer is a bytes.Buffer that may be written and read at once.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Exited reports whether process pid is gone or a zombie (an orphan's new
// parent may never reap it). Linux only: elsewhere every pid looks gone.
func Exited(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := bytes.LastIndexByte(b, ')')
	return i < 0 || i+2 >= len(b) || b[i+2] == 'Z' || b[i+2] == 'X'
}

// ExitError waits up to d for cmd, already started, to end, and returns
// how it ended, which must be an *exec.ExitError (a non-zero status or a
// signal). A command still running after d is killed and fails the test,
// with what describe returns.
func ExitError(t testing.TB, cmd *exec.Cmd, d time.Duration, describe func() string) *exec.ExitError {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		require.ErrorAs(t, err, &ee, describe())
		return ee
	case <-time.After(d):
		cmd.Process.Kill()
		<-done
		t.Fatalf("%v still ran after %v: %s", cmd.Args, d, describe())
		return nil
	}
}

// Start starts cmd with its stdout and stderr in the returned buffer, and
// kills it when the test ends if it still runs.
func Start(t testing.TB, cmd *exec.Cmd) *SyncBuffer {
	t.Helper()
	var out SyncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	return &out
}

// CC is the C compiler tests use: $CC, else gcc.
func CC() string {
	if c := os.Getenv("CC"); c != "" {
		return c
	}
	return "gcc"
}

// Built is what a test binary builds once, with a C compiler, into a
// temporary directory (libraries, programs); TestMain calls Remove.
type Built struct {
	once sync.Once
	dir  string
	err  error
}

// Dir runs build once and returns the directory it made; it skips t
// without a C compiler (what names the tests that need one).
func (b *Built) Dir(t *testing.T, what string, build func() (string, error)) string {
	t.Helper()
	if _, err := exec.LookPath(CC()); err != nil {
		t.Skipf("no C compiler (%s): %s need one", CC(), what)
	}
	b.once.Do(func() { b.dir, b.err = build() })
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.dir
}

// Main runs the package's tests, then removes what they built: a
// TestMain.
func (b *Built) Main(m *testing.M) {
	code := m.Run()
	b.Remove()
	os.Exit(code)
}

// Remove deletes what was built.
func (b *Built) Remove() {
	if b.dir != "" {
		os.RemoveAll(b.dir)
	}
}

// HeaderCompiles checks that a C program of src's text, compiled with
// -Idir, builds alone in strict C99 and, where g++ is installed, in C++11:
// that the headers it includes stand alone. It skips without a C compiler.
func HeaderCompiles(t *testing.T, dir, src string) {
	t.Helper()
	if _, err := exec.LookPath(CC()); err != nil {
		t.Skipf("no C compiler (%s)", CC())
	}
	file := filepath.Join(t.TempDir(), "h.c")
	require.NoError(t, os.WriteFile(file, []byte(src), 0o644))
	flags := []string{"-Wall", "-Wextra", "-pedantic", "-Werror", "-fsyntax-only", "-I" + dir, file}
	cmds := [][]string{append([]string{CC(), "-std=c99"}, flags...)}
	if _, err := exec.LookPath("g++"); err == nil {
		cmds = append(cmds, append([]string{"g++", "-x", "c++", "-std=c++11"}, flags...))
	}
	for _, c := range cmds {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			t.Errorf("%v: %v\n%s", c, err, out)
		}
	}
}

// Recovered runs f and returns what it panicked with, as text ("" if it
// did not panic).
func Recovered(f func()) (msg string) {
	defer func() {
		if r := recover(); r != nil {
			msg = fmt.Sprint(r)
		}
	}()
	f()
	return ""
}

// Rounds runs f(g, i) for i in [0, rounds) in each of n goroutines g, at
// once, and fails t with the first error a goroutine met (a goroutine
// stops at its first).
func Rounds(t testing.TB, n, rounds int, f func(g, i int) error) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for g := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range rounds {
				if err := f(g, i); err != nil {
					errs <- fmt.Errorf("goroutine %d, round %d: %w", g, i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}
