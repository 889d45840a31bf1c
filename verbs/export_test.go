package verbs

// SetFlushHook makes f run before every outbox holding first
// transmissions or READ responses is sent (nil: none), with the QPs
// whose first transmissions it holds.
func SetFlushHook(f func(held []*QP)) {
	if f == nil {
		flushHook.Store(nil)
		return
	}
	flushHook.Store(&f)
}

// Held reports whether completions wait for an outbox's flush.
func (qp *QP) Held() bool { return qp.held.Load() }
