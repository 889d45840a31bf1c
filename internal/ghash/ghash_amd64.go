//go:build amd64 && !purego

package ghash

import "golang.org/x/sys/cpu"

// Available reports whether Update runs the AVX-512 assembly.
var Available = cpu.X86.HasAVX2 && cpu.X86.HasAVX512F && cpu.X86.HasAVX512BW && cpu.X86.HasAVX512VL &&
	cpu.X86.HasAVX512VPCLMULQDQ && cpu.X86.HasPCLMULQDQ

// blocksAVX512 folds n bytes (a multiple of 16) at data into x.
//
//go:noescape
func blocksAVX512(powers *[512]byte, x *[16]byte, data *byte, n int)
