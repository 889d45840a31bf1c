package udpfab

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestGatheredFaultDropsOneMessage: a gathered piece whose memory is gone
// (EFAULT) costs its own message only; the batch's others are sent.
func TestGatheredFaultDropsOneMessage(t *testing.T) {
	tx, err := Listen(lo, nil)
	require.NoError(t, err)
	defer tx.Close()
	rx, err := Listen(lo, nil)
	require.NoError(t, err)
	defer rx.Close()
	m, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	require.NoError(t, err)
	gone := unsafe.Slice(&m[0], 4096)
	require.NoError(t, unix.Munmap(m))
	dropped, err := tx.WriteBatch([]Message{
		{Iov: [][]byte{[]byte("head "), []byte("first")}, Addr: rx.LocalAddr()},
		{Iov: [][]byte{[]byte("head "), gone}, Addr: rx.LocalAddr()},
		{Iov: [][]byte{[]byte("head "), []byte("third")}, Addr: rx.LocalAddr()},
	})
	require.NoError(t, err)
	require.Equal(t, 1, dropped)
	in := make([]Message, BatchSize)
	for i := range in {
		in[i].Buf = make([]byte, MaxTrain)
	}
	var got []string
	for len(got) < 2 {
		n, err := rx.ReadBatch(in)
		require.NoError(t, err)
		for i := range n {
			got = append(got, string(in[i].Buf[:in[i].N]))
		}
	}
	require.Equal(t, []string{"head first", "head third"}, got)
}
