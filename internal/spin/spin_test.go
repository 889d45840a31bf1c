package spin

import (
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// A wait in PauseShared gives the core to the kernel on most rounds, but
// must still let a goroutine of its own process run within a few times
// yieldEvery rounds on one processor (a Gosched's caller is sometimes
// picked again first): the wait for a shared word does not need one, yet
// a placing goroutine of the same rank would otherwise wait for the
// runtime's preemption, milliseconds later.
func TestPauseSharedRunsGoroutines(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	for _, pause := range []struct {
		name string
		f    func(int)
	}{{"shared", PauseShared}, {"pause", Pause}} {
		t.Run(pause.name, func(t *testing.T) {
			var done atomic.Bool
			before := Rounds()
			go done.Store(true)
			i := 0
			for ; !done.Load(); i++ {
				require.Less(t, i, 4*yieldEvery, "the goroutine did not run")
				pause.f(i)
			}
			require.Equal(t, uint64(i), Rounds()-before, "every round counts")
		})
	}
}
