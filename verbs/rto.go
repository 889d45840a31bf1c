package verbs

import (
	"time"

	"github.com/rvma/rvma/internal/psn"
)

// rtoEstimator is an RC requester's retransmission timer, after RFC 6298:
// a smoothed round trip and its variation from samples taken on
// acknowledgements (one timed PSN at a time, none across a
// retransmission: Karn's rule), a timeout of srtt + 4·rttvar that never
// goes below the configured floor, doubled after every timeout without
// progress and capped. InfiniBand's own timer is fixed; a fixed 20 ms
// killed connections of a loaded host whose acknowledgements queue behind
// 63 other ranks'. Time is passed in, so tests drive it.
type rtoEstimator struct {
	floor, ceiling time.Duration
	srtt, rttvar   time.Duration // zero srtt: no sample yet
	backoff        int           // timeouts since the last progress

	timed   bool      // a PSN is being timed
	timedAt uint32    // its PSN
	sentAt  time.Time // when it left
	retxAt  time.Time // the last retransmission after a timeout
}

func (e *rtoEstimator) init(floor, ceiling time.Duration) {
	*e = rtoEstimator{floor: floor, ceiling: ceiling}
}

// rto is the current retransmission timeout.
func (e *rtoEstimator) rto() time.Duration {
	d := e.base()
	for range e.backoff {
		if d >= e.ceiling {
			break
		}
		d *= 2
	}
	return min(d, e.ceiling)
}

// sent notes a PSN leaving for the first time; it is timed if none is.
func (e *rtoEstimator) sent(p uint32, now time.Time) {
	if !e.timed {
		e.timed, e.timedAt, e.sentAt = true, p, now
	}
}

// acked notes that every PSN before u is acknowledged: a timed PSN among
// them gives a sample, which ends the backoff. Progress without a sample
// ends it only if it came within the unbacked timeout of the last
// retransmission (a loss, not a timeout shorter than the round trip);
// otherwise it stays (Karn), or a timeout shorter than the round trip
// would fire on every flight and never let a sample through.
func (e *rtoEstimator) acked(u uint32, now time.Time) {
	if !e.timed || psn.Diff(u, e.timedAt) <= 0 {
		if e.backoff > 0 && now.Sub(e.retxAt) < e.base() {
			e.backoff = 0
		}
		return
	}
	e.timed = false
	e.backoff = 0
	e.sample(now.Sub(e.sentAt))
}

// base is the timeout without backoff.
func (e *rtoEstimator) base() time.Duration {
	d := e.floor
	if e.srtt > 0 {
		d = max(d, e.srtt+4*e.rttvar)
	}
	return min(d, e.ceiling)
}

func (e *rtoEstimator) sample(r time.Duration) {
	if r <= 0 {
		r = time.Microsecond
	}
	if e.srtt == 0 {
		e.srtt, e.rttvar = r, r/2
		return
	}
	d := e.srtt - r
	if d < 0 {
		d = -d
	}
	e.rttvar = (3*e.rttvar + d) / 4
	e.srtt = (7*e.srtt + r) / 8
}

// timedOut doubles the timeout; the flight is resent from its first
// unacknowledged PSN, the timed one with it, which then measures nothing
// (Karn).
func (e *rtoEstimator) timedOut(now time.Time) {
	e.backoff++
	e.timed = false
	e.retxAt = now
}

// resent notes that transmission rewinds to PSN p: a timed PSN from p on
// is sent again and measures nothing; one before p still does.
func (e *rtoEstimator) resent(p uint32) {
	if e.timed && psn.Diff(e.timedAt, p) >= 0 {
		e.timed = false
	}
}
