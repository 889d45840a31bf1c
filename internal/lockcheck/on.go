//go:build rvmadebug

package lockcheck

import (
	"fmt"
	"reflect"
	"runtime"
	"sync"
	"sync/atomic"
)

// Enabled reports whether the checks are compiled in (the rvmadebug tag).
const Enabled = true

// Mutex is a mutual exclusion lock of class C that knows which goroutine
// holds it. Its zero value is an unlocked mutex.
type Mutex[C Class] struct {
	mu    sync.Mutex
	owner atomic.Int64 // goroutine id of the holder; 0 when unlocked
}

// Lock locks m. Locking a mutex the calling goroutine holds already
// panics (sync.Mutex would deadlock).
func (m *Mutex[C]) Lock() {
	g := goid()
	if m.owner.Load() == g {
		panic(fmt.Sprintf("rvmadebug: goroutine %d locks %s, which it holds already (it would deadlock)", g, className[C]()))
	}
	m.mu.Lock()
	m.owner.Store(g)
	classOf[C]().add(g, 1)
}

// TryLock tries to lock m and reports whether it did.
func (m *Mutex[C]) TryLock() bool {
	if !m.mu.TryLock() {
		return false
	}
	g := goid()
	m.owner.Store(g)
	classOf[C]().add(g, 1)
	return true
}

// Unlock unlocks m. As with sync.Mutex, a goroutine other than the one
// that locked it may unlock it; the lock is then no longer counted
// against the goroutine that locked it.
func (m *Mutex[C]) Unlock() {
	g := m.owner.Swap(0)
	if g == 0 {
		panic(fmt.Sprintf("rvmadebug: unlock of unlocked %s", className[C]()))
	}
	classOf[C]().add(g, -1)
	m.mu.Unlock()
}

func (m *Mutex[C]) heldBy(g int64) bool { return m.owner.Load() == g }
func (m *Mutex[C]) class() string       { return className[C]() }

// holder is what AssertHeld needs of a Mutex of any class.
type holder interface {
	heldBy(g int64) bool
	class() string
}

// AssertNotHeld panics if the calling goroutine holds a lock of class C
// (or is in a region of it); rule says what was about to happen.
func AssertNotHeld[C Class](rule string) {
	g := goid()
	if n := classOf[C]().count(g); n > 0 {
		panic(fmt.Sprintf("rvmadebug: %s, but goroutine %d holds %s (%d)", rule, g, className[C](), n))
	}
}

// AssertHeld panics unless the calling goroutine holds m; rule says what
// needs it.
func AssertHeld(m holder, rule string) {
	if g := goid(); !m.heldBy(g) {
		panic(fmt.Sprintf("rvmadebug: %s, but goroutine %d does not hold %s", rule, g, m.class()))
	}
}

// AssertNotHolding panics if the calling goroutine holds m; rule says
// what must not run under it.
func AssertNotHolding(m holder, rule string) {
	if g := goid(); m.heldBy(g) {
		panic(fmt.Sprintf("rvmadebug: %s, but goroutine %d holds that %s", rule, g, m.class()))
	}
}

// Enter marks the calling goroutine as in a region of class C until the
// matching Exit.
func Enter[C Class]() { classOf[C]().add(goid(), 1) }

// Exit ends a region that Enter began.
func Exit[C Class]() { classOf[C]().add(goid(), -1) }

// class counts, per goroutine, the locks of one class it holds.
type class struct {
	mu   sync.Mutex
	held map[int64]int
}

func (c *class) add(g int64, d int) {
	c.mu.Lock()
	if n := c.held[g] + d; n > 0 {
		c.held[g] = n
	} else {
		delete(c.held, g)
	}
	c.mu.Unlock()
}

func (c *class) count(g int64) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.held[g]
}

var classes sync.Map // reflect.Type of the class -> *class

func classOf[C Class]() *class {
	t := reflect.TypeFor[C]()
	if c, ok := classes.Load(t); ok {
		return c.(*class)
	}
	c, _ := classes.LoadOrStore(t, &class{held: map[int64]int{}})
	return c.(*class)
}

func className[C Class]() string {
	var c C
	return c.LockClass()
}

// goid is the calling goroutine's id, from the first line of its stack
// trace ("goroutine 18 [running]:").
func goid() int64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	const prefix = "goroutine "
	if len(b) < len(prefix) || string(b[:len(prefix)]) != prefix {
		panic("rvmadebug: cannot read the goroutine id from " + string(b))
	}
	var id int64
	for _, c := range b[len(prefix):] {
		if c < '0' || c > '9' {
			break
		}
		id = id*10 + int64(c-'0')
	}
	return id
}
