// Package testutil holds helpers that several packages' tests share: a
// buffer that a process's output copier (or a logger) writes while a test
// reads it, and a check that a process is gone. It is for tests only.
package testutil

import (
	"bytes"
	"fmt"
	"os"
	"sync"
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
