package main

import (
	"crypto/sha256"
	"encoding"
	"encoding/binary"
	"encoding/hex"
	"hash"
)

// The region hashes are the file's own SHA-256 cut at region boundaries:
// region i's entry is the SHA-256 chaining value after the file's first
// i+1 regions (the hash's internal state, before its final padding), and
// the last region's is the file's SHA-256 itself. Regions are whole
// 64-byte blocks of the hash, so each region is checked on its own, from
// the chaining value before it to the one after; and a file whose
// regions all check out has the SHA-256 the last entry states, which the
// receiver holds to the offer's. Each end so hashes the file once: the
// sender to make the list, the receiver region by region as they land,
// instead of a SHA-256 of each region beside one of the whole file.

// hashChain names this scheme in the offer and the answer: ends that do
// not both speak it cannot check each other's regions.
const hashChain = "sha256-chain"

// hashBlock is SHA-256's block: regions are multiples of it.
const hashBlock = 64

// hashFile returns the SHA-256 of b and its region hashes, back to back.
func hashFile(b []byte, region int64) (string, []byte) {
	n := regions(int64(len(b)), region)
	hashes := make([]byte, 0, n*hashLen)
	d := sha256.New()
	for i := range n {
		lo := int64(i) * region
		d.Write(b[lo:min(lo+region, int64(len(b)))])
		if i < n-1 {
			hashes = append(hashes, chainValue(d)...)
		}
	}
	sum := d.Sum(nil)
	if n > 0 {
		hashes = append(hashes, sum...)
	}
	return hex.EncodeToString(sum), hashes
}

// regionOK says whether span, region i of n (of region bytes each but
// the last), leads from the chaining value before it in hashes to its own.
func regionOK(span []byte, i, n int, region int64, hashes []byte) bool {
	d := regionHash(i, region, hashes)
	d.Write(span)
	return regionEnds(d, i, n, hashes)
}

// regionHash is a SHA-256 that hashed the regions before region i, as
// hashes say: it goes on with region i's bytes.
func regionHash(i int, region int64, hashes []byte) hash.Hash {
	d := sha256.New()
	if i > 0 {
		st := hashState(hashes[(i-1)*hashLen:i*hashLen], uint64(i)*uint64(region))
		if err := d.(encoding.BinaryUnmarshaler).UnmarshalBinary(st); err != nil {
			panic("haul: crypto/sha256 refuses its own state's form: " + err.Error())
		}
	}
	return d
}

// regionEnds says whether d, which hashed region i of n from
// regionHash, ends at the region's own entry in hashes.
func regionEnds(d hash.Hash, i, n int, hashes []byte) bool {
	want := hashes[i*hashLen : (i+1)*hashLen]
	if i == n-1 {
		return string(d.Sum(nil)) == string(want)
	}
	return string(chainValue(d)) == string(want)
}

// chainValue is d's chaining value: its state after whole blocks.
func chainValue(d any) []byte {
	st, err := d.(encoding.BinaryMarshaler).MarshalBinary()
	if err != nil || len(st) != hashStateLen {
		panic("haul: crypto/sha256's state has an unknown form")
	}
	return st[len(hashMagic) : len(hashMagic)+hashLen]
}

// crypto/sha256's marshalled state: a magic, the chaining value, the
// block buffer, the length hashed.
const (
	hashMagic    = "sha\x03"
	hashStateLen = len(hashMagic) + hashLen + hashBlock + 8
)

// hashState is the marshalled state of a SHA-256 that hashed length
// bytes (whole blocks) to the chaining value cv.
func hashState(cv []byte, length uint64) []byte {
	b := make([]byte, 0, hashStateLen)
	b = append(b, hashMagic...)
	b = append(b, cv...)
	b = append(b, make([]byte, hashBlock)...)
	return binary.BigEndian.AppendUint64(b, length)
}
