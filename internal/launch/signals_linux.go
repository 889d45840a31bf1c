package launch

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"unsafe"
)

// resettable are the signals ResetSignals gives back their default.
var resettable = []syscall.Signal{syscall.SIGINT, syscall.SIGTERM}

// inherited holds which of them this process was started with ignored,
// read before main runs: signal.Ignored cannot tell those from signals
// the program ignored itself later.
var inherited = ignoredNow()

func ignoredNow() map[syscall.Signal]bool {
	m := map[syscall.Signal]bool{}
	for _, s := range resettable {
		m[s] = signal.Ignored(s)
	}
	return m
}

// ResetSignals gives SIGINT and SIGTERM their default action again if
// this process was started with them ignored (a shell ignores SIGINT in
// the commands it starts with "&" in a script), so that a launcher's
// forwarded SIGINT stops the rank. Call it early, from rma.Init.
//
// The os/signal package cannot do this: Go keeps an inherited ignored
// SIGINT (and SIGHUP, which is left alone here: nohup means it) ignored,
// and signal.Reset restores that. So the default action is set with
// rt_sigaction, then handed to the runtime through a Notify and Stop,
// which leaves its handler in charge of the default action and
// signal.Ignored telling the truth. An inherited ignored SIGTERM needs
// nothing: Go handles SIGTERM regardless.
func ResetSignals() error {
	for _, s := range resettable {
		if !inherited[s] || !signal.Ignored(s) {
			continue
		}
		if err := setDefault(s); err != nil {
			return fmt.Errorf("launch: reset %v: %w", s, err)
		}
		c := make(chan os.Signal, 1)
		signal.Notify(c, s)
		signal.Stop(c)
		select {
		case <-c: // it came while we held it: deliver it again
			syscall.Kill(os.Getpid(), s)
		default:
		}
	}
	return nil
}

// setDefault sets a signal's action to SIG_DFL. An all-zero struct
// sigaction says SIG_DFL, no flags and an empty mask whatever the
// architecture's layout; the array is larger than any.
func setDefault(s syscall.Signal) error {
	var act [8]uint64
	const sigsetSize = 8 // the kernel's sigset_t: 64 signals
	_, _, errno := syscall.RawSyscall6(syscall.SYS_RT_SIGACTION, uintptr(s), uintptr(unsafe.Pointer(&act)), 0, sigsetSize, 0, 0)
	if errno != 0 {
		return errno
	}
	return nil
}
