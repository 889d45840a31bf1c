//go:build !linux

package launch

// ResetSignals does nothing outside Linux, where rvma's launchers run.
func ResetSignals() error { return nil }
