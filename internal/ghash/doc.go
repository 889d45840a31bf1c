// Package ghash is GCM's universal hash (NIST SP 800-38D, GHASH) over
// wide carry-less multiplies, 32 blocks a reduction, for the packet MAC
// (AES-GMAC) that every UDP packet carries: 512-bit (AVX-512 VPCLMULQDQ,
// about 23 GB/s on the AMD EPYC of docs/PERFORMANCE.md) or, on CPUs with
// VPCLMULQDQ but no AVX-512 (AMD Zen 3, Intel Alder Lake), 256-bit (about
// 9 GB/s on a Zen 3, where Go's own AES-GCM, eight blocks a round with
// 128-bit multiplies, hashes 3-5). Where the CPU has neither, Available is
// false and callers keep the standard library's GCM.
//
// A Key is immutable after New and safe for concurrent use; Sum reads its
// data and writes only the state it is given.
package ghash
