//go:build !amd64 || purego

package ghash

// Available reports whether Update runs assembly.
const Available = false

const (
	hasAVX512 = false
	hasAVX2   = false
	best      = implGeneric
)

func blocksAVX512(powers *[512]byte, x *[16]byte, data *byte, n int) {
	panic("ghash: no assembly")
}

func blocksAVX2(powers *[512]byte, x *[16]byte, data *byte, n int) {
	panic("ghash: no assembly")
}
