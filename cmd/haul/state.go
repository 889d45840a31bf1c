package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
)

// The state file (PATH.haul) is what the receiver keeps beside the partial
// output (PATH.haul.part) so that an interrupted transfer resumes: the
// offer it belongs to, the sender's per-region hashes and the regions in
// place so far.
//
// It is written in place into space reserved when it is created, so that
// saving progress cannot fail for want of space once the transfer has
// started: two slots of equal size, written in turn, each a JSON object, a
// newline, the SHA-256 of the JSON in hex, a newline and spaces up to the
// slot's end. A torn write spoils one slot; the other keeps the state
// before it. The file is untrusted input all the same: decodeState checks
// every field.

const (
	stateVersion = 2
	// maxRegions bounds the regions of a transfer: the receiver's answer
	// (the bitmap of regions it has, base64 in JSON) must fit the CM's
	// 1024 bytes of private data.
	maxRegions = 4096
	minRegion  = 4096
	maxRegion  = 4 << 30 // the reliability layer's message limit is near
	maxSlot    = 1 << 20 // far above what maxRegions needs (about 180 KiB)
	hashLen    = sha256.Size
)

// errState marks a state file that cannot be used.
var errState = errors.New("invalid state")

type state struct {
	Version  int    `json:"version"`
	Seq      uint64 `json:"seq"` // the newer slot has the higher
	Size     int64  `json:"size"`
	SHA256   string `json:"sha256"`
	Region   int64  `json:"region"`
	Manifest string `json:"manifest"`         // SHA-256 of Hashes, as the offer says
	Hashes   []byte `json:"hashes,omitempty"` // each region's SHA-256, once the sender sent them
	Have     []byte `json:"have"`             // bitmap of regions in place and verified
}

func statePath(out string) string { return out + ".haul" }
func partPath(out string) string  { return out + ".haul.part" }

func regions(size, region int64) int { return int((size + region - 1) / region) }

func hasRegion(have []byte, i int) bool { return i/8 < len(have) && have[i/8]&(1<<(i%8)) != 0 }

func setRegion(have []byte, i int)   { have[i/8] |= 1 << (i % 8) }
func clearRegion(have []byte, i int) { have[i/8] &^= 1 << (i % 8) }

func countRegions(have []byte, n int) int {
	k := 0
	for i := range n {
		if hasRegion(have, i) {
			k++
		}
	}
	return k
}

func isHexHash(s string) bool {
	if len(s) != 2*hashLen {
		return false
	}
	for _, c := range []byte(s) {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// checkLayout validates a transfer's size and region size, shared by
// offers and state files.
func checkLayout(size, region int64) error {
	if size < 0 {
		return fmt.Errorf("size %d", size)
	}
	if region < minRegion || region > maxRegion {
		return fmt.Errorf("region %d, want %d..%d bytes", region, minRegion, int64(maxRegion))
	}
	if n := (size-1)/region + 1; size > 0 && n > maxRegions {
		return fmt.Errorf("%d regions of %d bytes, at most %d", n, region, maxRegions)
	}
	return nil
}

// validate checks every field against the others.
func (st *state) validate() error {
	if st.Version != stateVersion {
		return fmt.Errorf("%w: version %d, want %d", errState, st.Version, stateVersion)
	}
	if err := checkLayout(st.Size, st.Region); err != nil {
		return fmt.Errorf("%w: %v", errState, err)
	}
	if !isHexHash(st.SHA256) || !isHexHash(st.Manifest) {
		return fmt.Errorf("%w: malformed sha256 or manifest", errState)
	}
	n := regions(st.Size, st.Region)
	if len(st.Have) != (n+7)/8 {
		return fmt.Errorf("%w: bitmap of %d bytes for %d regions", errState, len(st.Have), n)
	}
	if n%8 != 0 && st.Have[n/8]>>(n%8) != 0 {
		return fmt.Errorf("%w: bitmap marks regions past the end", errState)
	}
	if len(st.Hashes) == 0 {
		if countRegions(st.Have, n) != 0 {
			return fmt.Errorf("%w: regions marked in place but no region hashes", errState)
		}
		return nil
	}
	if len(st.Hashes) != n*hashLen {
		return fmt.Errorf("%w: %d bytes of region hashes for %d regions", errState, len(st.Hashes), n)
	}
	if sha256Hex(st.Hashes) != st.Manifest {
		return fmt.Errorf("%w: the region hashes do not match their manifest", errState)
	}
	return nil
}

// slotSize is the slot size of a transfer of n regions: room for the
// largest state it can have, in whole 512-byte blocks.
func slotSize(n int) int {
	big := state{Version: stateVersion, Seq: math.MaxUint64, Size: math.MaxInt64, Region: math.MaxInt64,
		SHA256: strings.Repeat("0", 2*hashLen), Manifest: strings.Repeat("0", 2*hashLen),
		Hashes: make([]byte, n*hashLen), Have: make([]byte, (n+7)/8)}
	need := len(mustJSON(big)) + 2*hashLen + 2
	return (need + 511) / 512 * 512
}

// encodeSlot renders st as one slot of size bytes.
func encodeSlot(st *state, size int) []byte {
	j := mustJSON(st)
	b := make([]byte, 0, size)
	b = append(b, j...)
	b = append(b, '\n')
	b = append(b, sha256Hex(j)...)
	b = append(b, '\n')
	if len(b) > size {
		panic(fmt.Sprintf("haul: state of %d bytes in a slot of %d", len(b), size))
	}
	return append(b, bytes.Repeat([]byte{' '}, size-len(b))...)
}

// decodeSlot parses and validates one slot.
func decodeSlot(b []byte) (*state, error) {
	b = bytes.TrimRight(b, " ")
	if len(b) == 0 || b[len(b)-1] != '\n' {
		return nil, fmt.Errorf("%w: slot empty or cut short", errState)
	}
	b = b[:len(b)-1]
	i := bytes.LastIndexByte(b, '\n')
	if i < 0 {
		return nil, fmt.Errorf("%w: slot has no checksum", errState)
	}
	j, sum := b[:i], string(b[i+1:])
	if sha256Hex(j) != sum {
		return nil, fmt.Errorf("%w: slot checksum mismatch", errState)
	}
	var st state
	d := json.NewDecoder(bytes.NewReader(j))
	d.DisallowUnknownFields()
	if err := d.Decode(&st); err != nil {
		return nil, fmt.Errorf("%w: %v", errState, err)
	}
	if d.More() {
		return nil, fmt.Errorf("%w: data after the state", errState)
	}
	if len(st.Hashes) == 0 {
		st.Hashes = nil // "" and absent are one: not received yet
	}
	if err := st.validate(); err != nil {
		return nil, err
	}
	return &st, nil
}

// decodeState reads a state file's contents: the newer of its valid
// slots, and the slot size.
func decodeState(b []byte) (*state, int, error) {
	if len(b) == 0 || len(b)%1024 != 0 || len(b) > 2*maxSlot {
		return nil, 0, fmt.Errorf("%w: %d bytes, want two slots of whole 512-byte blocks", errState, len(b))
	}
	slot := len(b) / 2
	var best *state
	var errs []error
	for i := range 2 {
		st, err := decodeSlot(b[i*slot : (i+1)*slot])
		if err != nil {
			errs = append(errs, fmt.Errorf("slot %d: %w", i, err))
			continue
		}
		if best == nil || st.Seq > best.Seq {
			best = st
		}
	}
	if best == nil {
		return nil, 0, errors.Join(errs...)
	}
	if slot != slotSize(regions(best.Size, best.Region)) {
		return nil, 0, fmt.Errorf("%w: slots of %d bytes, want %d", errState, slot, slotSize(regions(best.Size, best.Region)))
	}
	return best, slot, nil
}

type writeAt func(b []byte, off int64) (int, error)

// stateFile is an open state file.
type stateFile struct {
	f       *os.File
	slot    int
	st      state
	writeAt writeAt // f.WriteAt, but for tests
}

// createState writes a new state file for st, both slots (the second
// blank), so that its blocks are allocated before the transfer starts.
func createState(path string, st state) (*stateFile, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, err
	}
	st.Seq = 0
	s := &stateFile{f: f, slot: slotSize(regions(st.Size, st.Region)), st: st, writeAt: f.WriteAt}
	blank := bytes.Repeat([]byte{' '}, s.slot)
	if _, err := f.WriteAt(blank, 0); err != nil {
		f.Close()
		return nil, err
	}
	if err := s.save(); err != nil {
		f.Close()
		return nil, err
	}
	return s, nil
}

// openState opens an existing state file that decoded as st.
func openState(path string, st *state, slot int) (*stateFile, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	return &stateFile{f: f, slot: slot, st: *st, writeAt: f.WriteAt}, nil
}

// save writes the state into the older slot. After a failed write the
// sequence number stays, so the next try overwrites the same slot and the
// newer one stays intact.
func (s *stateFile) save() error {
	next := s.st
	next.Seq++
	b := encodeSlot(&next, s.slot)
	if _, err := s.writeAt(b, int64(next.Seq%2)*int64(s.slot)); err != nil {
		return fmt.Errorf("save progress to %s: %w", s.f.Name(), err)
	}
	s.st.Seq = next.Seq
	return nil
}

func (s *stateFile) close() error { return s.f.Close() }
