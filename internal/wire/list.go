package wire

import (
	"encoding/binary"
	"errors"
)

// ListEntryLen is the bytes a WRITE_LIST entry takes besides its data.
const ListEntryLen = 8 + 2

// ListMaxRun is the longest run one entry carries.
const ListMaxRun = 1<<16 - 1

// ErrList reports a WRITE_LIST payload that does not split into entries.
var ErrList = errors.New("wire: malformed write list")

// AppendListEntry appends an entry writing data at virtual address va
// (len(data) <= ListMaxRun) to a WRITE_LIST payload.
func AppendListEntry(b []byte, va uint64, data []byte) []byte {
	b = binary.BigEndian.AppendUint64(b, va)
	b = binary.BigEndian.AppendUint16(b, uint16(len(data)))
	return append(b, data...)
}

// ListEntries calls f for each entry of a WRITE_LIST payload, in order,
// until f returns false; data aliases payload. It returns ErrList, having
// called f for none, if the payload does not split into whole entries.
func ListEntries(payload []byte, f func(va uint64, data []byte) bool) error {
	for b := payload; len(b) > 0; {
		if len(b) < ListEntryLen {
			return ErrList
		}
		n := int(binary.BigEndian.Uint16(b[8:]))
		if len(b) < ListEntryLen+n {
			return ErrList
		}
		b = b[ListEntryLen+n:]
	}
	for b := payload; len(b) > 0; {
		va, n := binary.BigEndian.Uint64(b), int(binary.BigEndian.Uint16(b[8:]))
		if !f(va, b[ListEntryLen:ListEntryLen+n]) {
			return nil
		}
		b = b[ListEntryLen+n:]
	}
	return nil
}
