package rma

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/rvma/rvma/verbs"
)

// Post, Start, Complete and Wait between ranks of this host (shm) run
// through words in the ranks' memory, as barriers do (hostbar.go): a post
// or a complete is an atomic increment of a word of the peer's, mapped
// here, and Start and Wait take such tokens from their own words. Over
// messages each is a send through the rings and a turn of the receiver's
// progress (halo3d's pscw variant, exchange only, 2 ranks: 5.9 us an
// iteration against Open MPI's 1.0; docs/PERFORMANCE.md).
//
// A rank's sync words follow its lock words in the window's lock memory
// (device memory, which peers of this host map): a wake word and a count
// of sleepers, then per peer the posts it made to this rank, the
// completes it made, and those of its completes whose epoch had a failed
// operation. Tokens only grow; each side counts what it took. A peer
// whose words cannot be mapped here (another host, faults injected on the
// port) is sent messages as before, and a wait takes a message as well as
// a token, so the two ways may mix. After a recovery the windows keep to
// messages, which carry the recovery's generation.

// maxMemSyncRanks bounds the Comms whose windows keep sync words: three
// per rank of the Comm, in every window of every rank.
const maxMemSyncRanks = 4096

// syncHdr is the wake word and the sleepers' count (wordwait.go).
const syncHdr = 2

// syncWordsLen is the number of sync words of a window of a Comm of size
// ranks.
func syncWordsLen(size int) int { return syncHdr + 3*size }

// Indexes of peer r's tokens in a rank's sync words.
func postIdx(r int) int             { return syncHdr + r }
func doneIdx(size, r int) int       { return syncHdr + size + r }
func failedIdx(size, r int) int     { return syncHdr + 2*size + r }
func (w *Win) lockWords() int       { return 1 + w.c.size }
func (w *Win) syncOff() uint64      { return uint64(8 * w.lockWords()) }
func (w *Win) syncBytes() int       { return 8 * syncWordsLen(w.c.size) }
func (w *Win) memSyncAllowed() bool { return w.syncMem != nil && w.c.inc == 0 && !w.c.recovered.Load() }

// syncPeer returns rank r's sync words mapped here (this rank's own for
// r itself), or nil where they are not: then r hears over messages.
func (w *Win) syncPeer(ctx context.Context, r int) []uint64 {
	if !w.memSyncAllowed() {
		return nil
	}
	if r == w.c.rank {
		return w.syncMem
	}
	m := w.syncMap[r].open(func() *verbs.Mapping {
		qp, err := w.c.conn(ctx, r)
		if err != nil {
			return nil
		}
		rw := &w.remote[r]
		m, _ := qp.Map(rw.lockKey, rw.lockAddr+w.syncOff(), w.syncBytes(), verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
		return m
	})
	if m == nil {
		return nil
	}
	return u64s(m.Bytes())
}

// signal gives a token at words[i] and wakes the words' sleepers: all of
// them, since a rank may wait in Start and in Wait at once.
func signal(words []uint64, i int) {
	atomic.AddUint64(&words[i], 1)
	wakeSleepers(words)
}

// onHost reports whether rank r is reached through this host's shared
// memory (its connection is on the shm port), where it gives tokens
// unless its mapping of this rank's words fails.
func (w *Win) onHost(ctx context.Context, r int) bool {
	if r == w.c.rank {
		return true
	}
	qp, err := w.c.conn(ctx, r)
	return err == nil && w.c.dev.Provider(qp.GIDIndex()) == verbs.ProviderSHM
}

// takeSync takes what peer r sends to start (a post) or end (a complete)
// an epoch: a token at this rank's sync word i (taken[r] counts those
// taken), or a message of tag. It returns the message, nil for a token.
// A rank of this host gives tokens as this rank does (or messages, where
// its mapping of this rank's words fails); one of another host, which
// cannot map them, sends messages.
func (w *Win) takeSync(ctx context.Context, op string, r, i int, taken []uint64, tag uint32) ([]byte, error) {
	if w.memSyncAllowed() && w.onHost(ctx, r) {
		return w.takeToken(ctx, op, r, i, &taken[r], tag)
	}
	m, err := w.c.recvMsg(ctx, r, tag)
	if err != nil {
		return nil, opErr(op, r, err)
	}
	return m, nil
}

// takeToken waits for peer r's token at this rank's sync word i (taken
// counts those taken so far) or a message of tag from r, whichever comes
// first, and returns the message (nil for a token): awaitWords, which
// looks at the inbox, ctx and r's liveness now and then.
func (w *Win) takeToken(ctx context.Context, op string, r, i int, taken *uint64, tag uint32) ([]byte, error) {
	c := w.c
	ictx, in := c.interruptible(ctx)
	defer in.end()
	mine := w.syncMem
	took := func() bool {
		if atomic.LoadUint64(&mine[i]) > *taken {
			*taken++
			return true
		}
		return false
	}
	var msg []byte
	gotMsg := func() (got bool) {
		k := inboxKey{r, tag}
		c.eng.Locked(func() {
			if got = len(c.msg.inbox[k]) > 0; got {
				msg = c.msg.pop(k)
			}
		})
		if got && msg == nil {
			msg = []byte{} // a post's message is empty; nil means a token
		}
		return got
	}
	// fail reports whether the wait must end without a token: ctx, a
	// death the launcher announced, r's process or connection gone, or a
	// probe of r (as a receive sends one, every two ticks of wakeProbes)
	// that could not go: r's Comm closed.
	due := c.ticks.Load() + 2
	fail := func() error {
		if err := ictx.Err(); err != nil {
			return opErr(op, r, in.err(err))
		}
		var gone error
		if c.broken(r) {
			gone = fmt.Errorf("%w: its connection failed", ErrPeer)
		} else if d := &w.syncMap[r]; r != c.rank && d.state.Load() == directMapped && d.m.PeerGone() {
			gone = fmt.Errorf("%w: its process is gone", ErrPeer)
		} else if r != c.rank && c.ticks.Load() >= due {
			due = c.ticks.Load() + 2
			if _, err := c.sendMsg(ictx, r, kindPing, 0, nil, nil); err != nil {
				gone = fmt.Errorf("%w: %w", ErrPeer, err)
			}
		}
		if gone != nil {
			c.troubled.Store(true)
			return opErr(op, r, in.err(gone))
		}
		return nil
	}
	// Where ranks share cores the kernel gets the core every 16 rounds:
	// every round made halo3d's pscw variant with its stencil slower (4
	// ranks on 2 cores: 0.98 ms an iteration against 1.19, alternating
	// builds).
	err := awaitWords(c, mine, took, func() (bool, error) {
		if gotMsg() {
			return true, nil
		}
		return false, fail()
	}, false)
	return msg, err
}
