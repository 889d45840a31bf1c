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

// ONEBLOCK folds the block at SI into X0, by H in X13.
#define ONEBLOCK \
	VMOVDQU    (SI), X1          \
	VPSHUFB    X15, X1, X1       \
	VPXOR      X0, X1, X1        \
	VPCLMULQDQ $0x00, X13, X1, X5 \
	VPCLMULQDQ $0x11, X13, X1, X6 \
	VPCLMULQDQ $0x01, X13, X1, X7 \
	VPCLMULQDQ $0x10, X13, X1, X8 \
	VPXOR      X8, X7, X7        \
	REDUCE

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
	ONEBLOCK
	ADDQ       $16, SI
	SUBQ       $16, DX
	JMP        loop16next

done:
	VMOVDQU X0, (CX)
	VZEROUPPER
	RET

// The same on 256-bit registers, for CPUs with VEX-encoded VPCLMULQDQ
// but no AVX-512: two blocks a register, sixteen registers in all, so the
// key powers are loaded with the data instead of kept (from L1, beside
// the multiplies' cost). Y5, Y6, Y7 hold the sums; Y1 a data pair, Y2 its
// powers, Y8 and Y9 products.

// MUL2FIRST sets Y5, Y6, Y7 to the products of Y1 and the powers at P.
#define MUL2FIRST(P) \
	VMOVDQU    P, Y2          \
	VPCLMULQDQ $0x00, Y2, Y1, Y5 \
	VPCLMULQDQ $0x11, Y2, Y1, Y6 \
	VPCLMULQDQ $0x01, Y2, Y1, Y7 \
	VPCLMULQDQ $0x10, Y2, Y1, Y8 \
	VPXOR      Y8, Y7, Y7

// MUL2ADD adds the products of the blocks at D and the powers at P.
#define MUL2ADD(D, P) \
	VMOVDQU    D, Y1          \
	VPSHUFB    Y15, Y1, Y1    \
	VMOVDQU    P, Y2          \
	VPCLMULQDQ $0x00, Y2, Y1, Y8 \
	VPCLMULQDQ $0x11, Y2, Y1, Y9 \
	VPXOR      Y8, Y5, Y5     \
	VPXOR      Y9, Y6, Y6     \
	VPCLMULQDQ $0x01, Y2, Y1, Y8 \
	VPCLMULQDQ $0x10, Y2, Y1, Y9 \
	VPXOR      Y8, Y7, Y7     \
	VPXOR      Y9, Y7, Y7

// FIRST2 loads the pair at D, adds the state to its first block and
// multiplies by the powers at P.
#define FIRST2(D, P) \
	VMOVDQU D, Y1       \
	VPSHUFB Y15, Y1, Y1 \
	VPXOR   Y0, Y1, Y1  \
	MUL2FIRST(P)

// FOLD2 sums the two lanes of Y5, Y6, Y7 and reduces into X0.
#define FOLD2 \
	VEXTRACTI128 $1, Y5, X8 \
	VPXOR        X8, X5, X5 \
	VEXTRACTI128 $1, Y6, X9 \
	VPXOR        X9, X6, X6 \
	VEXTRACTI128 $1, Y7, X10 \
	VPXOR        X10, X7, X7 \
	REDUCE

// func blocksAVX2(powers *[512]byte, x *[16]byte, data *byte, n int)
TEXT ·blocksAVX2(SB), NOSPLIT, $0-32
	MOVQ powers+0(FP), DI
	MOVQ x+8(FP), CX
	MOVQ data+16(FP), SI
	MOVQ n+24(FP), DX

	VBROADCASTI128 bswapMask<>(SB), Y15
	VMOVDQU        polyConst<>(SB), X14
	VMOVDQU        (CX), X0 // a VEX load: the upper lane of Y0 is zero

avx2loop512:
	// 32 blocks a round, by H^32 ... H^1: one reduction.
	CMPQ DX, $512
	JB   avx2loop256
	FIRST2((SI), (DI))
	MUL2ADD(32(SI), 32(DI))
	MUL2ADD(64(SI), 64(DI))
	MUL2ADD(96(SI), 96(DI))
	MUL2ADD(128(SI), 128(DI))
	MUL2ADD(160(SI), 160(DI))
	MUL2ADD(192(SI), 192(DI))
	MUL2ADD(224(SI), 224(DI))
	MUL2ADD(256(SI), 256(DI))
	MUL2ADD(288(SI), 288(DI))
	MUL2ADD(320(SI), 320(DI))
	MUL2ADD(352(SI), 352(DI))
	MUL2ADD(384(SI), 384(DI))
	MUL2ADD(416(SI), 416(DI))
	MUL2ADD(448(SI), 448(DI))
	MUL2ADD(480(SI), 480(DI))
	FOLD2
	ADDQ $512, SI
	SUBQ $512, DX
	JMP  avx2loop512

avx2loop256:
	// 16 blocks, by H^16 ... H^1.
	CMPQ DX, $256
	JB   avx2loop32
	FIRST2((SI), 256(DI))
	MUL2ADD(32(SI), 288(DI))
	MUL2ADD(64(SI), 320(DI))
	MUL2ADD(96(SI), 352(DI))
	MUL2ADD(128(SI), 384(DI))
	MUL2ADD(160(SI), 416(DI))
	MUL2ADD(192(SI), 448(DI))
	MUL2ADD(224(SI), 480(DI))
	FOLD2
	ADDQ $256, SI
	SUBQ $256, DX
	JMP  avx2loop256

avx2loop32:
	// 2 blocks, by H^2 and H.
	CMPQ DX, $32
	JB   avx2loop16
	FIRST2((SI), 480(DI))
	FOLD2
	ADDQ $32, SI
	SUBQ $32, DX
	JMP  avx2loop32

avx2loop16:
	VMOVDQU 496(DI), X13

avx2loop16next:
	CMPQ       DX, $16
	JB         avx2done
	ONEBLOCK
	ADDQ       $16, SI
	SUBQ       $16, DX
	JMP        avx2loop16next

avx2done:
	VMOVDQU X0, (CX)
	VZEROUPPER
	RET

// func cpuid7ECX() uint32
TEXT ·cpuid7ECX(SB), NOSPLIT, $0-4
	MOVL $7, AX
	XORL CX, CX
	CPUID
	MOVL CX, ret+0(FP)
	RET
