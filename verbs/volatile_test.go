//go:build !race

package verbs_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/verbs"
	"github.com/rvma/rvma/verbs/verbstest"
)

// TestReadOfChangingMemory: READs of memory its owner keeps writing return
// undefined bytes, as InfiniBand says, but they complete: a READ
// response is sealed over the bytes it sends, so its MAC never fails
// (a response sent from the memory itself, sealed before the kernel
// copied it, failed every retry: RetryExceeded). Not under the race
// detector: the writes race with the READs on purpose.
func TestReadOfChangingMemory(t *testing.T) {
	for _, env := range []verbstest.Env{verbstest.UDP(), verbstest.UDPLargest()} {
		t.Run(env.Name(), func(t *testing.T) {
			a, b := verbstest.Pair(t, env, verbstest.PairConfig{BufSize: 1 << 20,
				Connect: verbs.ConnectConfig{Timeout: 2 * time.Millisecond, MaxTimeout: 20 * time.Millisecond}})
			var stop atomic.Bool
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; !stop.Load(); i++ {
					for k := 0; k < len(b.Buf); k += 512 {
						b.Buf[k] = byte(i)
					}
				}
			}()
			defer func() { stop.Store(true); wg.Wait() }()
			for i := range 20 {
				a.Post(t, verbs.SendWR{ID: uint64(i), Opcode: verbs.OpRead, Flags: verbs.FlagSignaled,
					SGL: []verbs.SGE{a.MR.SGE(0, 256<<10)}, RemoteAddr: b.MR.Addr(), RKey: b.MR.RKey()})
				wc := a.Wait(t)
				require.Equal(t, verbs.StatusSuccess, wc.Status, "READ %d", i)
			}
			require.Zero(t, a.Dev.Stats().BadMAC)
		})
	}
}
