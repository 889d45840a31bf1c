// Package ghash is GCM's universal hash (NIST SP 800-38D, GHASH) over
// 512-bit carry-less multiplies (AVX-512 VPCLMULQDQ), 32 blocks a
// reduction, for the packet MAC (AES-GMAC) that every UDP packet carries.
// Go's own AES-GCM hashes eight blocks a round with 128-bit multiplies,
// about 7.7 GB/s here: a third of a core at the UDP provider's rate
// (docs/PERFORMANCE.md). Where the CPU lacks the instructions, Available
// is false and callers keep the standard library's GCM.
//
// A Key is immutable after New and safe for concurrent use; Sum reads its
// data and writes only the state it is given.
package ghash
