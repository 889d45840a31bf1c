// The C side of librvma: what needs no Go (error strings, the thread's last
// message) and what Go must not do itself (allocate memory that C keeps).
#include <stdlib.h>
#include <string.h>

#include "rvma.h"
#include "helpers.h"

// Each thread's last message: the Go call that failed runs on the caller's
// thread, so thread-local storage here is the caller's. Fixed size, so a
// failing call never allocates; longer messages are cut.
static __thread char last_msg[1024];

void rvma__set_error(const char *msg, size_t n) {
	if (n >= sizeof last_msg)
		n = sizeof last_msg - 1;
	if (n > 0)
		memcpy(last_msg, msg, n);
	last_msg[n] = 0;
}

const char *rvma_last_error_message(void) { return last_msg; }

const char *rvma_strerror(int code) {
	switch (code) {
	case RVMA_SUCCESS: return "RVMA_SUCCESS: no error";
	case RVMA_ERR_ARG: return "RVMA_ERR_ARG: invalid argument";
	case RVMA_ERR_HANDLE: return "RVMA_ERR_HANDLE: invalid handle";
	case RVMA_ERR_RANK: return "RVMA_ERR_RANK: rank out of range";
	case RVMA_ERR_BOUNDS: return "RVMA_ERR_BOUNDS: access outside the target window";
	case RVMA_ERR_EPOCH: return "RVMA_ERR_EPOCH: no access epoch open for the target";
	case RVMA_ERR_SYNC: return "RVMA_ERR_SYNC: synchronisation call out of order";
	case RVMA_ERR_DATATYPE: return "RVMA_ERR_DATATYPE: datatype or length mismatch";
	case RVMA_ERR_PEER: return "RVMA_ERR_PEER: peer failed";
	case RVMA_ERR_REMOTE: return "RVMA_ERR_REMOTE: failed on another rank";
	case RVMA_ERR_CLOSED: return "RVMA_ERR_CLOSED: closed";
	case RVMA_ERR_BOOTSTRAP: return "RVMA_ERR_BOOTSTRAP: bootstrap failed";
	case RVMA_ERR_STATE: return "RVMA_ERR_STATE: not initialized, or initialized already";
	case RVMA_ERR_NOT_RETAINED: return "RVMA_ERR_NOT_RETAINED: epoch not retained";
	case RVMA_ERR_REFUSED: return "RVMA_ERR_REFUSED: the target refused the put";
	case RVMA_ERR_TRUNCATE: return "RVMA_ERR_TRUNCATE: message truncated";
	case RVMA_ERR_TIMEOUT: return "RVMA_ERR_TIMEOUT: timed out";
	case RVMA_ERR_UNSUPPORTED: return "RVMA_ERR_UNSUPPORTED: not supported";
	case RVMA_ERR_RESOURCE: return "RVMA_ERR_RESOURCE: out of resources";
	case RVMA_ERR_OTHER: return "RVMA_ERR_OTHER: error";
	case RVMA_ERR_CANCELLED: return "RVMA_ERR_CANCELLED: cancelled";
	}
	return "unknown rvma error code";
}

// Window memory the library allocates when the device has no shared
// memory: C's, so that its address may be handed to the caller (Go memory
// may not be kept by C). Zeroed and page-aligned, as rma.Allocate's.
void *rvma__alloc(size_t n) {
	void *p = NULL;
	if (posix_memalign(&p, 4096, n) != 0)
		return NULL;
	memset(p, 0, n);
	return p;
}

void rvma__free(void *p) { free(p); }

// The names rvma_comm_transport returns, as static strings.
const char *rvma__transport_name(int i) {
	static const char *names[] = {"", "shm", "udp", "loop"};
	if (i < 0 || i >= (int)(sizeof names / sizeof names[0]))
		return "";
	return names[i];
}
