package rma

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCompleter: a completer runs every wait once, in the order added,
// from one goroutine at a time, and starts again after it went idle.
func TestCompleter(t *testing.T) {
	var q completer
	var wg sync.WaitGroup
	var mu sync.Mutex
	var got []int
	running := 0
	release := make(chan struct{})
	for round := range 2 {
		for i := range 50 {
			n := round*100 + i
			q.add(&wg, func() {
				mu.Lock()
				running++
				require.Equal(t, 1, running, "one goroutine runs the waits")
				mu.Unlock()
				if n == 0 {
					<-release // the later waits queue behind this one
				}
				mu.Lock()
				got = append(got, n)
				running--
				mu.Unlock()
			})
		}
		if round == 0 {
			close(release)
		}
		wg.Wait()
	}
	want := []int{}
	for round := range 2 {
		for i := range 50 {
			want = append(want, round*100+i)
		}
	}
	require.Equal(t, want, got)
}
