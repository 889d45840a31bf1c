//go:build !linux

package spin

import "runtime"

func osYield() { runtime.Gosched() }

func osYieldHandoff() { runtime.Gosched() }
