//go:build amd64 && !purego

package ghash

import "golang.org/x/sys/cpu"

// hasAVX512 and hasAVX2 say which assembly the CPU runs: 512-bit
// carry-less multiplies, or 256-bit ones (VEX-encoded VPCLMULQDQ, as AMD's
// Zen 3 and Intel's Alder Lake have without AVX-512). golang.org/x/sys/cpu
// reports VPCLMULQDQ only with AVX-512, so the 256-bit form is asked of
// CPUID here.
var (
	hasAVX512 = cpu.X86.HasAVX2 && cpu.X86.HasAVX512F && cpu.X86.HasAVX512BW && cpu.X86.HasAVX512VL &&
		cpu.X86.HasAVX512VPCLMULQDQ && cpu.X86.HasPCLMULQDQ
	hasAVX2 = cpu.X86.HasAVX2 && cpu.X86.HasPCLMULQDQ && cpuid7ECX()&(1<<10) != 0
)

// Available reports whether Update runs assembly.
var Available = hasAVX512 || hasAVX2

// best is the fastest implementation the CPU runs.
var best = func() impl {
	switch {
	case hasAVX512:
		return implAVX512
	case hasAVX2:
		return implAVX2
	}
	return implGeneric
}()

// blocksAVX512 folds n bytes (a multiple of 16) at data into x.
//
//go:noescape
func blocksAVX512(powers *[512]byte, x *[16]byte, data *byte, n int)

// blocksAVX2 is blocksAVX512 on 256-bit registers.
//
//go:noescape
func blocksAVX2(powers *[512]byte, x *[16]byte, data *byte, n int)

// cpuid7ECX returns ECX of CPUID leaf 7, subleaf 0.
func cpuid7ECX() uint32
