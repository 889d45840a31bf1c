//go:build !amd64 || purego

package ghash

// Available reports whether Update runs the AVX-512 assembly.
const Available = false

func blocksAVX512(powers *[512]byte, x *[16]byte, data *byte, n int) {
	panic("ghash: no assembly")
}
