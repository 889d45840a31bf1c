package pmi

import (
	"bufio"
	"context"
	"net"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// fakeHydra answers PMI-1 requests the way Hydra's proxy does.
func fakeHydra(t *testing.T, conn net.Conn, kv map[string]string) {
	r := bufio.NewReader(conn)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		m := Parse(line)
		var reply string
		switch m["cmd"] {
		case "init":
			reply = "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0"
		case "get_maxes":
			reply = "cmd=maxes kvsname_max=256 keylen_max=64 vallen_max=1024 rc=0"
		case "get_my_kvsname":
			reply = "cmd=my_kvsname kvsname=kvs_42_0 rc=0"
		case "put":
			require.Equal(t, "kvs_42_0", m["kvsname"])
			kv[m["key"]] = m["value"]
			reply = "cmd=put_result rc=0 msg=success"
		case "get":
			if v, ok := kv[m["key"]]; ok {
				reply = "cmd=get_result rc=0 msg=success value=" + v
			} else {
				reply = "cmd=get_result rc=-1 msg=key_" + m["key"] + "_not_found"
			}
		case "barrier_in":
			reply = "cmd=barrier_out"
		case "finalize":
			reply = "cmd=finalize_ack"
		default:
			reply = "cmd=garbage"
		}
		if _, err := conn.Write([]byte(reply + "\n")); err != nil {
			return
		}
	}
}

func TestClient(t *testing.T) {
	a, b := net.Pipe()
	kv := map[string]string{}
	go fakeHydra(t, b, kv)
	ctx := context.Background()
	c, err := New(ctx, a, 1, 4)
	require.NoError(t, err)
	require.Equal(t, 1, c.Rank())
	require.Equal(t, 4, c.Size())
	require.Equal(t, 1, c.Version())
	require.NoError(t, c.Put(ctx, "addr-1", "127.0.0.1:5000"))
	require.NoError(t, c.Barrier(ctx))
	v, err := c.Get(ctx, "addr-1")
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:5000", v)
	require.Error(t, c.Put(ctx, "bad key", "v"))

	short, cancel := context.WithCancel(ctx)
	cancel()
	_, err = c.Get(short, "missing")
	require.ErrorIs(t, err, context.Canceled)
	require.NoError(t, c.Close())
}

func TestProtocolErrors(t *testing.T) {
	a, b := net.Pipe()
	go func() {
		r := bufio.NewReader(b)
		r.ReadString('\n')
		b.Write([]byte("cmd=response_to_init pmi_version=2 rc=0\n"))
	}()
	_, err := New(context.Background(), a, 0, 1)
	require.ErrorIs(t, err, ErrProtocol)
}

func FuzzParse(f *testing.F) {
	f.Add("cmd=get_result rc=0 msg=success value=x\n")
	f.Add("cmd= = ==\t\n")
	f.Fuzz(func(t *testing.T, line string) {
		m := Parse(line)
		for k, v := range m {
			require.False(t, strings.ContainsAny(k+v, " \t\n"))
		}
	})
}
