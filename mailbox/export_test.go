package mailbox

// Sleepers returns how many waiters sleep on a window in process memory.
func (w *Window) Sleepers() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.sleepers
}
