package wire

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The header table of IBTA Vol. 1 (9.2, table 38) for the RC opcodes we
// use, plus the mailbox extension: which extension headers follow the BTH.
func TestOpcodeHeaders(t *testing.T) {
	type hdrs struct{ reth, aeth, imm, atomic, payload, first, last, only bool }
	cases := []struct {
		op   Opcode
		name string
		h    hdrs
	}{
		{SendFirst, "RC_SEND_FIRST", hdrs{payload: true, first: true}},
		{SendMiddle, "RC_SEND_MIDDLE", hdrs{payload: true}},
		{SendLast, "RC_SEND_LAST", hdrs{payload: true, last: true}},
		{SendLastImm, "RC_SEND_LAST_IMM", hdrs{imm: true, payload: true, last: true}},
		{SendOnly, "RC_SEND_ONLY", hdrs{payload: true, only: true}},
		{SendOnlyImm, "RC_SEND_ONLY_IMM", hdrs{imm: true, payload: true, only: true}},
		{WriteFirst, "RC_WRITE_FIRST", hdrs{reth: true, payload: true, first: true}},
		{WriteMiddle, "RC_WRITE_MIDDLE", hdrs{payload: true}},
		{WriteLast, "RC_WRITE_LAST", hdrs{payload: true, last: true}},
		{WriteLastImm, "RC_WRITE_LAST_IMM", hdrs{imm: true, payload: true, last: true}},
		{WriteOnly, "RC_WRITE_ONLY", hdrs{reth: true, payload: true, only: true}},
		{WriteOnlyImm, "RC_WRITE_ONLY_IMM", hdrs{reth: true, imm: true, payload: true, only: true}},
		{ReadRequest, "RC_READ_REQUEST", hdrs{reth: true}},
		{ReadRespFirst, "RC_READ_RESP_FIRST", hdrs{aeth: true, payload: true, first: true}},
		{ReadRespMiddle, "RC_READ_RESP_MIDDLE", hdrs{payload: true}},
		{ReadRespLast, "RC_READ_RESP_LAST", hdrs{aeth: true, payload: true, last: true}},
		{ReadRespOnly, "RC_READ_RESP_ONLY", hdrs{aeth: true, payload: true, only: true}},
		{Acknowledge, "RC_ACK", hdrs{aeth: true}},
		{AtomicAck, "RC_ATOMIC_ACK", hdrs{aeth: true}},
		{CompareSwap, "RC_CMP_SWAP", hdrs{atomic: true}},
		{FetchAdd, "RC_FETCH_ADD", hdrs{atomic: true}},
		{MailboxFirst, "RC_MBX_FIRST", hdrs{payload: true, first: true}},
		{MailboxLastImm, "RC_MBX_LAST_IMM", hdrs{imm: true, payload: true, last: true}},
		{MailboxOnlyImm, "RC_MBX_ONLY_IMM", hdrs{imm: true, payload: true, only: true}},
		{WriteOnlyImm.UC(), "UC_WRITE_ONLY_IMM", hdrs{reth: true, imm: true, payload: true, only: true}},
		{SendMiddle.UC(), "UC_SEND_MIDDLE", hdrs{payload: true}},
		{MailboxOnly.UC(), "UC_MBX_ONLY", hdrs{payload: true, only: true}},
		{WriteList, "RC_WRITE_LIST", hdrs{reth: true, payload: true, only: true}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			require.True(t, c.op.Valid())
			require.Equal(t, c.name, c.op.String())
			got := hdrs{c.op.HasRETH(), c.op.HasAETH(), c.op.HasImm(), c.op.HasAtomicETH(), c.op.HasPayload(),
				c.op.IsFirst(), c.op.IsLast(), c.op.IsOnly()}
			require.Equal(t, c.h, got)
			require.Equal(t, c.op.IsUC(), c.name[:2] == "UC")
			require.Equal(t, c.op.Base().UC().Base(), c.op.Base(), "UC/Base round trip")
		})
	}
	require.Equal(t, Opcode(0x2A), WriteOnly.UC(), "IBTA UC RDMA WRITE ONLY")
	require.Equal(t, Opcode(0xE4), MailboxOnly.UC())
	require.True(t, MailboxOnly.UC().IsMailbox())
	for _, bad := range []Opcode{0x15, 0x1F, 0x2C, 0x40, 0x60, 0xA0, 0xC7, 0xE6, 0xFF} {
		require.False(t, bad.Valid(), "%#x", uint8(bad))
	}
}

func TestPacketPool(t *testing.T) {
	p := Get()
	b := p.Bounce(100)
	copy(b, "bounced")
	p.Payload = b[:7]
	p.PSN = 9
	q := p.Clone()
	require.Equal(t, "bounced", string(q.Payload))
	b[0] = 'X'
	require.Equal(t, "bounced", string(q.Payload), "a bounced payload is copied by Clone")
	borrowed := []byte("borrowed")
	p.Payload = borrowed
	r := p.Clone()
	require.Same(t, &borrowed[0], &r.Payload[0], "a borrowed payload is shared")
	p.Release()
	q.Release()
	r.Release()
	n := Get()
	require.Zero(t, n.PSN)
	require.Nil(t, n.Payload)
}
