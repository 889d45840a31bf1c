package mailbox

// Sleepers returns how many waiters sleep on a window in process memory.
func (w *Window) Sleepers() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.sleepers
}

// OthersOnly is othersOnly's verdict.
func (w *Window) OthersOnly(scarce bool) bool {
	ok, _ := w.othersOnly(scarce)
	return ok
}
