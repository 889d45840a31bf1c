//go:build linux

package verbs_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/verbs"
	"github.com/rvma/rvma/verbs/verbstest"
)

// TestTsharkDissects captures our packets on loopback and checks that
// Wireshark's RoCE dissector decodes opcode, QPN, PSN and RETH as we sent
// them. RoCEv2 traffic is recognised by UDP port 4791, so the target binds
// it.
func TestTsharkDissects(t *testing.T) {
	if _, err := exec.LookPath("tshark"); err != nil {
		t.Skip("tshark is not installed (Debian package tshark)")
	}
	if os.Geteuid() != 0 {
		t.Skip("capturing on lo needs root")
	}
	// One datagram per packet: a GSO train crosses lo as one super-packet,
	// which a capture shows as one UDP datagram.
	noGSO := &verbs.DeviceConfig{NoGSO: true}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	target, err := verbs.Open(ctx, "udp://127.0.0.1:4791", noGSO)
	if err != nil {
		t.Skipf("UDP port 4791 is taken: %v", err)
	}
	defer target.Close()
	initiator, err := verbs.Open(ctx, "udp://127.0.0.1:0", noGSO)
	require.NoError(t, err)
	defer initiator.Close()
	a, b := side(t, initiator), side(t, target)
	cfg := &verbs.ConnectConfig{MTU: 1024}
	require.NoError(t, a.QP.Connect(b.QP.Endpoint(), cfg))
	require.NoError(t, b.QP.Connect(a.QP.Endpoint(), cfg))

	// Each WRITE is three packets to the target: FIRST, MIDDLE, LAST.
	// tshark attaches its filter some time after it says it is capturing
	// (longer on a loaded host), so WRITEs are posted until it has seen
	// one whole; each is checked as tshark decoded it.
	cmd := exec.CommandContext(ctx, "tshark", "-i", "lo", "-f", "udp dst port 4791", "-l",
		"-T", "fields", "-E", "separator=,", "-e", "infiniband.bth.opcode", "-e", "infiniband.bth.destqp",
		"-e", "infiniband.bth.psn", "-e", "infiniband.reth.va", "-e", "infiniband.reth.r_key", "-e", "infiniband.reth.dmalen")
	// tshark runs dumpcap as a child, which would keep the pipes open after
	// a kill: kill the group, and stop waiting for the pipes soon after.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 2 * time.Second
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	defer func() {
		cancel()
		cmd.Wait()
	}()
	lines := make(chan string, 64)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- normalize(sc.Text())
		}
	}()
	va := b.MR.Addr() + 16
	var want []string // the packets of the WRITEs posted, as tshark should show them
	psn := a.QP.Endpoint().PSN
	for id := uint64(1); ; id++ {
		a.Post(t, verbs.SendWR{ID: id, Opcode: verbs.OpWrite, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{a.MR.SGE(0, 2500)},
			RemoteAddr: va, RKey: b.MR.RKey()})
		require.Equal(t, verbs.StatusSuccess, a.Wait(t).Status)
		want = append(want,
			fmt.Sprintf("6,%d,%d,%d,%d,2500", b.QP.Num(), psn, va, b.MR.RKey()), // RC RDMA WRITE First with RETH
			fmt.Sprintf("7,%d,%d,,,", b.QP.Num(), psn+1),                        // Middle
			fmt.Sprintf("8,%d,%d,,,", b.QP.Num(), psn+2))                        // Last
		psn += 3
		// Collect what tshark shows within a second; a whole WRITE ends it.
		var got []string
		timeout := time.After(time.Second)
	collect:
		for {
			select {
			case l, ok := <-lines:
				require.True(t, ok, "tshark ended")
				got = append(got, l)
				if n := len(got); n >= 3 && strings.HasPrefix(got[n-3], "6,") {
					break collect
				}
			case <-timeout:
				break collect
			case <-ctx.Done():
				t.Fatal("tshark never showed a whole WRITE")
			}
		}
		for _, l := range got {
			require.Contains(t, want, l, "a packet as tshark decoded it")
		}
		if n := len(got); n >= 3 && strings.HasPrefix(got[n-3], "6,") {
			i := slices.Index(want, got[n-3])
			require.Equal(t, want[i:i+3], got[n-3:], "a WRITE's packets, in order")
			return
		}
	}
}

// normalize turns tshark's hex fields (0x...) into decimal.
func normalize(line string) string {
	f := strings.Split(line, ",")
	for i, s := range f {
		if strings.HasPrefix(s, "0x") {
			if v, err := strconv.ParseUint(s[2:], 16, 64); err == nil {
				f[i] = strconv.FormatUint(v, 10)
			}
		}
	}
	return strings.Join(f, ",")
}

func side(t *testing.T, d *verbs.Device) *verbstest.Side {
	s := &verbstest.Side{Dev: d}
	var err error
	s.PD, err = d.AllocPD()
	require.NoError(t, err)
	s.CQ, err = d.CreateCQ(verbs.CQConfig{})
	require.NoError(t, err)
	s.QP, err = s.PD.CreateQP(verbs.QPConfig{SendCQ: s.CQ})
	require.NoError(t, err)
	s.Buf = make([]byte, 8192)
	s.MR, err = s.PD.RegisterMR(s.Buf, verbs.AccessAll)
	require.NoError(t, err)
	return s
}
