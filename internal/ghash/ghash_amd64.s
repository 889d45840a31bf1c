//go:build amd64 && !purego

#include "textflag.h"

// Each 128-bit lane of a block register is byte-reversed into a reflected
// integer (bswapMask), multiplied by the key power of its place, and the
// products summed unreduced: lo (Z5), hi (Z6) and the middle terms (Z7).
// FOLD sums the lanes, adds the middle terms in and reduces into X0
// with two multiplies by the polynomial's constant (X14).
// The key powers stay in Z16-Z19 and Z24-Z27, which FOLD does not touch.

DATA bswapMask<>+0(SB)/8, $0x08090a0b0c0d0e0f
DATA bswapMask<>+8(SB)/8, $0x0001020304050607
GLOBL bswapMask<>(SB), RODATA|NOPTR, $16

DATA polyConst<>+0(SB)/8, $0x0000000000000001
DATA polyConst<>+8(SB)/8, $0xc200000000000000
GLOBL polyConst<>(SB), RODATA|NOPTR, $16

// MULFIRST sets Z5, Z6, Z7 to the products of blocks D and powers P.
#define MULFIRST(D, P) \
	VPCLMULQDQ $0x00, P, D, Z5 \
	VPCLMULQDQ $0x11, P, D, Z6 \
	VPCLMULQDQ $0x01, P, D, Z7 \
	VPCLMULQDQ $0x10, P, D, Z8 \
	VPXORQ     Z8, Z7, Z7

// MULADD adds the products of blocks D and powers P to Z5, Z6, Z7.
#define MULADD(D, P) \
	VPCLMULQDQ $0x00, P, D, Z8 \
	VPCLMULQDQ $0x11, P, D, Z9 \
	VPXORQ     Z8, Z5, Z5 \
	VPXORQ     Z9, Z6, Z6 \
	VPCLMULQDQ $0x01, P, D, Z8 \
	VPCLMULQDQ $0x10, P, D, Z9 \
	VPTERNLOGQ $0x96, Z9, Z8, Z7

// SUMLANES sums the four lanes of Z into its lowest (X), with the
// temporaries T (Y) and U (X).
#define SUMLANES(Z, Y, X, T, U) \
	VEXTRACTI64X4 $1, Z, T \
	VPXOR         T, Y, Y  \
	VEXTRACTI128  $1, Y, U \
	VPXOR         U, X, X

// REDUCE adds the middle terms (X7) into the low (X5) and high (X6)
// products and reduces the product into X0.
#define REDUCE \
	VPSLLDQ    $8, X7, X8     \
	VPSRLDQ    $8, X7, X7     \
	VPXOR      X8, X5, X5     \
	VPXOR      X7, X6, X6     \
	VPCLMULQDQ $0x01, X5, X14, X8 \
	VPSHUFD    $0x4e, X5, X5  \
	VPXOR      X8, X5, X5     \
	VPCLMULQDQ $0x01, X5, X14, X8 \
	VPSHUFD    $0x4e, X5, X5  \
	VPXOR      X8, X5, X5     \
	VPXOR      X6, X5, X0

// FOLD sums Z5, Z6, Z7's lanes and reduces the product into X0.
#define FOLD \
	SUMLANES(Z5, Y5, X5, Y8, X8)  \
	SUMLANES(Z6, Y6, X6, Y9, X9)  \
	SUMLANES(Z7, Y7, X7, Y10, X10) \
	REDUCE

// func blocksAVX512(powers *[512]byte, x *[16]byte, data *byte, n int)
TEXT ·blocksAVX512(SB), NOSPLIT, $0-32
	MOVQ powers+0(FP), DI
	MOVQ x+8(FP), CX
	MOVQ data+16(FP), SI
	MOVQ n+24(FP), DX

	VBROADCASTI32X4 bswapMask<>(SB), Z15
	VMOVDQU         polyConst<>(SB), X14
	VMOVDQU         (CX), X0 // a VEX load: the upper lanes of Z0 are zero
	VMOVDQU64       (DI), Z24
	VMOVDQU64       64(DI), Z25
	VMOVDQU64       128(DI), Z26
	VMOVDQU64       192(DI), Z27
	VMOVDQU64       256(DI), Z16
	VMOVDQU64       320(DI), Z17
	VMOVDQU64       384(DI), Z18
	VMOVDQU64       448(DI), Z19

loop512:
	// 32 blocks a round: one reduction, whose latency bounds the loop,
	// for twice the data of loop256's.
	CMPQ      DX, $512
	JB        loop256
	VMOVDQU64 (SI), Z1
	VMOVDQU64 64(SI), Z2
	VMOVDQU64 128(SI), Z3
	VMOVDQU64 192(SI), Z4
	VMOVDQU64 256(SI), Z20
	VMOVDQU64 320(SI), Z21
	VMOVDQU64 384(SI), Z22
	VMOVDQU64 448(SI), Z23
	VPSHUFB   Z15, Z1, Z1
	VPSHUFB   Z15, Z2, Z2
	VPSHUFB   Z15, Z3, Z3
	VPSHUFB   Z15, Z4, Z4
	VPSHUFB   Z15, Z20, Z20
	VPSHUFB   Z15, Z21, Z21
	VPSHUFB   Z15, Z22, Z22
	VPSHUFB   Z15, Z23, Z23
	VPXORQ    Z0, Z1, Z1
	MULFIRST(Z1, Z24)
	MULADD(Z2, Z25)
	MULADD(Z3, Z26)
	MULADD(Z4, Z27)
	MULADD(Z20, Z16)
	MULADD(Z21, Z17)
	MULADD(Z22, Z18)
	MULADD(Z23, Z19)
	FOLD
	ADDQ      $512, SI
	SUBQ      $512, DX
	JMP       loop512

loop256:
	CMPQ      DX, $256
	JB        loop64
	VMOVDQU64 (SI), Z1
	VMOVDQU64 64(SI), Z2
	VMOVDQU64 128(SI), Z3
	VMOVDQU64 192(SI), Z4
	VPSHUFB   Z15, Z1, Z1
	VPSHUFB   Z15, Z2, Z2
	VPSHUFB   Z15, Z3, Z3
	VPSHUFB   Z15, Z4, Z4
	VPXORQ    Z0, Z1, Z1
	MULFIRST(Z1, Z16)
	MULADD(Z2, Z17)
	MULADD(Z3, Z18)
	MULADD(Z4, Z19)
	FOLD
	ADDQ      $256, SI
	SUBQ      $256, DX
	JMP       loop256

loop64:
	CMPQ      DX, $64
	JB        loop16
	VMOVDQU64 (SI), Z1
	VPSHUFB   Z15, Z1, Z1
	VPXORQ    Z0, Z1, Z1
	MULFIRST(Z1, Z19)
	FOLD
	ADDQ      $64, SI
	SUBQ      $64, DX
	JMP       loop64

loop16:
	// One block at a time, by H alone: lane 3 of the last powers.
	VMOVDQU 496(DI), X13

loop16next:
	CMPQ       DX, $16
	JB         done
	VMOVDQU    (SI), X1
	VPSHUFB    X15, X1, X1
	VPXOR      X0, X1, X1
	VPCLMULQDQ $0x00, X13, X1, X5
	VPCLMULQDQ $0x11, X13, X1, X6
	VPCLMULQDQ $0x01, X13, X1, X7
	VPCLMULQDQ $0x10, X13, X1, X8
	VPXOR      X8, X7, X7
	REDUCE
	ADDQ       $16, SI
	SUBQ       $16, DX
	JMP        loop16next

done:
	VMOVDQU X0, (CX)
	VZEROUPPER
	RET
