//go:build race

package udpfab

import (
	"runtime"
	"unsafe"
)

// raceRead tells the race detector that b is read now: a gathered payload
// is read by the kernel inside sendmmsg, which the detector does not see,
// so an application writing its buffer during a send would go unreported.
func raceRead(b []byte) {
	if len(b) > 0 {
		runtime.RaceReadRange(unsafe.Pointer(&b[0]), len(b))
	}
}
