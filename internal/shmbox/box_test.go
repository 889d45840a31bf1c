package shmbox

import (
	"os/exec"
	"sync"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

func newBox(t testing.TB, slots, threshold int, ops, appended bool) *Box {
	words := make([]uint64, Size(slots)/8)
	return New(unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), len(words)*8), slots, threshold, ops, appended)
}

// TestCounting walks the state machine: where puts start, when a buffer
// is full, when its epoch can complete, what a reservation holds back.
func TestCounting(t *testing.T) {
	type step struct {
		op       string // post, begin, count, reserve, unreserve, open, end, retire, reset
		off, n   int
		last     bool
		slot     int
		wantSlot int
		wantBase int
		wantRes  Result
		full     bool // after the step: is the head completable
	}
	for _, tc := range []struct {
		name      string
		threshold int
		ops       bool
		appended  bool
		steps     []step
	}{
		{"bytes: fill, overshoot, next buffer", 100, false, false, []step{
			{op: "begin", off: 0, n: 10, wantRes: NoBuffer},
			{op: "post", n: 200}, {op: "post", n: 200},
			{op: "begin", off: 0, n: 60, wantSlot: 0},
			{op: "count", slot: 0, off: 0, n: 60, last: true},
			{op: "begin", off: 150, n: 50, wantSlot: 0, wantBase: 150},
			{op: "count", slot: 0, off: 150, n: 50, last: true, full: true},
			{op: "begin", off: 0, n: 8, wantSlot: 1},
			{op: "begin", off: 190, n: 11, wantRes: OutOfRange},
			{op: "retire"},
			{op: "begin", off: 0, n: 8, wantSlot: 1},
		}},
		{"ops: a put in progress holds the epoch", 2, true, false, []step{
			{op: "post", n: 64},
			{op: "count", slot: 0, n: 8, last: true},
			{op: "open", slot: 0},
			{op: "count", slot: 0, off: 8, n: 8, last: false},
			{op: "count", slot: 0, off: 16, n: 8, last: true},
			{op: "end", slot: 0, full: true},
		}},
		{"appended: the tail moves, the offset is ignored", 30, false, true, []step{
			{op: "post", n: 40},
			{op: "begin", off: 999, n: 20, wantSlot: 0, wantBase: 0},
			{op: "begin", off: 0, n: 20, wantSlot: 0, wantBase: 20},
			{op: "begin", off: 0, n: 1, wantRes: OutOfRange},
		}},
		{"reservations count toward fullness at once", 50, false, false, []step{
			{op: "post", n: 100}, {op: "post", n: 100},
			{op: "reserve", slot: 0, n: 50},
			{op: "begin", off: 0, n: 8, wantSlot: 1},
			{op: "count", slot: 0, off: 0, n: 50, last: true},
			{op: "unreserve", slot: 0, n: 50, full: true},
		}},
		{"reset forgets the epoch", 10, false, false, []step{
			{op: "post", n: 100},
			{op: "count", slot: 0, n: 10, last: true, full: true},
			{op: "reset", slot: 0},
			{op: "begin", off: 0, n: 8, wantSlot: 0},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBox(t, 4, tc.threshold, tc.ops, tc.appended)
			b.Lock()
			defer b.Unlock()
			for k, s := range tc.steps {
				switch s.op {
				case "post":
					require.True(t, b.Room())
					b.Post(Location{Len: s.n})
				case "begin":
					slot, base, r := b.Begin(uint64(s.off), s.n)
					require.Equal(t, s.wantRes, r, "step %d", k)
					if r == OK {
						require.Equal(t, s.wantSlot, slot, "step %d", k)
						require.Equal(t, s.wantBase, base, "step %d", k)
					}
					continue
				case "count":
					b.Count(s.slot, s.off, s.n, s.last)
				case "reserve":
					b.Reserve(s.slot, s.n)
				case "unreserve":
					b.Unreserve(s.slot, s.n)
				case "open":
					b.Opened(s.slot)
				case "end":
					b.Ended(s.slot)
				case "retire":
					b.Retire()
					continue
				case "reset":
					b.Reset(s.slot)
				}
				require.Equal(t, s.full, b.Completable(), "step %d (%s)", k, s.op)
			}
		})
	}
}

func TestRangesAndRoom(t *testing.T) {
	b := newBox(t, 2, 1<<20, false, false)
	b.Lock()
	defer b.Unlock()
	b.Post(Location{Len: 1 << 20})
	b.Post(Location{Len: 10})
	require.False(t, b.Room(), "two slots, two buffers")
	var got [][2]int
	for i := range MaxRanges {
		b.Count(0, i*100, 7, true)
	}
	b.Ranges(0, func(off, n int) { got = append(got, [2]int{off, n}) })
	require.Len(t, got, MaxRanges)
	require.Equal(t, [2]int{100, 7}, got[1])
	b.Count(0, 5000, 1, true)
	got = got[:0]
	b.Ranges(0, func(off, n int) { got = append(got, [2]int{off, n}) })
	require.Equal(t, [][2]int{{0, 1 << 20}}, got, "too many: the whole buffer")
	bytes, ops := b.Counts(0)
	require.Equal(t, MaxRanges*7+1, bytes)
	require.Equal(t, MaxRanges+1, ops)
}

// TestLockTakeover: a lock held by a process that died is taken over.
func TestLockTakeover(t *testing.T) {
	cmd := exec.Command("true")
	require.NoError(t, cmd.Run())
	b := newBox(t, 1, 1, false, false)
	*b.u64(hLock) = uint64(cmd.Process.Pid) // held by a process that is gone
	holder := make(chan uint64)
	go func() {
		b.Lock()
		h := *b.u64(hLock)
		b.Unlock()
		holder <- h
	}()
	require.Equal(t, pid, <-holder, "taken over")
}

// TestLockExclusion: counting from many goroutines under the lock is exact.
func TestLockExclusion(t *testing.T) {
	b := newBox(t, 1, 1<<30, false, false)
	b.Lock()
	b.Post(Location{Len: 1 << 30})
	b.Unlock()
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 1000 {
				b.Lock()
				b.Count(0, 0, 1, true)
				b.Unlock()
			}
		}()
	}
	wg.Wait()
	bytes, ops := b.Counts(0)
	require.Equal(t, 4000, bytes)
	require.Equal(t, 4000, ops)
}

// FuzzOpen: a box another process laid out is untrusted; whatever its
// bytes, Open refuses it or the box's functions stay in bounds.
func FuzzOpen(f *testing.F) {
	good := newBox(f, 2, 10, false, true)
	good.Lock()
	good.Post(Location{Len: 64})
	good.Unlock()
	f.Add(append([]byte(nil), good.mem...), uint64(3), 5)
	f.Add(make([]byte, 300), uint64(0), 1)
	f.Fuzz(func(t *testing.T, data []byte, off uint64, n int) {
		words := make([]uint64, (len(data)+7)/8+1)
		mem := unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), len(words)*8)[:len(data)]
		copy(mem, data)
		b, err := Open(mem)
		if err != nil {
			return
		}
		n = n & 0xFFFF
		*b.u64(hLock) = 0
		b.Lock()
		defer b.Unlock()
		if i, ok := b.Find(); ok {
			loc := b.Location(i)
			slot, base, r := b.Begin(off, n)
			if r == OK {
				require.Equal(t, i, slot)
				require.LessOrEqual(t, uint64(base)+uint64(n), uint64(loc.Len), "a put lands inside its buffer")
				b.Count(slot, base, n, true)
			}
		}
		b.Completable()
	})
}

// TestOpen: a box laid out by this layout opens; any other header is
// refused with the reason, so an initiator falls back to packets.
func TestOpen(t *testing.T) {
	cases := []struct {
		name  string
		spoil func(b *Box) []byte
		want  error
	}{
		{"good", func(b *Box) []byte { return b.mem }, nil},
		{"magic", func(b *Box) []byte { b.put(hMagic, magic+1); return b.mem }, ErrCorrupt},
		{"version", func(b *Box) []byte { b.put(hVersion, Version+1); return b.mem }, ErrVersion},
		{"old version", func(b *Box) []byte { b.put(hVersion, 0); return b.mem }, ErrVersion},
		{"no slots", func(b *Box) []byte { b.put(hSlots, 0); return b.mem }, ErrCorrupt},
		{"slots past memory", func(b *Box) []byte { b.put(hSlots, 5); return b.mem }, ErrCorrupt},
		{"short", func(b *Box) []byte { return b.mem[:hdrBytes-8] }, ErrCorrupt},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			mem := c.spoil(newBox(t, 4, 10, false, true))
			b, err := Open(mem)
			if c.want == nil {
				require.NoError(t, err)
				require.Equal(t, 10, b.Threshold())
				return
			}
			require.ErrorIs(t, err, c.want)
			require.Nil(t, b)
		})
	}
}

// TestSleepersCounted: a target's waiters announce their sleeps one by
// one; one waking must not hide another still asleep (a flag did, and a
// completion then woke nobody).
func TestSleepersCounted(t *testing.T) {
	b := newBox(t, 2, 8, false, false)
	require.False(t, b.Sleeping())
	b.SetSleeping(true)
	b.SetSleeping(true)
	b.SetSleeping(false)
	require.True(t, b.Sleeping(), "one waiter still sleeps")
	require.True(t, b.Wake())
	b.SetSleeping(false)
	require.False(t, b.Sleeping())
	require.False(t, b.Wake())
}
