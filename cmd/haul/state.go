package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"os"
)

// The state file (PATH.haul) is what the receiver keeps beside the partial
// output (PATH.haul.part) so that an interrupted transfer resumes: the
// offer it belongs to, the regions in place so far, and the sender's
// per-region hashes that each region was checked against.
//
// It is written in place into space allocated when it is created, so that
// saving progress cannot fail for want of space once the transfer has
// started. Two slots of slotSize bytes come first, written in turn, each a
// JSON object, a newline, the SHA-256 of the JSON in hex, a newline and
// spaces to the slot's end: a torn write spoils one slot, and the other
// keeps the state before it. The region hashes follow, 32 bytes each,
// written once (before the slot that says they are there) and checked
// against the manifest. The file is untrusted input all the same:
// decodeState checks every field.

const (
	stateVersion = 3
	// maxRegions bounds the regions of a transfer: the receiver's answer
	// (the bitmap of regions it has, base64 in JSON) must fit the CM's
	// 1024 bytes of private data.
	maxRegions = 4096
	minRegion  = 4096
	maxRegion  = 4 << 30 // the reliability layer's message limit is near
	hashLen    = sha256.Size
	// slotSize holds the largest state: a bitmap of maxRegions bits is
	// 684 bytes in base64, the rest some 300.
	slotSize = 2048
	hashesAt = 2 * slotSize
)

// errState marks a state file that cannot be used.
var errState = errors.New("invalid state")

type state struct {
	Version  int    `json:"version"`
	Seq      uint64 `json:"seq"` // the newer slot has the higher
	Size     int64  `json:"size"`
	Digest   string `json:"sha256"`  // the offer's Digest, under its key
	Hashing  string `json:"hashing"` // the offer's: how Digest and Hashes are made
	Region   int64  `json:"region"`
	Manifest string `json:"manifest"` // SHA-256 of Hashes, as the offer says
	Hashed   bool   `json:"hashed"`   // the region hashes are in the file
	Have     []byte `json:"have"`     // bitmap of regions in place and verified
	Hashes   []byte `json:"-"`        // the region hashes (digest.go), once Hashed
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
	if region < minRegion || region > maxRegion || region%hashBlock != 0 {
		return fmt.Errorf("region %d, want %d..%d bytes, a multiple of %d", region, minRegion, int64(maxRegion), hashBlock)
	}
	if n := (size-1)/region + 1; size > 0 && n > maxRegions {
		return fmt.Errorf("%d regions of %d bytes, at most %d", n, region, maxRegions)
	}
	return nil
}

// validateSlot checks the fields a slot holds against each other.
func (st *state) validateSlot() error {
	if st.Version == 2 && st.Hashing == "" {
		// Before the digest became a choice: a SHA-256 chain. A run of
		// this release resumes it (and saves it as version 3).
		st.Version, st.Hashing = stateVersion, hashChain
	}
	if st.Version != stateVersion {
		return fmt.Errorf("%w: version %d, want %d", errState, st.Version, stateVersion)
	}
	if err := checkLayout(st.Size, st.Region); err != nil {
		return fmt.Errorf("%w: %v", errState, err)
	}
	if !isHexHash(st.Digest) || !isHexHash(st.Manifest) {
		return fmt.Errorf("%w: malformed digest or manifest", errState)
	}
	if _, ok := hashingNamed(st.Hashing); !ok {
		return fmt.Errorf("%w: region hashes of an unknown scheme %q", errState, st.Hashing)
	}
	n := regions(st.Size, st.Region)
	if len(st.Have) != (n+7)/8 {
		return fmt.Errorf("%w: bitmap of %d bytes for %d regions", errState, len(st.Have), n)
	}
	if n%8 != 0 && st.Have[n/8]>>(n%8) != 0 {
		return fmt.Errorf("%w: bitmap marks regions past the end", errState)
	}
	if !st.Hashed && countRegions(st.Have, n) != 0 {
		return fmt.Errorf("%w: regions marked in place but no region hashes", errState)
	}
	return nil
}

// encodeSlot renders st as one slot.
func encodeSlot(st *state) []byte {
	j := mustJSON(st)
	b := make([]byte, 0, slotSize)
	b = append(b, j...)
	b = append(b, '\n')
	b = append(b, sha256Hex(j)...)
	b = append(b, '\n')
	if len(b) > slotSize {
		panic(fmt.Sprintf("haul: state of %d bytes in a slot of %d", len(b), slotSize))
	}
	return append(b, bytes.Repeat([]byte{' '}, slotSize-len(b))...)
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
	if err := st.validateSlot(); err != nil {
		return nil, err
	}
	return &st, nil
}

// encodeState renders a whole state file: st in the slot its sequence
// number picks, the other blank, and the region hashes (zeros until
// they are in).
func encodeState(st *state) []byte {
	b := bytes.Repeat([]byte{' '}, hashesAt)
	copy(b[int(st.Seq%2)*slotSize:], encodeSlot(st))
	h := make([]byte, regions(st.Size, st.Region)*hashLen)
	if st.Hashed {
		copy(h, st.Hashes)
	}
	return append(b, h...)
}

// decodeState reads a state file's contents: the newer of its valid
// slots, with the region hashes.
func decodeState(b []byte) (*state, error) {
	if len(b) < hashesAt {
		return nil, fmt.Errorf("%w: %d bytes, shorter than its two slots", errState, len(b))
	}
	var st *state
	var errs []error
	for i := range 2 {
		s, err := decodeSlot(b[i*slotSize : (i+1)*slotSize])
		if err == nil && s.Seq%2 != uint64(i) {
			// save writes seq n into slot n%2: the other is the older.
			err = fmt.Errorf("%w: sequence number %d in slot %d", errState, s.Seq, i)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("slot %d: %w", i, err))
			continue
		}
		if st == nil || s.Seq > st.Seq {
			st = s
		}
	}
	if st == nil {
		return nil, errors.Join(errs...)
	}
	n := regions(st.Size, st.Region)
	if len(b) != hashesAt+n*hashLen {
		return nil, fmt.Errorf("%w: %d bytes, want %d for %d regions", errState, len(b), hashesAt+n*hashLen, n)
	}
	if st.Hashed {
		st.Hashes = bytes.Clone(b[hashesAt:])
		if sha256Hex(st.Hashes) != st.Manifest {
			return nil, fmt.Errorf("%w: the region hashes do not match their manifest", errState)
		}
		if h, _ := hashingNamed(st.Hashing); h.digest(st.Size, st.Region, st.Hashes) != st.Digest {
			return nil, fmt.Errorf("%w: the region hashes do not make the digest", errState)
		}
	}
	return st, nil
}

type writeAt func(b []byte, off int64) (int, error)

// stateFile is an open state file.
type stateFile struct {
	f       *os.File
	st      state
	writeAt writeAt // f.WriteAt, but for tests
}

// createState writes a new state file for st, whole (the hashes' place
// too), so that its blocks are allocated before the transfer starts.
func createState(path string, st state) (*stateFile, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, err
	}
	st.Seq = 1
	if _, err := f.WriteAt(encodeState(&st), 0); err != nil {
		f.Close()
		return nil, err
	}
	return &stateFile{f: f, st: st, writeAt: f.WriteAt}, nil
}

// openState opens an existing state file that decoded as st.
func openState(path string, st *state) (*stateFile, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	return &stateFile{f: f, st: *st, writeAt: f.WriteAt}, nil
}

// save writes the state into the older slot. After a failed write the
// sequence number stays, so the next try overwrites the same slot and the
// newer one stays intact.
func (s *stateFile) save() error {
	next := s.st
	next.Seq++
	if _, err := s.writeAt(encodeSlot(&next), int64(next.Seq%2)*slotSize); err != nil {
		return fmt.Errorf("save progress to %s: %w", s.f.Name(), err)
	}
	s.st.Seq = next.Seq
	return nil
}

// saveHashes writes the region hashes in their place, then a slot that
// says they are there.
func (s *stateFile) saveHashes(h []byte) error {
	if _, err := s.writeAt(h, hashesAt); err != nil {
		return fmt.Errorf("save the region hashes to %s: %w", s.f.Name(), err)
	}
	s.st.Hashes, s.st.Hashed = bytes.Clone(h), true
	if err := s.save(); err != nil {
		s.st.Hashes, s.st.Hashed = nil, false // as on disk
		return err
	}
	return nil
}

func (s *stateFile) close() error { return s.f.Close() }
