package main

import (
	"crypto/sha256"
	"encoding"
	"encoding/binary"
	"encoding/hex"
	"hash"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/zeebo/blake3"
)

// A transfer checks its bytes end to end with a file digest and a hash per
// region, in one of two schemes the sender chooses (--digest) and names in
// the offer. Either way each end hashes the file once: the sender to make
// the list, the receiver region by region as they land; a region that does
// not match its hash is fetched again, and a file whose regions all match
// has the digest the offer states.
//
// blake3 (the default): each region's BLAKE3-256 on its own, and the file's
// digest the BLAKE3-256 of a header (the scheme, the size, the region size)
// and the region hashes: a two-level tree, which `haul digest` computes for
// a file at rest. BLAKE3 is a cryptographic hash like SHA-256, so a
// receiver without --key-file (whose packets carry only a checksum) still
// holds the bytes to what the sender hashed; it hashes more than twice as
// fast as SHA-256 with SHA-NI here (BenchmarkRegionHash), and the regions
// hash in parallel.
//
// sha256: the file's own SHA-256, which sha256sum prints, cut at region
// boundaries: region i's entry is the chaining value after the file's first
// i+1 regions (the hash's state before its final padding), the last
// region's is the file's SHA-256. Regions are whole 64-byte blocks of the
// hash, so each is checked on its own, from the chaining value before it to
// the one after.

// hashing is one scheme of region hashes.
type hashing interface {
	// name names the scheme in the offer, the answer and the state file.
	name() string
	// label names the digest in reports: "blake3" or "sha256".
	label() string
	// file returns b's digest (hex) and its region hashes, back to back.
	file(b []byte, region int64) (string, []byte)
	// start returns a hash to feed region i's bytes, for ends.
	start(i int, region int64, hashes []byte) hash.Hash
	// ends says whether d, fed region i of n from start, matches the
	// region's entry in hashes.
	ends(d hash.Hash, i, n int, hashes []byte) bool
	// digest is the digest of a file of size bytes whose region hashes
	// are hashes.
	digest(size, region int64, hashes []byte) string
}

const (
	hashBlake3 = "blake3-list"
	hashChain  = "sha256-chain"
)

// hashingNamed returns the scheme of that name, as the offer names it.
func hashingNamed(name string) (hashing, bool) {
	for _, h := range hashings {
		if h.name() == name {
			return h, true
		}
	}
	return nil, false
}

// hashingLabeled returns the scheme of that label, as --digest names it.
func hashingLabeled(label string) (hashing, bool) {
	for _, h := range hashings {
		if h.label() == label {
			return h, true
		}
	}
	return nil, false
}

var hashings = []hashing{blake3List{}, sha256Chain{}}

func knownHashing(name string) bool { _, ok := hashingNamed(name); return ok }

// hashBlock is SHA-256's block: regions are multiples of it.
const hashBlock = 64

// regionOK says whether span, region i of n (of region bytes each but the
// last), matches its entry in hashes.
func regionOK(h hashing, span []byte, i, n int, region int64, hashes []byte) bool {
	d := h.start(i, region, hashes)
	d.Write(span)
	return h.ends(d, i, n, hashes)
}

type blake3List struct{}

func (blake3List) name() string  { return hashBlake3 }
func (blake3List) label() string { return "blake3" }

func (l blake3List) file(b []byte, region int64) (string, []byte) {
	n := regions(int64(len(b)), region)
	hashes := make([]byte, n*hashLen)
	// The regions are independent: as many at once as there are cores,
	// which shortens the wait before the transfer, not the CPU it costs.
	var wg sync.WaitGroup
	var next atomic.Int64
	for range min(runtime.GOMAXPROCS(0), n) {
		wg.Go(func() {
			for {
				j := int(next.Add(1) - 1)
				if j >= n {
					return
				}
				lo := int64(j) * region
				sum := blake3.Sum256(b[lo:min(lo+region, int64(len(b)))])
				copy(hashes[j*hashLen:], sum[:])
			}
		})
	}
	wg.Wait()
	return l.digest(int64(len(b)), region, hashes), hashes
}

func (blake3List) start(int, int64, []byte) hash.Hash { return blake3.New() }

func (blake3List) ends(d hash.Hash, i, _ int, hashes []byte) bool {
	return string(d.Sum(nil)) == string(hashes[i*hashLen:(i+1)*hashLen])
}

func (blake3List) digest(size, region int64, hashes []byte) string {
	d := blake3.New()
	var hdr [len(hashBlake3) + 16]byte
	copy(hdr[:], hashBlake3)
	binary.LittleEndian.PutUint64(hdr[len(hashBlake3):], uint64(size))
	binary.LittleEndian.PutUint64(hdr[len(hashBlake3)+8:], uint64(region))
	d.Write(hdr[:])
	d.Write(hashes)
	return hex.EncodeToString(d.Sum(nil))
}

type sha256Chain struct{}

func (sha256Chain) name() string  { return hashChain }
func (sha256Chain) label() string { return "sha256" }

func (sha256Chain) file(b []byte, region int64) (string, []byte) {
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

// start is a SHA-256 that hashed the regions before region i, as hashes
// say: it goes on with region i's bytes.
func (sha256Chain) start(i int, region int64, hashes []byte) hash.Hash {
	d := sha256.New()
	if i > 0 {
		st := hashState(hashes[(i-1)*hashLen:i*hashLen], uint64(i)*uint64(region))
		if err := d.(encoding.BinaryUnmarshaler).UnmarshalBinary(st); err != nil {
			panic("haul: crypto/sha256 refuses its own state's form: " + err.Error())
		}
	}
	return d
}

func (sha256Chain) ends(d hash.Hash, i, n int, hashes []byte) bool {
	want := hashes[i*hashLen : (i+1)*hashLen]
	if i == n-1 {
		return string(d.Sum(nil)) == string(want)
	}
	return string(chainValue(d)) == string(want)
}

// digest is the last entry: the chain ends at the file's SHA-256.
func (sha256Chain) digest(_, _ int64, hashes []byte) string {
	if len(hashes) < hashLen {
		return sha256Hex(nil)
	}
	return hex.EncodeToString(hashes[len(hashes)-hashLen:])
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
