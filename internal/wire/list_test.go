package wire

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestListEntries(t *testing.T) {
	type entry struct {
		va   uint64
		data []byte
	}
	for _, tc := range []struct {
		name    string
		entries []entry
	}{
		{"none", nil},
		{"one", []entry{{0x1000, []byte("deadbeef")}}},
		{"empty run", []entry{{7, nil}, {8, []byte{1}}}},
		{"many", []entry{{1, []byte{1, 2}}, {1 << 40, bytes.Repeat([]byte{9}, 300)}, {0, []byte{3}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b []byte
			for _, e := range tc.entries {
				b = AppendListEntry(b, e.va, e.data)
			}
			var got []entry
			require.NoError(t, ListEntries(b, func(va uint64, d []byte) bool {
				got = append(got, entry{va, append([]byte(nil), d...)})
				return true
			}))
			require.Len(t, got, len(tc.entries))
			for i := range got {
				require.Equal(t, tc.entries[i].va, got[i].va)
				require.Equal(t, len(tc.entries[i].data), len(got[i].data))
				if len(got[i].data) > 0 {
					require.Equal(t, tc.entries[i].data, got[i].data)
				}
			}
		})
	}
	// A truncated list is refused whole: no entry is handed out.
	b := AppendListEntry(AppendListEntry(nil, 1, []byte{1}), 2, []byte{2, 3})
	for cut := 1; cut < len(b); cut++ {
		if cut == ListEntryLen+1 {
			continue // the first entry alone is a whole list
		}
		calls := 0
		err := ListEntries(b[:cut], func(uint64, []byte) bool { calls++; return true })
		require.ErrorIs(t, err, ErrList, "cut at %d", cut)
		require.Zero(t, calls)
	}
}

func FuzzListEntries(f *testing.F) {
	f.Add(AppendListEntry(AppendListEntry(nil, 1, []byte{1}), 2, []byte{2, 3}))
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		var total int
		err := ListEntries(b, func(va uint64, d []byte) bool {
			total += ListEntryLen + len(d)
			return true
		})
		if err == nil && total != len(b) {
			t.Fatalf("entries cover %d of %d bytes", total, len(b))
		}
		if err != nil && total != 0 {
			t.Fatal("entries handed out from a malformed list")
		}
	})
}
