package reliability

import (
	"fmt"
	"math"
	"time"
)

// Scheme is a way to repair losses.
type Scheme uint8

const (
	Auto Scheme = iota // chosen per message by the model
	SR                 // selective repeat: resend what the receiver reports missing
	EC                 // Reed-Solomon erasure coding, selective repeat as fallback
)

func (s Scheme) String() string {
	switch s {
	case Auto:
		return "auto"
	case SR:
		return "sr"
	case EC:
		return "ec"
	}
	return fmt.Sprintf("Scheme(%d)", uint8(s))
}

// ParseScheme parses "auto", "sr" or "ec".
func ParseScheme(s string) (Scheme, error) {
	for _, v := range []Scheme{Auto, SR, EC} {
		if v.String() == s {
			return v, nil
		}
	}
	return 0, fmt.Errorf("reliability: unknown scheme %q (want auto, sr or ec)", s)
}

// Link describes a long-haul path for the completion-time model.
type Link struct {
	Rate float64       // bytes per second the sender injects at
	RTT  time.Duration // round-trip time
	Loss float64       // probability that one chunk is lost, in [0, 1)
}

// ChunkLoss is the probability that a chunk of n packets loses at least
// one, when packets are lost independently with probability p: a chunk
// counts only when all of its packets arrived.
func ChunkLoss(p float64, n int) float64 {
	if p <= 0 {
		return 0
	}
	return -math.Expm1(float64(n) * math.Log1p(-p))
}

// Estimate is a model's expected completion time and what it is made of.
type Estimate struct {
	Scheme Scheme
	K, M   int           // EC stripe shape (0 for SR)
	Time   time.Duration // expected time from the first chunk sent to the sender learning of completion
	Wire   float64       // expected bytes on the wire per payload byte
}

func (e Estimate) String() string {
	if e.Scheme == EC {
		return fmt.Sprintf("EC(%d,%d) %v", e.K, e.M, e.Time.Round(time.Microsecond))
	}
	return fmt.Sprintf("SR %v", e.Time.Round(time.Microsecond))
}

// SRTime is the SDR-RDMA model of selective repeat (Khalilov et al. §4.2,
// App. A) for a message of size bytes in chunks of chunk bytes: chunk i is
// first sent at i·T and, while lost, again every O = repair + T, so it
// lands at X_i = i·T + O·(Y_i − 1) with Y_i geometric; the message
// completes at max X_i + T + RTT. E[max X_i] = ∫ P(max X_i ≥ q) dq is
// evaluated with the exact tail P(X_i ≥ q) = P^⌈(q−t_i)/O⌉ (the paper drops
// the ceiling, which overstates the time). Injection slots taken by
// retransmissions stretch the schedule: T is chunk/Rate/(1−P). repair is
// the time from a lost chunk's send to its retransmission: about one RTT
// when the receiver reports gaps (NACK), RTT + α·RTT on a timeout.
func SRTime(l Link, size int64, chunk int, repair time.Duration) time.Duration {
	if size <= 0 {
		return l.RTT
	}
	m := (size + int64(chunk) - 1) / int64(chunk)
	p := l.Loss
	t := float64(chunk) / l.Rate / (1 - p)
	o := repair.Seconds() + t
	last := float64(m-1) * t
	return time.Duration((last + srTail(m, t, o, p) + t + l.RTT.Seconds()) * float64(time.Second))
}

// srTail is ∫_{t_last}^∞ P(max X_i ≥ q) dq for m chunks sent every t,
// retried every o, each try lost with probability p.
func srTail(m int64, t, o, p float64) float64 {
	if p <= 0 || m == 0 {
		return 0
	}
	last := float64(m-1) * t
	// The integrand is a step function of q; steps of o/512 are far finer
	// than its changes for all but tiny messages, where it hardly matters.
	h := o / 512
	sum := 0.0
	for q := last + h/2; ; q += h {
		logSurvive := 0.0 // log P(max X_i < q)
		for j := 1; ; j++ {
			pj := math.Pow(p, float64(j))
			if pj < 1e-18 {
				break
			}
			// Chunks with t_i in [q − j·o, q − (j−1)·o) need a j-th try.
			lo := max(0, int64(math.Ceil((q-float64(j)*o)/t)))
			hi := min(m, int64(math.Ceil((q-float64(j-1)*o)/t)))
			if hi > lo {
				logSurvive += float64(hi-lo) * math.Log1p(-pj)
			}
			if lo == 0 {
				break
			}
		}
		f := -math.Expm1(logSurvive)
		sum += f * h
		if f < 1e-9 {
			return sum
		}
	}
}

// MDSSuccess is the probability that a Reed-Solomon stripe of k data and m
// parity chunks decodes: at most m of its k+m chunks lost.
func MDSSuccess(p float64, k, m int) float64 {
	s := 0.0
	for i := 0; i <= m; i++ {
		s += binomPMF(k+m, i, p)
	}
	return min(s, 1)
}

func binomPMF(n, i int, p float64) float64 {
	if p <= 0 {
		if i == 0 {
			return 1
		}
		return 0
	}
	lg := func(x int) float64 { v, _ := math.Lgamma(float64(x + 1)); return v }
	return math.Exp(lg(n) - lg(i) - lg(n-i) + float64(i)*math.Log(p) + float64(n-i)*math.Log1p(-p))
}

// ECTime is the SDR-RDMA model of erasure coding: the message goes out as
// L = ⌈M/k⌉ stripes of k data and m parity chunks; a stripe that lost more
// than m falls back to selective repeat of its missing data chunks, which
// starts fallback after the last chunk was sent. The paper charges
// E[T_SR(E[failures]·k)] even when nothing fails; this charges the repair
// only with its probability, and only for the data chunks actually missing.
// fallback is the wait from the moment the sender could have learned of
// completion (last send + RTT) to the start of the repair.
func ECTime(l Link, size int64, chunk, k, m int, fallback, repair time.Duration) time.Duration {
	if size <= 0 {
		return l.RTT
	}
	n := (size + int64(chunk) - 1) / int64(chunk)
	stripes := (n + int64(k) - 1) / int64(k)
	t := float64(chunk) / l.Rate
	inj := float64(n+stripes*int64(m)) * t
	base := inj + l.RTT.Seconds()
	// Full stripes, and a short last one of r data chunks.
	full, r := n/int64(k), int(n%int64(k))
	logOK, expMissing := 0.0, 0.0 // log P(no stripe fails), E[missing data chunks]
	stripe := func(kk int, count float64) {
		ps := MDSSuccess(l.Loss, kk, m)
		logOK += count * math.Log(ps)
		for i := m + 1; i <= kk+m; i++ {
			expMissing += count * binomPMF(kk+m, i, l.Loss) * float64(i) * float64(kk) / float64(kk+m)
		}
	}
	stripe(k, float64(full))
	if r > 0 {
		stripe(r, 1)
	}
	pFall := -math.Expm1(logOK)
	if pFall < 1e-12 {
		return time.Duration(base * float64(time.Second))
	}
	resend := int64(math.Ceil(expMissing / pFall)) // given at least one stripe failed
	sr := SRTime(l, resend*int64(chunk), chunk, repair)
	return time.Duration((base + pFall*(fallback.Seconds()+sr.Seconds())) * float64(time.Second))
}

// Choose returns the scheme the model expects to finish first for size
// bytes over l, trying EC with k data chunks and each parity count in ms.
// repair and fallback are as for SRTime and ECTime.
func Choose(l Link, size int64, chunk, k int, ms []int, repair, fallback time.Duration) (best Estimate, all []Estimate) {
	sr := Estimate{Scheme: SR, Time: SRTime(l, size, chunk, repair), Wire: 1 / (1 - l.Loss)}
	best, all = sr, []Estimate{sr}
	for _, m := range ms {
		e := Estimate{Scheme: EC, K: k, M: m, Time: ECTime(l, size, chunk, k, m, fallback, repair), Wire: float64(k+m) / float64(k)}
		all = append(all, e)
		if e.Time < best.Time {
			best = e
		}
	}
	return best, all
}
