package reliability

import (
	"container/heap"
	"fmt"
	"math/rand/v2"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// floatHeap is a min-heap of retry times.
type floatHeap []float64

func (h floatHeap) Len() int           { return len(h) }
func (h floatHeap) Less(i, j int) bool { return h[i] < h[j] }
func (h floatHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *floatHeap) Push(x any)        { *h = append(*h, x.(float64)) }
func (h *floatHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// simSR plays selective repeat on one link chunk by chunk: one sender that
// injects a chunk every t, retransmissions first once due (repair after a
// lost send ended), each send lost with probability p. It returns when the
// sender learns the last chunk arrived.
func simSR(rng *rand.Rand, n int64, t, repair, rtt, p float64) float64 {
	var retry floatHeap
	now, lastOK := 0.0, 0.0
	for next := int64(0); next < n || retry.Len() > 0; {
		switch {
		case retry.Len() > 0 && retry[0] <= now:
			heap.Pop(&retry)
		case next < n:
			next++
		default:
			now = retry[0]
			continue
		}
		if rng.Float64() < p {
			heap.Push(&retry, now+t+repair)
		} else {
			lastOK = max(lastOK, now+t)
		}
		now += t
	}
	return lastOK + rtt
}

// simEC sends stripes of k data and m parity chunks; stripes that lost
// more than m fall back to selective repeat of their missing data chunks,
// starting fallback after the sender could have learned of completion.
func simEC(rng *rand.Rand, n int64, k, m int, t, fallback, repair, rtt, p float64) float64 {
	missing := int64(0)
	for s := int64(0); s*int64(k) < n; s++ {
		data := min(int64(k), n-s*int64(k))
		lost, lostData := 0, int64(0)
		for i := int64(0); i < data+int64(m); i++ {
			if rng.Float64() < p {
				lost++
				if i < data {
					lostData++
				}
			}
		}
		if lost > m {
			missing += lostData
		}
	}
	stripes := (n + int64(k) - 1) / int64(k)
	end := float64(n+stripes*int64(m))*t + rtt
	if missing == 0 {
		return end
	}
	return end + fallback + simSR(rng, missing, t, repair, rtt, p)
}

// The model against a Monte-Carlo simulation of the same link: the mean
// of the samples within 5% of the model, as the paper validated it.
func TestModelAgainstSimulation(t *testing.T) {
	const chunk = 4096
	link := Link{Rate: 500e6 / 8, RTT: 25 * time.Millisecond}
	repair := link.RTT + link.RTT/8
	fallback := link.RTT / 2
	sizes := []int64{64 << 10, 1 << 20, 16 << 20, 256 << 20}
	losses := []float64{1e-4, 1e-3, 1e-2, 5e-2, 0.2}
	if testing.Short() {
		sizes = sizes[:3]
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, size := range sizes {
		for _, p := range losses {
			l := link
			l.Loss = p
			n := (size + chunk - 1) / chunk
			runs := int(min(2000, 4e6/n))
			tt := float64(chunk) / l.Rate
			var sr, ec float64
			for r := 0; r < runs; r++ {
				sr += simSR(rng, n, tt, repair.Seconds(), l.RTT.Seconds(), p)
				ec += simEC(rng, n, 32, 4, tt, fallback.Seconds(), repair.Seconds(), l.RTT.Seconds(), p)
			}
			sr /= float64(runs)
			ec /= float64(runs)
			msr := SRTime(l, size, chunk, repair).Seconds()
			mec := ECTime(l, size, chunk, 32, 4, fallback, repair).Seconds()
			t.Logf("size %9d p %.0e: SR sim %8.2fms model %8.2fms (%+.1f%%); EC(32,4) sim %8.2fms model %8.2fms (%+.1f%%)",
				size, p, sr*1e3, msr*1e3, 100*(msr/sr-1), ec*1e3, mec*1e3, 100*(mec/ec-1))
			require.InEpsilon(t, sr, msr, 0.05, "SR size %d loss %g", size, p)
			require.InEpsilon(t, ec, mec, 0.05, "EC size %d loss %g", size, p)
		}
	}
}

func TestModelTable(t *testing.T) {
	l := Link{Rate: 500e6 / 8, RTT: 25 * time.Millisecond}
	ideal := func(size int64) time.Duration {
		return time.Duration(float64(size)/l.Rate*float64(time.Second)) + l.RTT
	}
	for _, tc := range []struct {
		size int64
		loss float64
		want Scheme
	}{
		{256 << 20, 0, SR},    // nothing to repair: parity is pure cost
		{256 << 20, 1e-2, SR}, // injection dominates: SR hides repairs in the pipeline
		{1 << 20, 1e-2, EC},   // one message near 1/P chunks, below the BDP: EC
		{4 << 20, 1e-3, EC},
		{64 << 10, 1e-6, SR},
	} {
		t.Run(fmt.Sprintf("%d/%g", tc.size, tc.loss), func(t *testing.T) {
			l := l
			l.Loss = tc.loss
			best, all := Choose(l, tc.size, 4096, 32, []int{1, 2, 4, 8}, l.RTT+l.RTT/8, l.RTT/2)
			t.Logf("ideal %v, %v", ideal(tc.size), all)
			require.Equal(t, tc.want, best.Scheme)
			require.GreaterOrEqual(t, best.Time, ideal(tc.size)-time.Millisecond)
		})
	}
	// Without loss SR is exactly the ideal plus one chunk.
	require.InDelta(t, float64(ideal(1<<20)), float64(SRTime(l, 1<<20, 4096, l.RTT)), float64(100*time.Microsecond))
}

func TestChunkLossAndMDS(t *testing.T) {
	require.InDelta(t, 1-0.99*0.99*0.99, ChunkLoss(0.01, 3), 1e-12)
	require.Equal(t, 0.0, ChunkLoss(0, 16))
	require.InDelta(t, 1.0, MDSSuccess(0, 32, 8), 1e-12)
	// k=1, m=1: fails only if both are lost.
	require.InDelta(t, 1-0.1*0.1, MDSSuccess(0.1, 1, 1), 1e-12)
	ps := []float64{MDSSuccess(0.01, 32, 1), MDSSuccess(0.01, 32, 2), MDSSuccess(0.01, 32, 8)}
	require.True(t, sort.Float64sAreSorted(ps))
}
