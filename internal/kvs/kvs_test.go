package kvs

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestServerClients(t *testing.T) {
	srv, err := Listen("127.0.0.1:0", 3)
	require.NoError(t, err)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	got := make([][]string, 3)
	for r := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := Dial(ctx, srv.Addr())
			require.NoError(t, err)
			defer c.Close()
			require.NoError(t, c.Put(ctx, fmt.Sprintf("addr/%d", r), fmt.Sprintf("host:%d", 100+r)))
			require.NoError(t, c.Barrier(ctx))
			for p := range 3 {
				v, err := c.Get(ctx, fmt.Sprintf("addr/%d", p))
				require.NoError(t, err)
				got[r] = append(got[r], v)
			}
			require.NoError(t, c.Barrier(ctx))
		}()
	}
	wg.Wait()
	for r := range 3 {
		require.Equal(t, []string{"host:100", "host:101", "host:102"}, got[r])
	}
}

func TestGetBlocksUntilPut(t *testing.T) {
	s := NewMem(1)
	ctx := context.Background()
	res := make(chan string)
	go func() {
		v, _ := s.Get(ctx, "k")
		res <- v
	}()
	select {
	case <-res:
		t.Fatal("Get returned before Put")
	case <-time.After(10 * time.Millisecond):
	}
	require.NoError(t, s.Put(ctx, "k", "v"))
	require.Equal(t, "v", <-res)

	short, cancel := context.WithTimeout(ctx, time.Millisecond)
	defer cancel()
	_, err := s.Get(short, "missing")
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

func TestBadInput(t *testing.T) {
	s := NewMem(1)
	require.Error(t, s.Put(context.Background(), "a b", "v"))
	require.Error(t, s.Put(context.Background(), "k", ""))

	srv, err := Listen("127.0.0.1:0", 1)
	require.NoError(t, err)
	defer srv.Close()
	c, err := net.Dial("tcp", srv.Addr())
	require.NoError(t, err)
	defer c.Close()
	fmt.Fprintf(c, "frobnicate\n")
	line, err := bufio.NewReader(c).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "err malformed request\n", line)

	// A client whose Get is cancelled fails cleanly and is then closed.
	cl, err := Dial(context.Background(), srv.Addr())
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err = cl.Get(ctx, "never")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	_, err = cl.Get(context.Background(), "never")
	require.ErrorIs(t, err, ErrClosed)
}
