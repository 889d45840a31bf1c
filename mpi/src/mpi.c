/*
 * libmpi: MPI over librvma (rvma.h). The environment, errors, handle
 * tables, communicators, groups, datatypes, messages and collectives; the
 * windows are in win.c.
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <wchar.h>

#include "impl.h"

rvma_comm rv_world;
int rv_rank, rv_size = 1, rv_up;
static int rv_done, rv_thread = MPI_THREAD_SINGLE;
static pthread_t rv_main;
pthread_mutex_t rv_mu = PTHREAD_MUTEX_INITIALIZER;

/* ---- Tables ---------------------------------------------------------- */

int tbl_add(struct table *t, void *p) {
	pthread_mutex_lock(&rv_mu);
	int h = -1;
	int start = t->hint > t->first ? t->hint : t->first;
	for (int pass = 0; pass < 2 && h < 0; pass++) {
		for (int i = pass ? t->first : start; i < t->n; i++)
			if (!t->v[i]) {
				h = i;
				break;
			}
	}
	if (h < 0) {
		int n = t->n < 64 ? 64 : 2 * t->n;
		if (n < t->first + 1) n = t->first + 64;
		void **v = realloc(t->v, (size_t)n * sizeof *v);
		if (v) {
			memset(v + t->n, 0, (size_t)(n - t->n) * sizeof *v);
			h = t->n > t->first ? t->n : t->first;
			t->v = v, t->n = n;
		}
	}
	if (h >= 0) t->v[h] = p, t->hint = h + 1;
	pthread_mutex_unlock(&rv_mu);
	return h;
}

void *tbl_get(struct table *t, int h) {
	pthread_mutex_lock(&rv_mu);
	void *p = h > 0 && h < t->n ? t->v[h] : NULL;
	pthread_mutex_unlock(&rv_mu);
	return p;
}

void *tbl_del(struct table *t, int h) {
	pthread_mutex_lock(&rv_mu);
	void *p = NULL;
	if (h > 0 && h < t->n && h >= t->first) {
		p = t->v[h], t->v[h] = NULL;
		if (h < t->hint) t->hint = h;
	}
	pthread_mutex_unlock(&rv_mu);
	return p;
}

/* ---- Errors ------------------------------------------------------------ */

static const char *class_names[] = {
    "MPI_SUCCESS: no error",
    "MPI_ERR_BUFFER: invalid buffer pointer",
    "MPI_ERR_COUNT: invalid count argument",
    "MPI_ERR_TYPE: invalid datatype",
    "MPI_ERR_TAG: invalid tag",
    "MPI_ERR_COMM: invalid communicator",
    "MPI_ERR_RANK: invalid rank",
    "MPI_ERR_REQUEST: invalid request",
    "MPI_ERR_ROOT: invalid root",
    "MPI_ERR_GROUP: invalid group",
    "MPI_ERR_OP: invalid operation",
    "MPI_ERR_TOPOLOGY: invalid topology",
    "MPI_ERR_DIMS: invalid dimensions",
    "MPI_ERR_ARG: invalid argument",
    "MPI_ERR_UNKNOWN: unknown error",
    "MPI_ERR_TRUNCATE: message truncated",
    "MPI_ERR_OTHER: other error",
    "MPI_ERR_INTERN: internal error",
    "MPI_ERR_IN_STATUS: error code in status",
    "MPI_ERR_PENDING: pending request",
    "MPI_ERR_KEYVAL: invalid keyval",
    "MPI_ERR_NO_MEM: out of memory",
    "MPI_ERR_BASE: invalid base",
    "MPI_ERR_INFO_KEY: invalid info key",
    "MPI_ERR_INFO_VALUE: invalid info value",
    "MPI_ERR_INFO_NOKEY: no such info key",
    "MPI_ERR_SPAWN: spawn error",
    "MPI_ERR_PORT: invalid port",
    "MPI_ERR_SERVICE: invalid service",
    "MPI_ERR_NAME: invalid name",
    "MPI_ERR_WIN: invalid window",
    "MPI_ERR_SIZE: invalid size",
    "MPI_ERR_DISP: invalid displacement unit",
    "MPI_ERR_INFO: invalid info",
    "MPI_ERR_LOCKTYPE: invalid lock type",
    "MPI_ERR_ASSERT: invalid assertion",
    "MPI_ERR_RMA_CONFLICT: conflicting RMA accesses",
    "MPI_ERR_RMA_SYNC: RMA call outside its synchronisation",
    "MPI_ERR_RMA_RANGE: RMA access outside the target window",
    "MPI_ERR_RMA_ATTACH: memory cannot be attached",
    "MPI_ERR_RMA_SHARED: memory cannot be shared",
    "MPI_ERR_RMA_FLAVOR: wrong window flavor",
    "MPI_ERR_UNSUPPORTED_OPERATION: not supported by rvma's MPI library",
    "MPI_ERR_UNSUPPORTED_DATAREP: unsupported data representation",
    "MPI_ERR_PROC_ABORTED: a process aborted",
};

static __thread int last_class;
static __thread char last_msg[400];

static int valid_handler(MPI_Errhandler e) {
	return e == MPI_ERRORS_ARE_FATAL || e == MPI_ERRORS_RETURN || e == MPI_ERRORS_ABORT;
}

static int raise_err(MPI_Errhandler eh, int cls, const char *fn, const char *fmt, va_list ap) {
	char msg[340];
	vsnprintf(msg, sizeof msg, fmt, ap);
	snprintf(last_msg, sizeof last_msg, "%.40s: %.340s", fn, msg);
	last_class = cls;
	if (eh != MPI_ERRORS_RETURN) {
		fprintf(stderr, "rvma MPI: rank %d: %s: %s\n", rv_rank, last_msg,
		        cls > 0 && cls <= MPI_ERR_LASTCODE ? class_names[cls] : "unknown error class");
		fflush(stdout);
		fflush(stderr);
		exit(cls > 0 && cls < 256 ? cls : 1);
	}
	return cls;
}

enum { MAX_CART = 16 };
struct comm {
	int ctx;
	MPI_Errhandler eh;
	/* a Cartesian topology (MPI_Cart_create) when ndims > 0 */
	int ndims, dims[MAX_CART], periods[MAX_CART];
};
/* world (ctx 0), self, then duplicates; 64 contexts */
enum { NCTX = 64, NCOMM = NCTX + 3 };
static struct comm comms[NCOMM] = {[1] = {.ctx = 0, .eh = MPI_ERRORS_ARE_FATAL}, [2] = {.ctx = -2, .eh = MPI_ERRORS_ARE_FATAL}};
static int comm_used[NCOMM] = {0, 1, 1};

static MPI_Errhandler comm_eh(MPI_Comm c) {
	pthread_mutex_lock(&rv_mu);
	MPI_Errhandler e = c > 0 && c < NCOMM && comm_used[c] ? comms[c].eh : comms[MPI_COMM_WORLD].eh;
	pthread_mutex_unlock(&rv_mu);
	return e;
}

int comm_ctx(MPI_Comm c) {
	pthread_mutex_lock(&rv_mu);
	int x = c > 0 && c < NCOMM && comm_used[c] ? comms[c].ctx : -1;
	pthread_mutex_unlock(&rv_mu);
	return x;
}

int fail_comm(MPI_Comm comm, int cls, const char *fn, const char *fmt, ...) {
	va_list ap;
	va_start(ap, fmt);
	int r = raise_err(comm_eh(comm), cls, fn, fmt, ap);
	va_end(ap);
	return r;
}

/* win.c's windows keep their handler; this finds it. */
MPI_Errhandler win_eh(MPI_Win w);

/* The program's window error handlers (MPI_Win_create_errhandler):
 * handles EH_BASE + index; one lives while its handle or a window holds
 * it. */
enum { EH_BASE = 16, NEH = 256 };
static struct {
	MPI_Win_errhandler_function *fn;
	int refs;
} wehs[NEH];

MPI_Win_errhandler_function *eh_user(MPI_Errhandler e) {
	pthread_mutex_lock(&rv_mu);
	MPI_Win_errhandler_function *f = e >= EH_BASE && e < EH_BASE + NEH ? wehs[e - EH_BASE].fn : NULL;
	pthread_mutex_unlock(&rv_mu);
	return f;
}

void eh_ref(MPI_Errhandler e, int d) {
	pthread_mutex_lock(&rv_mu);
	if (e >= EH_BASE && e < EH_BASE + NEH && wehs[e - EH_BASE].fn && (wehs[e - EH_BASE].refs += d) <= 0)
		wehs[e - EH_BASE].fn = NULL, wehs[e - EH_BASE].refs = 0;
	pthread_mutex_unlock(&rv_mu);
}

int MPI_Win_create_errhandler(MPI_Win_errhandler_function *fn, MPI_Errhandler *e) {
	if (!fn || !e) return fail_comm(MPI_COMM_WORLD, MPI_ERR_ARG, __func__, "NULL function or errhandler");
	int i;
	pthread_mutex_lock(&rv_mu);
	for (i = 0; i < NEH && wehs[i].fn; i++) {}
	if (i < NEH) wehs[i].fn = fn, wehs[i].refs = 1;
	pthread_mutex_unlock(&rv_mu);
	if (i == NEH) return fail_comm(MPI_COMM_WORLD, MPI_ERR_NO_MEM, __func__, "all %d error handlers in use", NEH);
	*e = EH_BASE + i;
	return MPI_SUCCESS;
}

/* A failure on window win: its handler decides; a program's handler is
 * called with the window and the class, and the call returns the class
 * (its message recorded for MPI_Error_string first). */
static int win_raise(MPI_Win win, MPI_Errhandler e, int cls, const char *fn, const char *fmt, va_list ap) {
	MPI_Win_errhandler_function *f = eh_user(e);
	if (!f) return raise_err(e ? e : comm_eh(MPI_COMM_WORLD), cls, fn, fmt, ap);
	raise_err(MPI_ERRORS_RETURN, cls, fn, fmt, ap);
	int code = cls;
	f(&win, &code);
	return cls;
}

int fail_win(MPI_Win win, int cls, const char *fn, const char *fmt, ...) {
	va_list ap;
	va_start(ap, fmt);
	int r = win_raise(win, win_eh(win), cls, fn, fmt, ap);
	va_end(ap);
	return r;
}

static int call_win(MPI_Win win, MPI_Errhandler e, int code, ...) {
	va_list ap;
	va_start(ap, code);
	int r = win_raise(win, e, code, "MPI_Win_call_errhandler", "error code %d", ap);
	va_end(ap);
	return r;
}

int MPI_Win_call_errhandler(MPI_Win win, int code) {
	MPI_Errhandler e = win_eh(win);
	if (!e) return fail_comm(MPI_COMM_WORLD, MPI_ERR_WIN, __func__, "invalid window %d", win);
	call_win(win, e, code, code);
	return MPI_SUCCESS; /* the handler returned (or was MPI_ERRORS_RETURN) */
}

int rv_class(int rc, int handle_class) {
	switch (rc) {
	case RVMA_SUCCESS: return MPI_SUCCESS;
	case RVMA_ERR_ARG: return MPI_ERR_ARG;
	case RVMA_ERR_HANDLE: return handle_class;
	case RVMA_ERR_RANK: return MPI_ERR_RANK;
	case RVMA_ERR_BOUNDS: return MPI_ERR_RMA_RANGE;
	case RVMA_ERR_EPOCH:
	case RVMA_ERR_SYNC: return MPI_ERR_RMA_SYNC;
	case RVMA_ERR_DATATYPE: return MPI_ERR_TYPE;
	case RVMA_ERR_CLOSED: return handle_class;
	case RVMA_ERR_TRUNCATE: return MPI_ERR_TRUNCATE;
	case RVMA_ERR_UNSUPPORTED: return MPI_ERR_UNSUPPORTED_OPERATION;
	case RVMA_ERR_RESOURCE: return MPI_ERR_NO_MEM;
	default: return MPI_ERR_OTHER;
	}
}

int rvfail_comm(MPI_Comm comm, int rc, const char *fn) {
	return fail_comm(comm, rv_class(rc, MPI_ERR_COMM), fn, "%s (%s)", rvma_last_error_message(), rvma_strerror(rc));
}

int rvfail_win(MPI_Win win, int rc, const char *fn) {
	return fail_win(win, rv_class(rc, MPI_ERR_WIN), fn, "%s (%s)", rvma_last_error_message(), rvma_strerror(rc));
}

int MPI_Error_string(int code, char *s, int *len) {
	if (!s || !len) return fail_comm(MPI_COMM_WORLD, MPI_ERR_ARG, __func__, "NULL string or length");
	if (code < 0 || code > MPI_ERR_LASTCODE) {
		*len = snprintf(s, MPI_MAX_ERROR_STRING, "unknown error code %d", code);
		return fail_comm(MPI_COMM_WORLD, MPI_ERR_ARG, __func__, "unknown error code %d", code);
	}
	/* The class, and the last failure of this class on this thread. */
	if (code != MPI_SUCCESS && code == last_class && last_msg[0])
		snprintf(s, MPI_MAX_ERROR_STRING, "%.80s (last on this thread: %.400s)", class_names[code], last_msg);
	else
		snprintf(s, MPI_MAX_ERROR_STRING, "%s", class_names[code]);
	*len = (int)strlen(s);
	return MPI_SUCCESS;
}

int MPI_Error_class(int code, int *cls) {
	if (!cls) return fail_comm(MPI_COMM_WORLD, MPI_ERR_ARG, __func__, "NULL class");
	if (code < 0 || code > MPI_ERR_LASTCODE)
		return fail_comm(MPI_COMM_WORLD, MPI_ERR_ARG, __func__, "unknown error code %d", code);
	*cls = code;
	return MPI_SUCCESS;
}

int MPI_Comm_set_errhandler(MPI_Comm c, MPI_Errhandler e) {
	if (comm_ctx(c) == -1) return fail_comm(c, MPI_ERR_COMM, __func__, "invalid communicator %d", c);
	if (!valid_handler(e))
		return fail_comm(c, e > 3 ? MPI_ERR_UNSUPPORTED_OPERATION : MPI_ERR_ARG, __func__,
		                 "error handler %d: only MPI_ERRORS_RETURN, MPI_ERRORS_ARE_FATAL and MPI_ERRORS_ABORT", e);
	pthread_mutex_lock(&rv_mu);
	comms[c].eh = e;
	pthread_mutex_unlock(&rv_mu);
	return MPI_SUCCESS;
}

int MPI_Comm_get_errhandler(MPI_Comm c, MPI_Errhandler *e) {
	if (comm_ctx(c) == -1) return fail_comm(c, MPI_ERR_COMM, __func__, "invalid communicator %d", c);
	if (!e) return fail_comm(c, MPI_ERR_ARG, __func__, "NULL errhandler");
	*e = comm_eh(c);
	return MPI_SUCCESS;
}

int MPI_Errhandler_free(MPI_Errhandler *e) {
	if (e && eh_user(*e)) {
		eh_ref(*e, -1);
		*e = MPI_ERRHANDLER_NULL;
		return MPI_SUCCESS;
	}
	if (!e || !valid_handler(*e)) return fail_comm(MPI_COMM_WORLD, MPI_ERR_ARG, __func__, "invalid error handler");
	*e = MPI_ERRHANDLER_NULL;
	return MPI_SUCCESS;
}

/* ---- Environment ------------------------------------------------------- */

int MPI_Init(int *argc, char ***argv) {
	int provided;
	return MPI_Init_thread(argc, argv, MPI_THREAD_SINGLE, &provided);
}

int MPI_Init_thread(int *argc, char ***argv, int required, int *provided) {
	(void)argc, (void)argv;
	if (rv_up || rv_done) return fail_comm(MPI_COMM_WORLD, MPI_ERR_OTHER, __func__, "called already");
	int rc = rvma_init(&rv_world);
	if (rc) return rvfail_comm(MPI_COMM_WORLD, rc, __func__);
	rvma_comm_rank(rv_world, &rv_rank);
	rvma_comm_size(rv_world, &rv_size);
	rv_main = pthread_self();
	rv_thread = required < MPI_THREAD_SINGLE ? MPI_THREAD_SINGLE
	            : required > MPI_THREAD_MULTIPLE ? MPI_THREAD_MULTIPLE
	                                             : required;
	if (provided) *provided = rv_thread;
	/* Alone, this rank's world is MPI_COMM_SELF: it becomes a
	 * communicator like the others (its own context), with windows,
	 * collectives and messages. */
	if (rv_size == 1) {
		pthread_mutex_lock(&rv_mu);
		comms[MPI_COMM_SELF].ctx = NCTX - 1;
		pthread_mutex_unlock(&rv_mu);
	}
	rv_up = 1;
	return MPI_SUCCESS;
}

int MPI_Initialized(int *flag) {
	if (!flag) return fail_comm(MPI_COMM_WORLD, MPI_ERR_ARG, __func__, "NULL flag");
	*flag = rv_up || rv_done;
	return MPI_SUCCESS;
}

int MPI_Finalized(int *flag) {
	if (!flag) return fail_comm(MPI_COMM_WORLD, MPI_ERR_ARG, __func__, "NULL flag");
	*flag = rv_done;
	return MPI_SUCCESS;
}

int MPI_Finalize(void) {
	if (NOT_INIT(__func__)) return MPI_ERR_OTHER;
	fflush(stdout);
	win_finalize();
	int rc = rvma_finalize();
	rv_up = 0, rv_done = 1;
	if (rc) return rvfail_comm(MPI_COMM_WORLD, rc, __func__);
	return MPI_SUCCESS;
}

/* rvmarun and mpiexec stop the job when a rank exits with a failure. */
int MPI_Abort(MPI_Comm comm, int code) {
	(void)comm;
	fprintf(stderr, "rvma MPI: rank %d: MPI_Abort(%d)\n", rv_rank, code);
	fflush(stdout);
	fflush(stderr);
	_exit(code & 255 ? code & 255 : 1);
}

int MPI_Query_thread(int *provided) {
	if (!provided) return fail_comm(MPI_COMM_WORLD, MPI_ERR_ARG, __func__, "NULL provided");
	*provided = rv_thread;
	return MPI_SUCCESS;
}

int MPI_Is_thread_main(int *flag) {
	if (!flag) return fail_comm(MPI_COMM_WORLD, MPI_ERR_ARG, __func__, "NULL flag");
	*flag = pthread_equal(pthread_self(), rv_main);
	return MPI_SUCCESS;
}

int MPI_Get_version(int *v, int *sv) {
	if (!v || !sv) return fail_comm(MPI_COMM_WORLD, MPI_ERR_ARG, __func__, "NULL argument");
	*v = MPI_VERSION, *sv = MPI_SUBVERSION;
	return MPI_SUCCESS;
}

int MPI_Get_library_version(char *s, int *len) {
	if (!s || !len) return fail_comm(MPI_COMM_WORLD, MPI_ERR_ARG, __func__, "NULL argument");
	*len = snprintf(s, MPI_MAX_LIBRARY_VERSION_STRING, "rvma MPI compatibility library (rvma.h API %d)",
	                RVMA_API_VERSION);
	return MPI_SUCCESS;
}

int MPI_Get_processor_name(char *name, int *len) {
	if (!name || !len) return fail_comm(MPI_COMM_WORLD, MPI_ERR_ARG, __func__, "NULL argument");
	if (gethostname(name, MPI_MAX_PROCESSOR_NAME) != 0) snprintf(name, MPI_MAX_PROCESSOR_NAME, "localhost");
	name[MPI_MAX_PROCESSOR_NAME - 1] = 0;
	*len = (int)strlen(name);
	return MPI_SUCCESS;
}

double MPI_Wtime(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double MPI_Wtick(void) {
	struct timespec ts;
	if (clock_getres(CLOCK_MONOTONIC, &ts) != 0) return 1e-9;
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The even split, largest first, of the dimensions left 0. */
int MPI_Dims_create(int nnodes, int ndims, int dims[]) {
	if (nnodes < 1 || ndims < 0 || (ndims > 0 && !dims))
		return fail_comm(MPI_COMM_WORLD, MPI_ERR_ARG, __func__, "nnodes %d, ndims %d", nnodes, ndims);
	int fixed = 1, free_dims = 0;
	for (int i = 0; i < ndims; i++) {
		if (dims[i] < 0) return fail_comm(MPI_COMM_WORLD, MPI_ERR_DIMS, __func__, "dims[%d] = %d", i, dims[i]);
		if (dims[i] > 0)
			fixed *= dims[i];
		else
			free_dims++;
	}
	if (nnodes % fixed != 0)
		return fail_comm(MPI_COMM_WORLD, MPI_ERR_DIMS, __func__, "%d nodes do not divide by the fixed dims", nnodes);
	if (!free_dims) {
		if (fixed != nnodes) return fail_comm(MPI_COMM_WORLD, MPI_ERR_DIMS, __func__, "dims multiply to %d", fixed);
		return MPI_SUCCESS;
	}
	int p = nnodes / fixed, primes[64], np = 0, d[64];
	for (int f = 2; f * f <= p; f++)
		for (; p % f == 0; p /= f) primes[np++] = f;
	if (p > 1) primes[np++] = p;
	for (int i = 0; i < free_dims; i++) d[i] = 1;
	for (int i = np - 1; i >= 0; i--) {
		int k = 0;
		for (int j = 1; j < free_dims; j++)
			if (d[j] < d[k]) k = j;
		d[k] *= primes[i];
	}
	for (int i = 0; i < free_dims; i++)
		for (int j = i + 1; j < free_dims; j++)
			if (d[j] > d[i]) {
				int t = d[i];
				d[i] = d[j], d[j] = t;
			}
	for (int i = 0, k = 0; i < ndims; i++)
		if (dims[i] == 0) dims[i] = d[k++];
	return MPI_SUCCESS;
}

/* ---- Communicators ------------------------------------------------------ */

#define CHECK_COMM(c, fn)                                                                             \
	do {                                                                                          \
		if (NOT_INIT(fn)) return MPI_ERR_OTHER;                                               \
		int x_ = comm_ctx(c);                                                                 \
		if (x_ == -1) return fail_comm(c, MPI_ERR_COMM, fn, "invalid communicator %d", (int)c); \
		if (x_ == -2)                                                                         \
			return fail_comm(c, MPI_ERR_UNSUPPORTED_OPERATION, fn,                        \
			                 "MPI_COMM_SELF supports rank and size only");                \
	} while (0)

int MPI_Comm_rank(MPI_Comm c, int *rank) {
	if (NOT_INIT(__func__)) return MPI_ERR_OTHER;
	int x = comm_ctx(c);
	if (x == -1) return fail_comm(c, MPI_ERR_COMM, __func__, "invalid communicator %d", c);
	if (!rank) return fail_comm(c, MPI_ERR_ARG, __func__, "NULL rank");
	*rank = x == -2 ? 0 : rv_rank;
	return MPI_SUCCESS;
}

int MPI_Comm_size(MPI_Comm c, int *size) {
	if (NOT_INIT(__func__)) return MPI_ERR_OTHER;
	int x = comm_ctx(c);
	if (x == -1) return fail_comm(c, MPI_ERR_COMM, __func__, "invalid communicator %d", c);
	if (!size) return fail_comm(c, MPI_ERR_ARG, __func__, "NULL size");
	*size = x == -2 ? 1 : rv_size;
	return MPI_SUCCESS;
}

/* Collective: the ranks agree on the lowest context free everywhere. */
int MPI_Comm_dup(MPI_Comm c, MPI_Comm *out) {
	CHECK_COMM(c, __func__);
	if (!out) return fail_comm(c, MPI_ERR_ARG, __func__, "NULL newcomm");
	uint64_t used = 0, *all = malloc(sizeof(uint64_t) * (size_t)rv_size);
	if (!all) return fail_comm(c, MPI_ERR_NO_MEM, __func__, "out of memory");
	pthread_mutex_lock(&rv_mu);
	for (int h = 1; h < NCOMM; h++)
		if (comm_used[h] && comms[h].ctx >= 0) used |= 1ULL << comms[h].ctx;
	pthread_mutex_unlock(&rv_mu);
	int rc = rvma_allgather(rv_world, &used, sizeof used, all);
	if (rc) {
		free(all);
		return rvfail_comm(c, rc, __func__);
	}
	for (int r = 0; r < rv_size; r++) used |= all[r];
	free(all);
	int ctx = -1;
	for (int i = 1; i < NCTX; i++)
		if (!(used & (1ULL << i))) {
			ctx = i;
			break;
		}
	if (ctx < 0) return fail_comm(c, MPI_ERR_NO_MEM, __func__, "all %d communicator contexts are in use", NCTX - 1);
	pthread_mutex_lock(&rv_mu);
	int h = -1;
	for (int i = 3; i < NCOMM; i++)
		if (!comm_used[i]) {
			h = i;
			break;
		}
	if (h > 0) {
		comm_used[h] = 1;
		comms[h] = comms[c]; /* the handler and the topology */
		comms[h].ctx = ctx;
	}
	pthread_mutex_unlock(&rv_mu);
	if (h < 0) return fail_comm(c, MPI_ERR_NO_MEM, __func__, "no communicator handle left");
	*out = h;
	return MPI_SUCCESS;
}

/* Every communicator here has every rank, so a split can only keep them
 * all: the ranks agree on what they asked first, then whether they can
 * share memory is tried the way MPI_Win_allocate_shared would (a window of
 * one byte), so the answer matches what that call will do. */
int MPI_Comm_split_type(MPI_Comm c, int type, int key, MPI_Info info, MPI_Comm *out) {
	(void)info;
	CHECK_COMM(c, __func__);
	if (!out) return fail_comm(c, MPI_ERR_ARG, __func__, "NULL newcomm");
	int mine[2] = {type, key}, *all = malloc(sizeof mine * (size_t)rv_size);
	if (!all) return fail_comm(c, MPI_ERR_NO_MEM, __func__, "out of memory");
	int rc = rvma_allgather(rv_world, mine, sizeof mine, all);
	if (rc) {
		free(all);
		return rvfail_comm(c, rc, __func__);
	}
	int undefined = 0, why = 0; /* why: 1 mixed, 2 another type, 3 keys out of rank order */
	for (int r = 0; r < rv_size; r++) {
		int t = all[2 * r];
		if (t == MPI_UNDEFINED)
			undefined++;
		else if (t != MPI_COMM_TYPE_SHARED)
			why = 2;
		else if (r > 0 && all[2 * r - 2] == MPI_COMM_TYPE_SHARED && all[2 * r + 1] < all[2 * r - 1])
			why = 3;
	}
	if (!why && undefined && undefined < rv_size) why = 1;
	free(all);
	*out = MPI_COMM_NULL;
	if (why)
		return fail_comm(c, why == 2 ? MPI_ERR_ARG : MPI_ERR_UNSUPPORTED_OPERATION, __func__, "%s",
		                 why == 1   ? "some ranks pass MPI_UNDEFINED: the others' communicator would be smaller, "
		                              "and this library has only communicators of every rank"
		                 : why == 2 ? "a split type other than MPI_COMM_TYPE_SHARED or MPI_UNDEFINED"
		                            : "keys out of rank order: this library cannot reorder ranks");
	if (undefined) return MPI_SUCCESS;
	void *p;
	rvma_win w = RVMA_WIN_NULL;
	rc = rvma_win_allocate_shared(rv_world, 1, 1, &p, &w);
	if (rc == RVMA_ERR_UNSUPPORTED)
		return fail_comm(c, MPI_ERR_UNSUPPORTED_OPERATION, __func__,
		                 "the ranks cannot all share memory (%s), and this library has only communicators of every rank",
		                 rvma_last_error_message());
	if (!rc) rc = rvma_win_free(&w);
	if (rc) return rvfail_comm(c, rc, __func__);
	return MPI_Comm_dup(c, out);
}

int MPI_Comm_free(MPI_Comm *c) {
	if (NOT_INIT(__func__)) return MPI_ERR_OTHER;
	if (!c || *c < 3 || *c >= NCOMM || comm_ctx(*c) < 0)
		return fail_comm(c ? *c : 0, MPI_ERR_COMM, __func__, "not a communicator this program may free");
	pthread_mutex_lock(&rv_mu);
	comm_used[*c] = 0;
	comms[*c].ndims = 0;
	pthread_mutex_unlock(&rv_mu);
	*c = MPI_COMM_NULL;
	return MPI_SUCCESS;
}

/* Every communicator here has every rank, so a split can only keep them
 * all (one colour, keys in rank order: a duplicate) or none (every rank
 * MPI_UNDEFINED: MPI_COMM_NULL); any other split would need a smaller
 * communicator, which this library has not: MPI_ERR_UNSUPPORTED_OPERATION
 * on every rank (they agree on what they asked first). */
int MPI_Comm_split(MPI_Comm c, int color, int key, MPI_Comm *out) {
	CHECK_COMM(c, __func__);
	if (!out) return fail_comm(c, MPI_ERR_ARG, __func__, "NULL newcomm");
	if (color < 0 && color != MPI_UNDEFINED) return fail_comm(c, MPI_ERR_ARG, __func__, "colour %d", color);
	int mine[2] = {color, key}, *all = malloc(sizeof mine * (size_t)rv_size);
	if (!all) return fail_comm(c, MPI_ERR_NO_MEM, __func__, "out of memory");
	int rc = rvma_allgather(rv_world, mine, sizeof mine, all);
	if (rc) {
		free(all);
		return rvfail_comm(c, rc, __func__);
	}
	int undefined = 0, why = 0; /* why: 1 several colours or some undefined, 2 keys out of rank order */
	for (int r = 0; r < rv_size; r++) {
		if (all[2 * r] == MPI_UNDEFINED) undefined++;
		if (r > 0 && all[2 * r] != all[0]) why = 1;
		if (r > 0 && all[2 * r + 1] < all[2 * r - 1]) why = why ? why : 2;
	}
	free(all);
	*out = MPI_COMM_NULL;
	if (undefined == rv_size) return MPI_SUCCESS;
	if (why)
		return fail_comm(c, MPI_ERR_UNSUPPORTED_OPERATION, __func__, "%s",
		                 why == 1 ? "the ranks give different colours (or some MPI_UNDEFINED): the communicators "
		                            "would be smaller, and this library has only communicators of every rank"
		                          : "keys out of rank order: this library cannot reorder ranks");
	int cls = MPI_Comm_dup(c, out);
	if (!cls) {
		pthread_mutex_lock(&rv_mu);
		comms[*out].ndims = 0; /* a split has no topology */
		pthread_mutex_unlock(&rv_mu);
	}
	return cls;
}

/* ---- Memory ------------------------------------------------------------- */

int MPI_Alloc_mem(MPI_Aint size, MPI_Info info, void *baseptr) {
	(void)info;
	if (size < 0) return fail_comm(MPI_COMM_WORLD, MPI_ERR_SIZE, __func__, "size %lld", (long long)size);
	if (!baseptr) return fail_comm(MPI_COMM_WORLD, MPI_ERR_ARG, __func__, "NULL baseptr");
	void *p = NULL;
	if (posix_memalign(&p, 64, (size_t)(size ? size : 1)))
		return fail_comm(MPI_COMM_WORLD, MPI_ERR_NO_MEM, __func__, "%lld bytes: out of memory", (long long)size);
	*(void **)baseptr = p;
	return MPI_SUCCESS;
}

int MPI_Free_mem(void *base) {
	free(base);
	return MPI_SUCCESS;
}

/* ---- Cartesian topologies ---------------------------------------------------
 * Every communicator has the world's ranks, so a grid must hold them all
 * (reorder is ignored: rank r of the grid is world rank r, row-major). */

int MPI_Cart_create(MPI_Comm c, int ndims, const int dims[], const int periods[], int reorder, MPI_Comm *out) {
	(void)reorder;
	CHECK_COMM(c, __func__);
	if (ndims < 0 || ndims > MAX_CART || (ndims > 0 && (!dims || !periods)) || !out)
		return fail_comm(c, MPI_ERR_ARG, __func__, "ndims %d (0..%d) or a NULL argument", ndims, MAX_CART);
	int64_t n = 1;
	for (int d = 0; d < ndims; d++) {
		if (dims[d] < 1) return fail_comm(c, MPI_ERR_DIMS, __func__, "dims[%d] = %d", d, dims[d]);
		n *= dims[d];
	}
	if (n > rv_size) return fail_comm(c, MPI_ERR_DIMS, __func__, "a grid of %lld ranks over %d", (long long)n, rv_size);
	if (n != rv_size)
		return fail_comm(c, MPI_ERR_UNSUPPORTED_OPERATION, __func__,
		                 "a grid of %lld ranks over %d: rvma's communicators hold every rank", (long long)n, rv_size);
	MPI_Comm h;
	int cls = MPI_Comm_dup(c, &h);
	if (cls) return cls;
	pthread_mutex_lock(&rv_mu);
	comms[h].ndims = ndims;
	for (int d = 0; d < ndims; d++) comms[h].dims[d] = dims[d], comms[h].periods[d] = periods[d] != 0;
	pthread_mutex_unlock(&rv_mu);
	*out = h;
	return MPI_SUCCESS;
}

/* c's topology into t (0), or a class. */
static int cart_of(const char *fn, MPI_Comm c, struct comm *t) {
	CHECK_COMM(c, fn);
	pthread_mutex_lock(&rv_mu);
	*t = comms[c];
	pthread_mutex_unlock(&rv_mu);
	if (t->ndims == 0) return fail_comm(c, MPI_ERR_TOPOLOGY, fn, "communicator %d has no Cartesian topology", c);
	return 0;
}

int MPI_Cartdim_get(MPI_Comm c, int *ndims) {
	struct comm t;
	int cls = cart_of(__func__, c, &t);
	if (cls) return cls;
	if (!ndims) return fail_comm(c, MPI_ERR_ARG, __func__, "NULL ndims");
	*ndims = t.ndims;
	return MPI_SUCCESS;
}

int MPI_Cart_get(MPI_Comm c, int maxdims, int dims[], int periods[], int coords[]) {
	struct comm t;
	int cls = cart_of(__func__, c, &t);
	if (cls) return cls;
	if (maxdims < t.ndims || !dims || !periods || !coords)
		return fail_comm(c, MPI_ERR_ARG, __func__, "maxdims %d < %d or a NULL array", maxdims, t.ndims);
	for (int d = 0; d < t.ndims; d++) dims[d] = t.dims[d], periods[d] = t.periods[d];
	return MPI_Cart_coords(c, rv_rank, maxdims, coords);
}

int MPI_Cart_coords(MPI_Comm c, int rank, int maxdims, int coords[]) {
	struct comm t;
	int cls = cart_of(__func__, c, &t);
	if (cls) return cls;
	if (rank < 0 || rank >= rv_size) return fail_comm(c, MPI_ERR_RANK, __func__, "rank %d of %d", rank, rv_size);
	if (maxdims < t.ndims || !coords)
		return fail_comm(c, MPI_ERR_ARG, __func__, "maxdims %d < %d or NULL coords", maxdims, t.ndims);
	for (int d = t.ndims - 1; d >= 0; d--) coords[d] = rank % t.dims[d], rank /= t.dims[d];
	return MPI_SUCCESS;
}

int MPI_Cart_rank(MPI_Comm c, const int coords[], int *rank) {
	struct comm t;
	int cls = cart_of(__func__, c, &t);
	if (cls) return cls;
	if (!coords || !rank) return fail_comm(c, MPI_ERR_ARG, __func__, "NULL coords or rank");
	int r = 0;
	for (int d = 0; d < t.ndims; d++) {
		int x = coords[d];
		if (t.periods[d])
			x = ((x % t.dims[d]) + t.dims[d]) % t.dims[d];
		else if (x < 0 || x >= t.dims[d])
			return fail_comm(c, MPI_ERR_ARG, __func__, "coords[%d] = %d outside 0..%d", d, x, t.dims[d] - 1);
		r = r * t.dims[d] + x;
	}
	*rank = r;
	return MPI_SUCCESS;
}

int MPI_Cart_shift(MPI_Comm c, int dir, int disp, int *src, int *dst) {
	struct comm t;
	int cls = cart_of(__func__, c, &t);
	if (cls) return cls;
	if (dir < 0 || dir >= t.ndims || !src || !dst)
		return fail_comm(c, MPI_ERR_ARG, __func__, "direction %d of %d or a NULL argument", dir, t.ndims);
	int coords[MAX_CART];
	MPI_Cart_coords(c, rv_rank, MAX_CART, coords);
	int me = coords[dir];
	for (int k = 0; k < 2; k++) {
		int x = me + (k ? disp : -disp), *out = k ? dst : src;
		if (t.periods[dir])
			x = ((x % t.dims[dir]) + t.dims[dir]) % t.dims[dir];
		else if (x < 0 || x >= t.dims[dir]) {
			*out = MPI_PROC_NULL;
			continue;
		}
		coords[dir] = x;
		MPI_Cart_rank(c, coords, out);
	}
	return MPI_SUCCESS;
}

int MPI_Topo_test(MPI_Comm c, int *status) {
	if (comm_ctx(c) == -1) return fail_comm(c, MPI_ERR_COMM, __func__, "invalid communicator %d", c);
	if (!status) return fail_comm(c, MPI_ERR_ARG, __func__, "NULL status");
	pthread_mutex_lock(&rv_mu);
	*status = comms[c].ndims ? MPI_CART : MPI_UNDEFINED;
	pthread_mutex_unlock(&rv_mu);
	return MPI_SUCCESS;
}

int MPI_Comm_compare(MPI_Comm a, MPI_Comm b, int *result) {
	if (comm_ctx(a) == -1 || comm_ctx(b) == -1) return fail_comm(a, MPI_ERR_COMM, __func__, "invalid communicator");
	if (!result) return fail_comm(a, MPI_ERR_ARG, __func__, "NULL result");
	int sa = comm_ctx(a) == -2, sb = comm_ctx(b) == -2;
	*result = a == b ? MPI_IDENT : sa != sb ? (rv_size == 1 ? MPI_CONGRUENT : MPI_UNEQUAL) : MPI_CONGRUENT;
	return MPI_SUCCESS;
}

int MPI_Comm_get_attr(MPI_Comm c, int key, void *val, int *flag) {
	static int tag_ub = MPI_TAG_UB_VALUE, host = MPI_PROC_NULL, io = MPI_ANY_SOURCE, global = 0;
	if (comm_ctx(c) == -1) return fail_comm(c, MPI_ERR_COMM, __func__, "invalid communicator %d", c);
	if (!val || !flag) return fail_comm(c, MPI_ERR_ARG, __func__, "NULL argument");
	int *p = key == MPI_TAG_UB ? &tag_ub : key == MPI_HOST ? &host : key == MPI_IO ? &io
	         : key == MPI_WTIME_IS_GLOBAL ? &global : NULL;
	*flag = p != NULL;
	if (p) *(int **)val = p;
	return MPI_SUCCESS;
}

/* ---- Groups ------------------------------------------------------------- */

static struct table groups = {.first = 2};
static struct group empty_group;

struct group *group_get(MPI_Group g) {
	return g == MPI_GROUP_EMPTY ? &empty_group : tbl_get(&groups, g);
}

static int group_new(int n, MPI_Group *out) {
	struct group *g = calloc(1, sizeof *g);
	if (g) g->ranks = malloc(sizeof(int) * (size_t)(n ? n : 1));
	if (!g || !g->ranks) {
		if (g) free(g);
		return -1;
	}
	g->n = n;
	int h = tbl_add(&groups, g);
	if (h < 0) {
		free(g->ranks), free(g);
		return -1;
	}
	*out = h;
	return 0;
}

int MPI_Comm_group(MPI_Comm c, MPI_Group *out) {
	if (NOT_INIT(__func__)) return MPI_ERR_OTHER;
	int x = comm_ctx(c);
	if (x == -1) return fail_comm(c, MPI_ERR_COMM, __func__, "invalid communicator %d", c);
	if (!out) return fail_comm(c, MPI_ERR_ARG, __func__, "NULL group");
	int n = x == -2 ? 1 : rv_size;
	MPI_Group h;
	if (group_new(n, &h)) return fail_comm(c, MPI_ERR_NO_MEM, __func__, "out of memory");
	struct group *g = group_get(h);
	for (int i = 0; i < n; i++) g->ranks[i] = x == -2 ? rv_rank : i;
	*out = h;
	return MPI_SUCCESS;
}

int MPI_Win_get_group(MPI_Win win, MPI_Group *out);

static int group_pick(MPI_Group gh, int n, const int ranks[], MPI_Group *out, int excl, const char *fn) {
	if (NOT_INIT(fn)) return MPI_ERR_OTHER;
	struct group *g = group_get(gh);
	if (!g) return fail_comm(MPI_COMM_WORLD, MPI_ERR_GROUP, fn, "invalid group %d", gh);
	if (n < 0 || (n > 0 && !ranks) || !out) return fail_comm(MPI_COMM_WORLD, MPI_ERR_ARG, fn, "n %d or NULL", n);
	if (n > g->n) return fail_comm(MPI_COMM_WORLD, MPI_ERR_ARG, fn, "%d ranks of a group of %d", n, g->n);
	char *seen = calloc((size_t)g->n + 1, 1);
	if (!seen) return fail_comm(MPI_COMM_WORLD, MPI_ERR_NO_MEM, fn, "out of memory");
	for (int i = 0; i < n; i++) {
		if (ranks[i] < 0 || ranks[i] >= g->n || seen[ranks[i]]) {
			free(seen);
			return fail_comm(MPI_COMM_WORLD, MPI_ERR_RANK, fn, "ranks[%d] = %d: not a distinct rank of a group of %d", i,
			                 ranks[i], g->n);
		}
		seen[ranks[i]] = 1;
	}
	int m = excl ? g->n - n : n;
	MPI_Group h;
	if (group_new(m, &h)) {
		free(seen);
		return fail_comm(MPI_COMM_WORLD, MPI_ERR_NO_MEM, fn, "out of memory");
	}
	struct group *ng = group_get(h);
	if (excl) {
		for (int i = 0, k = 0; i < g->n; i++)
			if (!seen[i]) ng->ranks[k++] = g->ranks[i];
	} else {
		for (int i = 0; i < n; i++) ng->ranks[i] = g->ranks[ranks[i]];
	}
	free(seen);
	*out = h;
	return MPI_SUCCESS;
}

int MPI_Group_incl(MPI_Group g, int n, const int ranks[], MPI_Group *out) {
	return group_pick(g, n, ranks, out, 0, __func__);
}

int MPI_Group_excl(MPI_Group g, int n, const int ranks[], MPI_Group *out) {
	return group_pick(g, n, ranks, out, 1, __func__);
}

int MPI_Group_free(MPI_Group *gh) {
	if (!gh) return fail_comm(MPI_COMM_WORLD, MPI_ERR_ARG, __func__, "NULL group");
	if (*gh == MPI_GROUP_EMPTY) {
		*gh = MPI_GROUP_NULL;
		return MPI_SUCCESS;
	}
	struct group *g = tbl_del(&groups, *gh);
	if (!g) return fail_comm(MPI_COMM_WORLD, MPI_ERR_GROUP, __func__, "invalid group %d", *gh);
	free(g->ranks), free(g);
	*gh = MPI_GROUP_NULL;
	return MPI_SUCCESS;
}

int MPI_Group_size(MPI_Group gh, int *size) {
	struct group *g = group_get(gh);
	if (!g) return fail_comm(MPI_COMM_WORLD, MPI_ERR_GROUP, __func__, "invalid group %d", gh);
	if (!size) return fail_comm(MPI_COMM_WORLD, MPI_ERR_ARG, __func__, "NULL size");
	*size = g->n;
	return MPI_SUCCESS;
}

int MPI_Group_rank(MPI_Group gh, int *rank) {
	struct group *g = group_get(gh);
	if (!g) return fail_comm(MPI_COMM_WORLD, MPI_ERR_GROUP, __func__, "invalid group %d", gh);
	if (!rank) return fail_comm(MPI_COMM_WORLD, MPI_ERR_ARG, __func__, "NULL rank");
	*rank = MPI_UNDEFINED;
	for (int i = 0; i < g->n; i++)
		if (g->ranks[i] == rv_rank) *rank = i;
	return MPI_SUCCESS;
}

int MPI_Group_translate_ranks(MPI_Group g1, int n, const int r1[], MPI_Group g2, int r2[]) {
	struct group *a = group_get(g1), *b = group_get(g2);
	if (!a || !b) return fail_comm(MPI_COMM_WORLD, MPI_ERR_GROUP, __func__, "invalid group");
	if (n < 0 || (n > 0 && (!r1 || !r2))) return fail_comm(MPI_COMM_WORLD, MPI_ERR_ARG, __func__, "bad n or NULL");
	for (int i = 0; i < n; i++)
		if (r1[i] != MPI_PROC_NULL && (r1[i] < 0 || r1[i] >= a->n))
			return fail_comm(MPI_COMM_WORLD, MPI_ERR_RANK, __func__, "ranks1[%d] = %d", i, r1[i]);
	for (int i = 0; i < n; i++) {
		if (r1[i] == MPI_PROC_NULL) {
			r2[i] = MPI_PROC_NULL;
			continue;
		}
		r2[i] = MPI_UNDEFINED;
		for (int j = 0; j < b->n; j++)
			if (b->ranks[j] == a->ranks[r1[i]]) r2[i] = j;
	}
	return MPI_SUCCESS;
}

int MPI_Group_compare(MPI_Group g1, MPI_Group g2, int *result) {
	struct group *a = group_get(g1), *b = group_get(g2);
	if (!a || !b) return fail_comm(MPI_COMM_WORLD, MPI_ERR_GROUP, __func__, "invalid group");
	if (!result) return fail_comm(MPI_COMM_WORLD, MPI_ERR_ARG, __func__, "NULL result");
	if (a->n != b->n) {
		*result = MPI_UNEQUAL;
		return MPI_SUCCESS;
	}
	int same = 1, similar = 1;
	for (int i = 0; i < a->n; i++) {
		if (a->ranks[i] != b->ranks[i]) same = 0;
		int found = 0;
		for (int j = 0; j < b->n; j++) found |= b->ranks[j] == a->ranks[i];
		similar &= found;
	}
	*result = same ? MPI_IDENT : similar ? MPI_SIMILAR : MPI_UNEQUAL;
	return MPI_SUCCESS;
}

/* ---- Info ------------------------------------------------------------------ */

static struct table infos = {.first = 2};

int MPI_Info_create(MPI_Info *info) {
	if (!info) return fail_comm(MPI_COMM_WORLD, MPI_ERR_ARG, __func__, "NULL info");
	int h = tbl_add(&infos, malloc(1));
	if (h < 0) return fail_comm(MPI_COMM_WORLD, MPI_ERR_NO_MEM, __func__, "out of info handles");
	*info = h;
	return MPI_SUCCESS;
}

int MPI_Info_set(MPI_Info info, const char *key, const char *value) {
	if (!tbl_get(&infos, info)) return fail_comm(MPI_COMM_WORLD, MPI_ERR_INFO, __func__, "invalid info %d", info);
	if (!key || !value) return fail_comm(MPI_COMM_WORLD, MPI_ERR_INFO_KEY, __func__, "NULL key or value");
	return MPI_SUCCESS; /* hints: ignored */
}

int MPI_Info_free(MPI_Info *info) {
	void *p = info ? tbl_del(&infos, *info) : NULL;
	if (!p) return fail_comm(MPI_COMM_WORLD, MPI_ERR_INFO, __func__, "invalid info");
	free(p);
	*info = MPI_INFO_NULL;
	return MPI_SUCCESS;
}

/* ---- Datatypes ---------------------------------------------------------- */

enum { K_NONE, K_I8, K_I16, K_I32, K_I64, K_U8, K_U16, K_U32, K_U64, K_F32, K_F64, K_LD, K_BOOL, K_BYTE, K_PAIR, K_PAIR8 };

/* The value-and-index pairs of MINLOC and MAXLOC, as C lays them out. */
struct pair_fi { float v; int i; };
struct pair_di { double v; int i; };
struct pair_li { long v; int i; };
struct pair_2i { int v; int i; };
struct pair_si { short v; int i; };
struct pair_ldi { long double v; int i; };
#define PAIR(T, V, K) {sizeof(V) + sizeof(int), K, sizeof(T), sizeof(V), offsetof(T, i), _Alignof(T)}

/* size: bytes of data; pairs: their extent, value size, index offset and
 * alignment (0 for the others: the size). */
static const struct {
	int64_t size;
	int kind;
	int64_t ext, vsize, ioff, align;
} basics[] = {
    [1] = {1, K_I8},                         /* CHAR */
    [2] = {1, K_I8},                         /* SIGNED_CHAR */
    [3] = {1, K_U8},                         /* UNSIGNED_CHAR */
    [4] = {1, K_BYTE},                       /* BYTE */
    [5] = {2, K_I16},                        /* SHORT */
    [6] = {2, K_U16},                        /* UNSIGNED_SHORT */
    [7] = {4, K_I32},                        /* INT */
    [8] = {4, K_U32},                        /* UNSIGNED */
    [9] = {sizeof(long), sizeof(long) == 8 ? K_I64 : K_I32},
    [10] = {sizeof(long), sizeof(long) == 8 ? K_U64 : K_U32},
    [11] = {8, K_I64},                       /* LONG_LONG */
    [12] = {8, K_U64},                       /* UNSIGNED_LONG_LONG */
    [13] = {4, K_F32},                       /* FLOAT */
    [14] = {8, K_F64},                       /* DOUBLE */
    [15] = {sizeof(long double), K_LD},      /* LONG_DOUBLE */
    [16] = {1, K_I8},  [17] = {2, K_I16}, [18] = {4, K_I32}, [19] = {8, K_I64},
    [20] = {1, K_U8},  [21] = {2, K_U16}, [22] = {4, K_U32}, [23] = {8, K_U64},
    [24] = {sizeof(MPI_Aint), sizeof(MPI_Aint) == 8 ? K_I64 : K_I32}, /* AINT */
    [25] = {8, K_I64},                       /* OFFSET */
    [26] = {8, K_I64},                       /* COUNT */
    [27] = {sizeof(_Bool), K_BOOL},          /* C_BOOL */
    [28] = {sizeof(wchar_t), K_NONE},        /* WCHAR */
    [29] = {1, K_BYTE},                      /* PACKED */
    /* 2INT and FLOAT_INT are 8 bytes without a gap: their accumulates
     * (MPI_REPLACE and MPI_NO_OP; MINLOC and MAXLOC are not rvma's) move
     * each pair as one 8-byte element, as MPI's atomicity needs. */
    [30] = PAIR(struct pair_fi, float, K_PAIR8),   /* FLOAT_INT */
    [31] = PAIR(struct pair_di, double, K_PAIR),   /* DOUBLE_INT */
    [32] = PAIR(struct pair_li, long, K_PAIR),     /* LONG_INT */
    [33] = PAIR(struct pair_2i, int, K_PAIR8),     /* 2INT */
    [34] = PAIR(struct pair_si, short, K_PAIR),    /* SHORT_INT */
    [35] = PAIR(struct pair_ldi, long double, K_PAIR), /* LONG_DOUBLE_INT */
};
enum { NBASIC = 36 };

/* A predefined type's alignment (a struct's extent is padded to it). */
int64_t type_align(MPI_Datatype basic) {
	if (basic <= 0 || basic >= NBASIC) return 1;
	int64_t a = basics[basic].align ? basics[basic].align : basics[basic].size;
	return a > 16 ? 16 : a < 1 ? 1 : a;
}

static struct dtype predef[NBASIC];
static struct blk predef_blk[NBASIC][2];
static struct table types = {.first = NBASIC};

static void init_predef(void) {
	for (int i = 1; i < NBASIC; i++) {
		int64_t s = basics[i].size, e = basics[i].ext ? basics[i].ext : s;
		predef_blk[i][0] = (struct blk){0, s};
		predef[i] = (struct dtype){.predefined = 1, .committed = 1, .basic = i, .size = s, .extent = e, .nblk = 1,
		                           .blk = predef_blk[i], .uniform = 1, .off0 = 0, .lc = 1, .lb = s, .ls = s};
		if (basics[i].ext && basics[i].ioff != basics[i].vsize) { /* a gap between value and index */
			predef_blk[i][0] = (struct blk){0, basics[i].vsize};
			predef_blk[i][1] = (struct blk){basics[i].ioff, (int64_t)sizeof(int)};
			predef[i].nblk = 2, predef[i].uniform = 0;
		}
	}
}

struct dtype *type_get(MPI_Datatype t) {
	if (t > 0 && t < NBASIC) {
		if (!predef[1].size) init_predef();
		return &predef[t];
	}
	return t >= NBASIC ? tbl_get(&types, t) : NULL;
}

int type_rvma(MPI_Datatype basic) {
	if (basic <= 0 || basic >= NBASIC) return 0;
	switch (basics[basic].kind) {
	case K_I8: return RVMA_INT8;
	case K_U8: return RVMA_UINT8;
	case K_I16: return RVMA_INT16;
	case K_U16: return RVMA_UINT16;
	case K_I32: return RVMA_INT32;
	case K_I64: return RVMA_INT64;
	case K_U32: return RVMA_UINT32;
	case K_U64: return RVMA_UINT64;
	case K_F32: return RVMA_FLOAT;
	case K_F64: return RVMA_DOUBLE;
	default: return 0;
	}
}


int type_rvma_bits(MPI_Datatype basic, int bitwise) {
	if (basic <= 0 || basic >= NBASIC) return 0;
	switch (basics[basic].kind) {
	case K_PAIR8:
		return bitwise ? 0 : RVMA_UINT64;
	case K_BYTE:
	case K_BOOL:
	case K_NONE:
		switch (basics[basic].size) {
		case 1: return RVMA_UINT8;
		case 2: return RVMA_UINT16;
		case 4: return RVMA_UINT32;
		case 8: return RVMA_UINT64;
		}
	}
	return 0;
}

int type_check(MPI_Datatype t, int count, struct dtype **out, const char **why) {
	struct dtype *d = type_get(t);
	if (!d) {
		*why = "invalid datatype";
		return MPI_ERR_TYPE;
	}
	if (!d->committed) {
		*why = "datatype not committed";
		return MPI_ERR_TYPE;
	}
	if (count < 0) {
		*why = "negative count";
		return MPI_ERR_COUNT;
	}
	*out = d;
	return 0;
}

int layout_of(const struct dtype *t, int64_t count, rvma_layout *l, int64_t *off0) {
	if (!t->uniform) return 0;
	*off0 = t->off0;
	int64_t c, b, s;
	if (count == 1) {
		c = t->lc, b = t->lb, s = t->ls;
	} else if (t->lc <= 1 || t->lb == t->ls) {
		int64_t run = t->lc * t->lb;
		if (run == t->extent)
			c = 1, b = count * run, s = b;
		else
			c = count, b = run, s = t->extent;
	} else if (t->ls * t->lc == t->extent) {
		c = count * t->lc, b = t->lb, s = t->ls;
	} else {
		return 0;
	}
	if (c <= 1 || b == s) b = c * b, c = 1, s = b;
	/* Blocks that go backwards or overlap (an indexed type's
	 * decreasing displacements, a resized type's short extent) are no
	 * layout of rvma's: the callers walk them block by block. */
	if (c > 1 && s < b) return 0;
	*l = (rvma_layout){c, b, s};
	return 1;
}

int dense(const struct dtype *t, int64_t count) {
	rvma_layout l;
	int64_t off0;
	return count == 0 || t->size == 0 || (layout_of(t, count, &l, &off0) && off0 == 0 && l.count == 1);
}

void walk_init(struct walk *w, const struct dtype *t, int64_t count) {
	*w = (struct walk){.t = t, .count = t->nblk ? count : 0};
}

/* walk_next returns the next run of contiguous bytes, at most max: runs of
 * consecutive blocks and elements that touch are one (a count of a basic
 * type is one run, not one per element). */
int walk_next(struct walk *w, int64_t max, int64_t *off, int64_t *len) {
	if (w->i >= w->count) return 0;
	const struct dtype *t = w->t;
	if (t->nblk == 1 && t->extent > 0 && t->blk[0].off == 0 && t->blk[0].len == t->extent) {
		/* Copies of one gapless block: the rest is one run, taken
		 * whole rather than copy by copy. */
		int64_t at = w->i * t->extent + w->used, left = w->count * t->extent - at;
		int64_t n = left < max ? left : max;
		*off = at, *len = n;
		at += n;
		w->i = at / t->extent, w->used = at % t->extent;
		return 1;
	}
	int64_t start = 0, total = 0;
	int any = 0; /* offsets may be negative: no sentinel */
	while (w->i < w->count && total < max) {
		const struct blk *b = &w->t->blk[w->j];
		int64_t o = w->i * w->t->extent + b->off + w->used;
		if (any && o != start + total) break;
		if (!any) start = o, any = 1;
		int64_t n = b->len - w->used;
		if (n > max - total) n = max - total;
		total += n;
		w->used += n;
		if (w->used == b->len) {
			w->used = 0;
			if (++w->j == w->t->nblk) w->j = 0, w->i++;
		}
	}
	*off = start, *len = total;
	return 1;
}

void pack(const struct dtype *t, int64_t count, const void *from, void *to) {
	struct walk w;
	int64_t off, len, at = 0;
	walk_init(&w, t, count);
	while (walk_next(&w, INT64_MAX, &off, &len)) memcpy((char *)to + at, (const char *)from + off, (size_t)len), at += len;
}

void unpack(const struct dtype *t, int64_t count, const void *from, void *to) {
	struct walk w;
	int64_t off, len, at = 0;
	walk_init(&w, t, count);
	while (walk_next(&w, INT64_MAX, &off, &len)) memcpy((char *)to + off, (const char *)from + at, (size_t)len), at += len;
}

enum { MAX_BLOCKS = 1 << 24 };

/* A new datatype of the n blocks blk (merged where adjacent, owned by it
 * from now on) made of basic, with size bytes of data and extent. */
static int type_finish(const char *fn, struct blk *blk, int64_t n, int basic, int64_t size, int64_t extent,
                       MPI_Datatype *out) {
	struct dtype *t = calloc(1, sizeof *t);
	if (!t) {
		free(blk);
		return fail_comm(MPI_COMM_WORLD, MPI_ERR_NO_MEM, fn, "out of memory");
	}
	t->blk = blk, t->nblk = n;
	t->basic = basic;
	t->size = size;
	t->extent = extent;
	t->uniform = 1;
	if (n == 0) {
		t->lc = 0, t->lb = 0, t->ls = 0;
	} else {
		t->off0 = blk[0].off, t->lc = n, t->lb = blk[0].len, t->ls = n > 1 ? blk[1].off - blk[0].off : blk[0].len;
		for (int64_t i = 1; i < n; i++)
			if (blk[i].len != t->lb || blk[i].off - blk[i - 1].off != t->ls) t->uniform = 0;
		if (n > 1 && t->ls < t->lb) t->uniform = 0; /* backwards, or overlapping */
	}
	int h = tbl_add(&types, t);
	if (h < 0) {
		free(blk), free(t);
		return fail_comm(MPI_COMM_WORLD, MPI_ERR_NO_MEM, fn, "out of datatype handles");
	}
	*out = h;
	return MPI_SUCCESS;
}

/* Appends old's blocks at byte offset off to blk[*n], merging adjacent
 * ones. */
static void blk_append(struct blk *blk, int64_t *n, const struct dtype *old, int64_t off) {
	for (int64_t j = 0; j < old->nblk; j++) {
		int64_t o = off + old->blk[j].off, len = old->blk[j].len;
		if (*n > 0 && blk[*n - 1].off + blk[*n - 1].len == o)
			blk[*n - 1].len += len;
		else
			blk[(*n)++] = (struct blk){o, len};
	}
}

/* count blocks of blocklen copies of old, stride bytes apart. */
static int type_make(const char *fn, int64_t count, int64_t blocklen, int64_t stride, MPI_Datatype oldh,
                     MPI_Datatype *out) {
	if (NOT_INIT(fn)) return MPI_ERR_OTHER;
	struct dtype *old = type_get(oldh);
	if (!old) return fail_comm(MPI_COMM_WORLD, MPI_ERR_TYPE, fn, "invalid old datatype %d", oldh);
	if (count < 0 || blocklen < 0)
		return fail_comm(MPI_COMM_WORLD, MPI_ERR_COUNT, fn, "count %lld, blocklength %lld", (long long)count,
		                 (long long)blocklen);
	if (!out) return fail_comm(MPI_COMM_WORLD, MPI_ERR_ARG, fn, "NULL newtype");
	if (count && blocklen && old->nblk > MAX_BLOCKS / count / blocklen)
		return fail_comm(MPI_COMM_WORLD, MPI_ERR_TYPE, fn, "more than %d blocks", MAX_BLOCKS);
	int64_t nmax = count * blocklen * old->nblk;
	struct blk *blk = malloc(sizeof *blk * (size_t)(nmax ? nmax : 1));
	if (!blk) return fail_comm(MPI_COMM_WORLD, MPI_ERR_NO_MEM, fn, "out of memory");
	int64_t n = 0;
	for (int64_t i = 0; i < count; i++)
		for (int64_t k = 0; k < blocklen; k++) blk_append(blk, &n, old, i * stride + k * old->extent);
	/* MPI's bounds: of the first and the last block (a negative stride
	 * puts the last first; such blocks are walked, not a layout). */
	int64_t lb = 0, ub = 0;
	if (count && blocklen) {
		int64_t l0 = old->tlb, ln = (count - 1) * stride + old->tlb, len = blocklen * old->extent;
		lb = l0 < ln ? l0 : ln;
		ub = (l0 > ln ? l0 : ln) + len;
	}
	MPI_Datatype h;
	int cls = type_finish(fn, blk, n, old->basic, count * blocklen * old->size, ub - lb, &h);
	if (cls) return cls;
	type_get(h)->tlb = lb;
	*out = h;
	return MPI_SUCCESS;
}

enum { MAX_DIMS = 16 };

int MPI_Type_create_subarray(int ndims, const int sizes[], const int subsizes[], const int starts[], int order,
                             MPI_Datatype oldh, MPI_Datatype *out) {
	const char *fn = __func__;
	if (NOT_INIT(fn)) return MPI_ERR_OTHER;
	struct dtype *old = type_get(oldh);
	if (!old) return fail_comm(MPI_COMM_WORLD, MPI_ERR_TYPE, fn, "invalid old datatype %d", oldh);
	if (ndims < 1 || ndims > MAX_DIMS || !sizes || !subsizes || !starts || !out)
		return fail_comm(MPI_COMM_WORLD, MPI_ERR_ARG, fn, "ndims %d (1..%d) or a NULL array", ndims, MAX_DIMS);
	if (order != MPI_ORDER_C && order != MPI_ORDER_FORTRAN)
		return fail_comm(MPI_COMM_WORLD, MPI_ERR_ARG, fn, "order %d", order);
	int64_t stride[MAX_DIMS], elems = 1, total = 1;
	for (int d = 0; d < ndims; d++) {
		if (sizes[d] < 1 || subsizes[d] < 1 || subsizes[d] > sizes[d] || starts[d] < 0 ||
		    starts[d] > sizes[d] - subsizes[d])
			return fail_comm(MPI_COMM_WORLD, MPI_ERR_ARG, fn, "dimension %d: size %d, subsize %d, start %d", d,
			                 sizes[d], subsizes[d], starts[d]);
		elems *= subsizes[d], total *= sizes[d];
		if (elems > MAX_BLOCKS || total > INT64_MAX / 16 / (old->extent ? old->extent : 1))
			return fail_comm(MPI_COMM_WORLD, MPI_ERR_TYPE, fn, "more than %d elements", MAX_BLOCKS);
	}
	if (old->nblk > MAX_BLOCKS / elems) return fail_comm(MPI_COMM_WORLD, MPI_ERR_TYPE, fn, "more than %d blocks", MAX_BLOCKS);
	/* stride[d]: elements of old between neighbours along d. */
	for (int k = 0; k < ndims; k++) {
		int d = order == MPI_ORDER_C ? ndims - 1 - k : k;
		int prev = order == MPI_ORDER_C ? d + 1 : d - 1;
		stride[d] = k == 0 ? 1 : stride[prev] * sizes[prev];
	}
	struct blk *blk = malloc(sizeof *blk * (size_t)(elems * old->nblk));
	if (!blk) return fail_comm(MPI_COMM_WORLD, MPI_ERR_NO_MEM, fn, "out of memory");
	int idx[MAX_DIMS] = {0};
	int64_t n = 0;
	for (int64_t e = 0; e < elems; e++) {
		int64_t off = 0;
		for (int d = 0; d < ndims; d++) off += (int64_t)(starts[d] + idx[d]) * stride[d];
		blk_append(blk, &n, old, off * old->extent);
		/* the next index, fastest dimension first */
		for (int k = 0; k < ndims; k++) {
			int d = order == MPI_ORDER_C ? ndims - 1 - k : k;
			if (++idx[d] < subsizes[d]) break;
			idx[d] = 0;
		}
	}
	return type_finish(fn, blk, n, old->basic, elems * old->size, total * old->extent, out);
}

/* A type of n blocks: block i is len[i] copies of types[i] (all old when
 * types is NULL) at byte displacement disp[i], in this order (the type
 * map's order, which accumulates follow). Bounds as MPI says: lb the
 * lowest, ub the highest of the blocks' bounds (none: 0 and 0); struct
 * pads the extent to the alignment of its most aligned element. */
static int type_blocks(const char *fn, int64_t n, const int64_t *len, const int64_t *disp, const MPI_Datatype *types,
                       MPI_Datatype old, int is_struct, MPI_Datatype *out) {
	if (NOT_INIT(fn)) return MPI_ERR_OTHER;
	if (n < 0) return fail_comm(MPI_COMM_WORLD, MPI_ERR_COUNT, fn, "count %lld", (long long)n);
	if (!out || (n > 0 && (!len || !disp))) return fail_comm(MPI_COMM_WORLD, MPI_ERR_ARG, fn, "NULL argument");
	int64_t nmax = 0, size = 0, lb = 0, ub = 0, align = 1;
	int basic = -1, any = 0;
	for (int64_t i = 0; i < n; i++) {
		MPI_Datatype th = types ? types[i] : old;
		struct dtype *o = type_get(th);
		if (!o) return fail_comm(MPI_COMM_WORLD, MPI_ERR_TYPE, fn, "invalid datatype %d (block %lld)", th, (long long)i);
		if (len[i] < 0)
			return fail_comm(MPI_COMM_WORLD, MPI_ERR_COUNT, fn, "block %lld: length %lld", (long long)i, (long long)len[i]);
		if (len[i] && o->nblk > (MAX_BLOCKS - nmax) / len[i])
			return fail_comm(MPI_COMM_WORLD, MPI_ERR_TYPE, fn, "more than %d blocks", MAX_BLOCKS);
		nmax += len[i] * o->nblk;
		size += len[i] * o->size;
		if (basic == -1)
			basic = o->basic;
		else if (basic != o->basic)
			basic = 0;
		if (o->basic && type_align(o->basic) > align) align = type_align(o->basic);
		if (len[i] == 0) continue;
		int64_t l = disp[i] + o->tlb, u = disp[i] + o->tlb + len[i] * o->extent;
		if (!any || l < lb) lb = l;
		if (!any || u > ub) ub = u;
		any = 1;
	}
	if (basic < 0) basic = 0;
	struct blk *blk = malloc(sizeof *blk * (size_t)(nmax ? nmax : 1));
	if (!blk) return fail_comm(MPI_COMM_WORLD, MPI_ERR_NO_MEM, fn, "out of memory");
	int64_t k = 0;
	for (int64_t i = 0; i < n; i++) {
		struct dtype *o = type_get(types ? types[i] : old);
		for (int64_t j = 0; j < len[i]; j++) blk_append(blk, &k, o, disp[i] + j * o->extent);
	}
	int64_t extent = ub - lb;
	if (is_struct && extent % align) extent += align - extent % align;
	MPI_Datatype h;
	int cls = type_finish(fn, blk, k, basic, size, extent, &h);
	if (cls) return cls;
	type_get(h)->tlb = lb;
	*out = h;
	return MPI_SUCCESS;
}

/* The int arrays of the indexed constructors as int64_t, displacements
 * scaled by unit bytes (NULL len: every block blocklen long). */
static int blocks_of(const char *fn, int n, const int *len, int blocklen, const void *disp, int aint, int64_t unit,
                     int64_t **l, int64_t **d) {
	*l = malloc(sizeof(int64_t) * (size_t)(n > 0 ? n : 1));
	*d = malloc(sizeof(int64_t) * (size_t)(n > 0 ? n : 1));
	if (!*l || !*d) {
		free(*l), free(*d);
		return fail_comm(MPI_COMM_WORLD, MPI_ERR_NO_MEM, fn, "out of memory");
	}
	for (int i = 0; i < n; i++) {
		(*l)[i] = len ? len[i] : blocklen;
		(*d)[i] = (aint ? (int64_t)((const MPI_Aint *)disp)[i] : (int64_t)((const int *)disp)[i]) * unit;
	}
	return 0;
}

static int indexed(const char *fn, int n, const int *len, int blocklen, const void *disp, int aint, int bytes,
                   MPI_Datatype old, MPI_Datatype *out) {
	if (NOT_INIT(fn)) return MPI_ERR_OTHER;
	struct dtype *o = type_get(old);
	if (!o) return fail_comm(MPI_COMM_WORLD, MPI_ERR_TYPE, fn, "invalid old datatype %d", old);
	if (n < 0 || blocklen < 0) return fail_comm(MPI_COMM_WORLD, MPI_ERR_COUNT, fn, "count %d, blocklength %d", n, blocklen);
	if (n > 0 && !disp) return fail_comm(MPI_COMM_WORLD, MPI_ERR_ARG, fn, "NULL displacements");
	int64_t *l, *d;
	int cls = blocks_of(fn, n, len, blocklen, disp, aint, bytes ? 1 : o->extent, &l, &d);
	if (cls) return cls;
	cls = type_blocks(fn, n, l, d, NULL, old, 0, out);
	free(l), free(d);
	return cls;
}

int MPI_Type_indexed(int count, const int blocklengths[], const int displacements[], MPI_Datatype old,
                     MPI_Datatype *out) {
	if (count > 0 && !blocklengths) return fail_comm(MPI_COMM_WORLD, MPI_ERR_ARG, __func__, "NULL blocklengths");
	return indexed(__func__, count, blocklengths, 0, displacements, 0, 0, old, out);
}

int MPI_Type_create_hindexed(int count, const int blocklengths[], const MPI_Aint displacements[], MPI_Datatype old,
                             MPI_Datatype *out) {
	if (count > 0 && !blocklengths) return fail_comm(MPI_COMM_WORLD, MPI_ERR_ARG, __func__, "NULL blocklengths");
	return indexed(__func__, count, blocklengths, 0, displacements, 1, 1, old, out);
}

int MPI_Type_create_indexed_block(int count, int blocklength, const int displacements[], MPI_Datatype old,
                                  MPI_Datatype *out) {
	return indexed(__func__, count, NULL, blocklength, displacements, 0, 0, old, out);
}

int MPI_Type_create_hindexed_block(int count, int blocklength, const MPI_Aint displacements[], MPI_Datatype old,
                                   MPI_Datatype *out) {
	return indexed(__func__, count, NULL, blocklength, displacements, 1, 1, old, out);
}

int MPI_Type_create_struct(int count, const int blocklengths[], const MPI_Aint displacements[],
                           const MPI_Datatype types[], MPI_Datatype *out) {
	if (count > 0 && (!blocklengths || !displacements || !types))
		return fail_comm(MPI_COMM_WORLD, MPI_ERR_ARG, __func__, "NULL array");
	int64_t *l, *d;
	int cls = blocks_of(__func__, count, blocklengths, 0, displacements, 1, 1, &l, &d);
	if (cls) return cls;
	cls = type_blocks(__func__, count, l, d, types, MPI_DATATYPE_NULL, 1, out);
	free(l), free(d);
	return cls;
}

/* The same blocks with new bounds. */
int MPI_Type_create_resized(MPI_Datatype old, MPI_Aint lb, MPI_Aint extent, MPI_Datatype *out) {
	if (NOT_INIT(__func__)) return MPI_ERR_OTHER;
	struct dtype *o = type_get(old);
	if (!o) return fail_comm(MPI_COMM_WORLD, MPI_ERR_TYPE, __func__, "invalid old datatype %d", old);
	if (!out) return fail_comm(MPI_COMM_WORLD, MPI_ERR_ARG, __func__, "NULL newtype");
	if (extent < 0)
		return fail_comm(MPI_COMM_WORLD, MPI_ERR_UNSUPPORTED_OPERATION, __func__, "negative extent %lld",
		                 (long long)extent);
	struct blk *blk = malloc(sizeof *blk * (size_t)(o->nblk ? o->nblk : 1));
	if (!blk) return fail_comm(MPI_COMM_WORLD, MPI_ERR_NO_MEM, __func__, "out of memory");
	int64_t n = 0;
	blk_append(blk, &n, o, 0);
	MPI_Datatype h;
	int cls = type_finish(__func__, blk, n, o->basic, o->size, extent, &h);
	if (cls) return cls;
	type_get(h)->tlb = lb;
	*out = h;
	return MPI_SUCCESS;
}

/* A copy of the same blocks and bounds, committed if old is. */
int MPI_Type_dup(MPI_Datatype old, MPI_Datatype *out) {
	if (NOT_INIT(__func__)) return MPI_ERR_OTHER;
	struct dtype *o = type_get(old);
	if (!o) return fail_comm(MPI_COMM_WORLD, MPI_ERR_TYPE, __func__, "invalid datatype %d", old);
	if (!out) return fail_comm(MPI_COMM_WORLD, MPI_ERR_ARG, __func__, "NULL newtype");
	struct blk *blk = malloc(sizeof *blk * (size_t)(o->nblk ? o->nblk : 1));
	if (!blk) return fail_comm(MPI_COMM_WORLD, MPI_ERR_NO_MEM, __func__, "out of memory");
	memcpy(blk, o->blk, sizeof *blk * (size_t)o->nblk);
	MPI_Datatype h;
	int cls = type_finish(__func__, blk, o->nblk, o->basic, o->size, o->extent, &h);
	if (cls) return cls;
	struct dtype *d = type_get(h);
	d->tlb = o->tlb, d->committed = o->committed;
	*out = h;
	return MPI_SUCCESS;
}

int MPI_Type_get_true_extent(MPI_Datatype t, MPI_Aint *lb, MPI_Aint *extent) {
	struct dtype *d = type_get(t);
	if (!d) return fail_comm(MPI_COMM_WORLD, MPI_ERR_TYPE, __func__, "invalid datatype %d", t);
	if (!lb || !extent) return fail_comm(MPI_COMM_WORLD, MPI_ERR_ARG, __func__, "NULL argument");
	int64_t l = 0, u = 0;
	for (int64_t i = 0; i < d->nblk; i++) {
		if (i == 0 || d->blk[i].off < l) l = d->blk[i].off;
		if (i == 0 || d->blk[i].off + d->blk[i].len > u) u = d->blk[i].off + d->blk[i].len;
	}
	*lb = (MPI_Aint)l, *extent = (MPI_Aint)(u - l);
	return MPI_SUCCESS;
}

int MPI_Type_contiguous(int count, MPI_Datatype old, MPI_Datatype *out) {
	return type_make(__func__, 1, count, 0, old, out);
}

int MPI_Type_vector(int count, int blocklength, int stride, MPI_Datatype old, MPI_Datatype *out) {
	struct dtype *o = type_get(old);
	return type_make(__func__, count, blocklength, o ? (int64_t)stride * o->extent : 0, old, out);
}

int MPI_Type_create_hvector(int count, int blocklength, MPI_Aint stride, MPI_Datatype old, MPI_Datatype *out) {
	return type_make(__func__, count, blocklength, stride, old, out);
}

int MPI_Type_commit(MPI_Datatype *t) {
	struct dtype *d = t ? type_get(*t) : NULL;
	if (!d) return fail_comm(MPI_COMM_WORLD, MPI_ERR_TYPE, __func__, "invalid datatype");
	d->committed = 1;
	return MPI_SUCCESS;
}

int MPI_Type_free(MPI_Datatype *t) {
	if (!t) return fail_comm(MPI_COMM_WORLD, MPI_ERR_ARG, __func__, "NULL datatype");
	if (*t > 0 && *t < NBASIC)
		return fail_comm(MPI_COMM_WORLD, MPI_ERR_TYPE, __func__, "a predefined datatype cannot be freed");
	struct dtype *d = *t >= NBASIC ? tbl_del(&types, *t) : NULL;
	if (!d) return fail_comm(MPI_COMM_WORLD, MPI_ERR_TYPE, __func__, "invalid datatype %d", *t);
	free(d->blk), free(d);
	*t = MPI_DATATYPE_NULL;
	return MPI_SUCCESS;
}

int MPI_Type_size(MPI_Datatype t, int *size) {
	struct dtype *d = type_get(t);
	if (!d) return fail_comm(MPI_COMM_WORLD, MPI_ERR_TYPE, __func__, "invalid datatype %d", t);
	if (!size) return fail_comm(MPI_COMM_WORLD, MPI_ERR_ARG, __func__, "NULL size");
	*size = d->size > INT32_MAX ? MPI_UNDEFINED : (int)d->size;
	return MPI_SUCCESS;
}

int MPI_Type_get_extent(MPI_Datatype t, MPI_Aint *lb, MPI_Aint *extent) {
	struct dtype *d = type_get(t);
	if (!d) return fail_comm(MPI_COMM_WORLD, MPI_ERR_TYPE, __func__, "invalid datatype %d", t);
	if (!lb || !extent) return fail_comm(MPI_COMM_WORLD, MPI_ERR_ARG, __func__, "NULL argument");
	*lb = (MPI_Aint)d->tlb, *extent = (MPI_Aint)d->extent;
	return MPI_SUCCESS;
}

int MPI_Get_count(const MPI_Status *st, MPI_Datatype t, int *count) {
	struct dtype *d = type_get(t);
	if (!d) return fail_comm(MPI_COMM_WORLD, MPI_ERR_TYPE, __func__, "invalid datatype %d", t);
	if (!st || !count) return fail_comm(MPI_COMM_WORLD, MPI_ERR_ARG, __func__, "NULL argument");
	if (d->size == 0)
		*count = st->rvma_bytes == 0 ? 0 : MPI_UNDEFINED;
	else
		*count = st->rvma_bytes % d->size ? MPI_UNDEFINED : (int)(st->rvma_bytes / d->size);
	return MPI_SUCCESS;
}

/* ---- Requests -------------------------------------------------------------
 *
 * A receive (MPI_Irecv, and MPI_Recv through it) joins the list of pending
 * receives in posting order. Receives make progress in passes: one pass
 * (recv_pass) offers each pending receive, in posting order, the
 * earliest-arrived message that matches it among those that had arrived
 * when the pass began (rvma_try_recv_match with a snapshot), so that a
 * message goes to the first posted receive that matches it and a receive
 * takes the first message that matches it, as MPI requires, also with
 * MPI_ANY_SOURCE and MPI_ANY_TAG. A wait for a receive that is first in the
 * list blocks in rvma_recv_match (no earlier receive can want its
 * message); otherwise it alternates passes with rvma_msg_wait for the next
 * arrival. MPI_Test and the other tests run one pass. */

static struct table reqs = {.first = 1};
/* The pending receives in posting order (recv_mu; taken without rv_mu
 * and held across non-blocking librvma calls only). */
static pthread_mutex_t recv_mu = PTHREAD_MUTEX_INITIALIZER;
static struct req *pending;

struct req *req_new(int kind, MPI_Request *h) {
	struct req *q = calloc(1, sizeof *q);
	if (!q) return NULL;
	q->kind = kind;
	int x = tbl_add(&reqs, q);
	if (x < 0) {
		free(q);
		return NULL;
	}
	*h = x;
	return q;
}

int req_push(struct req *q, rvma_request r) {
	if (r == RVMA_REQUEST_NULL) return 0;
	if (q->n == q->cap) {
		int cap = q->cap ? 2 * q->cap : 4;
		rvma_request *v = realloc(q->r, sizeof *v * (size_t)cap);
		if (!v) return -1;
		q->r = v, q->cap = cap;
	}
	q->r[q->n++] = r;
	return 0;
}

void req_drop(MPI_Request h) {
	struct req *q = tbl_del(&reqs, h);
	if (q) free(q->r), free(q->tmp), free(q);
}

static void set_status(MPI_Status *st, int src, int tag, int err, long long bytes) {
	if (!st) return;
	st->MPI_SOURCE = src, st->MPI_TAG = tag, st->MPI_ERROR = err, st->rvma_bytes = bytes, st->rvma_cancelled = 0;
}

/* The end of receive q, with rvma's code rc, the message's length, source
 * and rvma tag: q leaves the list (recv_mu held) and becomes REQ_DONE. */
static void recv_done(struct req *q, int rc, size_t len, int src, int mtag) {
	int err = MPI_SUCCESS;
	if (rc) {
		err = rv_class(rc, MPI_ERR_COMM);
		snprintf(q->msg, sizeof q->msg, "%s: %.300s (%s)", rc == RVMA_ERR_TRUNCATE ? "message truncated" : "receive",
		         rvma_last_error_message(), rvma_strerror(rc));
	}
	if (q->tmp && (rc == RVMA_SUCCESS || rc == RVMA_ERR_TRUNCATE))
		unpack(q->d, q->count, q->tmp, q->buf); /* a truncated message: the part that fits */
	for (struct req **p = &pending; *p; p = &(*p)->next)
		if (*p == q) {
			*p = q->next;
			break;
		}
	size_t cap = (size_t)(q->d->size * q->count);
	set_status(&q->st, src, mtag & MPI_TAG_UB_VALUE, err, (long long)(len < cap ? len : cap));
	q->err = err;
	q->kind = REQ_DONE;
}

/* The end of receive q by MPI_Cancel (recv_mu held): it leaves the list
 * and is done, cancelled, having taken nothing. */
static void recv_cancelled(struct req *q) {
	for (struct req **p = &pending; *p; p = &(*p)->next)
		if (*p == q) {
			*p = q->next;
			break;
		}
	set_status(&q->st, q->src == RVMA_ANY_SOURCE ? MPI_ANY_SOURCE : q->src, q->tag, MPI_SUCCESS, 0);
	q->st.rvma_cancelled = 1;
	q->err = MPI_SUCCESS;
	q->kind = REQ_DONE;
}

/* Offers each pending receive, in posting order, the messages that
 * arrived before snapshot at (see above); recv_mu held. */
static void recv_pass_at(uint64_t at) {
	for (struct req *q = pending, *next; q; q = next) {
		next = q->next;
		if (q->active) continue;
		size_t len = 0;
		int src = -1, mtag = 0, flag = 0;
		int r = rvma_try_recv_match(rv_world, q->src, q->rtag, q->mask, at, q->tmp ? q->tmp : q->buf,
		                            (size_t)(q->d->size * q->count), &len, &src, &mtag, &flag);
		if (r || flag) recv_done(q, r, len, src, mtag);
	}
}

/* recv_pass_at with the current snapshot. Returns rvma's code of a
 * failed snapshot (0 otherwise). */
static int recv_pass(void) {
	pthread_mutex_lock(&recv_mu);
	uint64_t at;
	int rc = pending ? rvma_msg_arrived(rv_world, &at) : RVMA_SUCCESS;
	if (!rc && pending) recv_pass_at(at);
	pthread_mutex_unlock(&recv_mu);
	return rc;
}

/* Keys of the waits MPI_Cancel can end (recv_mu): each names one wait,
 * never reused. */
static uint64_t wait_keys;

/* The key for the next blocking wait for q (recv_mu held): under
 * MPI_THREAD_MULTIPLE only, since otherwise no other thread can call
 * MPI_Cancel while it waits, and the plain waits cost less. */
static uint64_t wait_key(struct req *q) {
	q->key = rv_thread == MPI_THREAD_MULTIPLE ? ++wait_keys : 0;
	return q->key;
}

/* Waits until receive q is done. */
static void recv_wait(struct req *q) {
	for (;;) {
		pthread_mutex_lock(&recv_mu);
		int first = q->kind == REQ_RECV && pending == q;
		if (first) q->active = 1; /* the passes leave it alone */
		uint64_t key = q->kind == REQ_RECV ? wait_key(q) : 0;
		pthread_mutex_unlock(&recv_mu);
		if (first) {
			size_t len = 0;
			int src = -1, mtag = 0;
			void *to = q->tmp ? q->tmp : q->buf;
			size_t cap = (size_t)(q->d->size * q->count);
			int rc = key ? rvma_recv_match_key(rv_world, q->src, q->rtag, q->mask, to, cap, &len, &src, &mtag, key)
			             : rvma_recv_match(rv_world, q->src, q->rtag, q->mask, to, cap, &len, &src, &mtag);
			pthread_mutex_lock(&recv_mu);
			q->key = 0, q->active = 0;
			if (rc == RVMA_ERR_CANCELLED)
				recv_cancelled(q);
			else
				recv_done(q, rc, len, src, mtag);
			pthread_mutex_unlock(&recv_mu);
			return;
		}
		uint64_t at = 0;
		int rc = rvma_msg_arrived(rv_world, &at);
		if (!rc) rc = recv_pass();
		if (q->kind != REQ_RECV) return;
		if (!rc) rc = key ? rvma_msg_wait_key(rv_world, at, key) : rvma_msg_wait(rv_world, at);
		pthread_mutex_lock(&recv_mu);
		if (q->kind == REQ_RECV) q->key = 0;
		/* cancelled: MPI_Cancel has ended q (REQ_DONE) */
		if (rc && rc != RVMA_ERR_CANCELLED && q->kind == REQ_RECV) recv_done(q, rc, 0, q->src, q->rtag);
		int done = q->kind != REQ_RECV;
		pthread_mutex_unlock(&recv_mu);
		if (done || rc) return;
	}
}

static int p2p_args(const char *fn, MPI_Comm c, int count, MPI_Datatype t, int peer, int tag, int recv,
                    struct dtype **d, int *rtag) {
	CHECK_COMM(c, fn);
	const char *why;
	int cls = type_check(t, count, d, &why);
	if (cls) return fail_comm(c, cls, fn, "%s (%d)", why, (int)t);
	if (peer != MPI_PROC_NULL && !(recv && peer == MPI_ANY_SOURCE) && (peer < 0 || peer >= rv_size))
		return fail_comm(c, MPI_ERR_RANK, fn, "rank %d not in a communicator of %d", peer, rv_size);
	if (!(recv && tag == MPI_ANY_TAG) && (tag < 0 || tag > MPI_TAG_UB_VALUE))
		return fail_comm(c, MPI_ERR_TAG, fn, "tag %d outside 0..%d", tag, MPI_TAG_UB_VALUE);
	*rtag = (tag == MPI_ANY_TAG ? 0 : tag) | comm_ctx(c) << 24;
	return 0;
}

static int send_msg(const char *fn, const void *buf, int count, MPI_Datatype t, int dest, int tag, MPI_Comm c,
                    rvma_request *rq) {
	struct dtype *d;
	int rtag, cls = p2p_args(fn, c, count, t, dest, tag, 0, &d, &rtag);
	if (cls) return cls;
	if (dest == MPI_PROC_NULL) return MPI_SUCCESS;
	int64_t bytes = d->size * count;
	if (!buf && bytes > 0 && d->predefined) return fail_comm(c, MPI_ERR_BUFFER, fn, "NULL buffer");
	const void *from = buf;
	void *tmp = NULL;
	if (!dense(d, count)) {
		if (!(tmp = malloc((size_t)bytes))) return fail_comm(c, MPI_ERR_NO_MEM, fn, "out of memory");
		pack(d, count, buf, tmp);
		from = tmp;
	}
	int rc = rq ? rvma_isend(rv_world, dest, rtag, from, (size_t)bytes, rq)
	            : rvma_send(rv_world, dest, rtag, from, (size_t)bytes);
	free(tmp);
	return rc ? rvfail_comm(c, rc, fn) : MPI_SUCCESS;
}

int MPI_Send(const void *buf, int count, MPI_Datatype t, int dest, int tag, MPI_Comm c) {
	return send_msg(__func__, buf, count, t, dest, tag, c, NULL);
}

int MPI_Isend(const void *buf, int count, MPI_Datatype t, int dest, int tag, MPI_Comm c, MPI_Request *request) {
	if (!request) return fail_comm(c, MPI_ERR_ARG, __func__, "NULL request");
	rvma_request r = RVMA_REQUEST_NULL;
	int cls = send_msg(__func__, buf, count, t, dest, tag, c, &r);
	if (cls) return cls;
	struct req *q = req_new(REQ_RVMA, request);
	if (!q || req_push(q, r)) {
		rvma_request_wait(&r);
		if (q) req_drop(*request);
		return fail_comm(c, MPI_ERR_NO_MEM, __func__, "out of request handles");
	}
	set_status(&q->st, MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_SUCCESS, 0);
	return MPI_SUCCESS;
}

int MPI_Irecv(void *buf, int count, MPI_Datatype t, int src, int tag, MPI_Comm c, MPI_Request *request) {
	struct dtype *d;
	int rtag, cls = p2p_args(__func__, c, count, t, src, tag, 1, &d, &rtag);
	if (cls) return cls;
	if (!request) return fail_comm(c, MPI_ERR_ARG, __func__, "NULL request");
	if (!buf && count > 0 && d->size > 0 && d->predefined) return fail_comm(c, MPI_ERR_BUFFER, __func__, "NULL buffer");
	struct req *q = req_new(src == MPI_PROC_NULL ? REQ_DONE : REQ_RECV, request);
	if (!q) return fail_comm(c, MPI_ERR_NO_MEM, __func__, "out of request handles");
	q->src = src == MPI_ANY_SOURCE ? RVMA_ANY_SOURCE : src;
	q->comm = c, q->tag = tag, q->rtag = rtag;
	q->mask = tag == MPI_ANY_TAG ? (int)0xff000000u : -1;
	q->buf = buf, q->count = count, q->type = t, q->d = d;
	set_status(&q->st, MPI_PROC_NULL, MPI_ANY_TAG, MPI_SUCCESS, 0);
	if (src == MPI_PROC_NULL) return MPI_SUCCESS;
	if (!dense(d, count) && !(q->tmp = malloc((size_t)(d->size * count)))) {
		req_drop(*request);
		*request = MPI_REQUEST_NULL;
		return fail_comm(c, MPI_ERR_NO_MEM, __func__, "out of memory");
	}
	pthread_mutex_lock(&recv_mu);
	struct req **p = &pending;
	while (*p) p = &(*p)->next;
	*p = q;
	pthread_mutex_unlock(&recv_mu);
	return MPI_SUCCESS;
}

static struct req *req_of(MPI_Request h, int *bad);

/* Probes for a message from src with tag (MPI_Iprobe; MPI_Probe with
 * block): the pending receives take what they match first, in one pass
 * over one snapshot, and the probe sees the rest of that snapshot, so that
 * it reports the message a receive posted next would take. */
static int probe(const char *fn, int src, int tag, MPI_Comm c, int block, int *flag, MPI_Status *st) {
	struct dtype *d;
	int rtag, cls = p2p_args(fn, c, 0, MPI_BYTE, src, tag, 1, &d, &rtag);
	if (cls) return cls;
	if (!block && !flag) return fail_comm(c, MPI_ERR_ARG, fn, "NULL flag");
	if (src == MPI_PROC_NULL) {
		set_status(st, MPI_PROC_NULL, MPI_ANY_TAG, MPI_SUCCESS, 0);
		if (flag) *flag = 1;
		return MPI_SUCCESS;
	}
	int rsrc = src == MPI_ANY_SOURCE ? RVMA_ANY_SOURCE : src;
	int mask = tag == MPI_ANY_TAG ? (int)0xff000000u : -1;
	for (;;) {
		uint64_t at;
		size_t len = 0;
		int from = -1, mtag = 0, found = 0;
		pthread_mutex_lock(&recv_mu);
		int rc = rvma_msg_arrived(rv_world, &at);
		if (!rc) {
			recv_pass_at(at);
			rc = rvma_try_probe_match(rv_world, rsrc, rtag, mask, at, &from, &mtag, &len, &found);
		}
		pthread_mutex_unlock(&recv_mu);
		if (!rc && found) {
			set_status(st, from, mtag & MPI_TAG_UB_VALUE, MPI_SUCCESS, (long long)len);
			if (flag) *flag = 1;
			return MPI_SUCCESS;
		}
		if (!rc && !block) {
			*flag = 0;
			return MPI_SUCCESS;
		}
		if (!rc) rc = rvma_msg_wait(rv_world, at);
		if (rc) return rvfail_comm(c, rc, fn);
	}
}

int MPI_Probe(int src, int tag, MPI_Comm c, MPI_Status *st) { return probe(__func__, src, tag, c, 1, NULL, st); }

int MPI_Iprobe(int src, int tag, MPI_Comm c, int *flag, MPI_Status *st) {
	return probe(__func__, src, tag, c, 0, flag, st);
}

/* MPI_Cancel: a pending receive that no wait holds ends at once; one a
 * wait holds in another thread (active, or between passes with a key) is
 * ended through its wait, unless its message comes first. Sends and RMA
 * requests complete as they would have (a cancel may fail, says MPI). */
int MPI_Cancel(MPI_Request *h) {
	if (!h) return fail_comm(MPI_COMM_WORLD, MPI_ERR_ARG, __func__, "NULL request");
	int bad;
	struct req *q = req_of(*h, &bad);
	if (!q) return fail_comm(MPI_COMM_WORLD, MPI_ERR_REQUEST, __func__, "invalid request %d", *h);
	pthread_mutex_lock(&recv_mu);
	if (q->kind == REQ_RECV) {
		/* an active one's wait ends it, with RVMA_ERR_CANCELLED */
		if (!q->active) recv_cancelled(q);
		if (q->key) rvma_msg_cancel(rv_world, q->key);
	}
	pthread_mutex_unlock(&recv_mu);
	return MPI_SUCCESS;
}

int MPI_Test_cancelled(const MPI_Status *st, int *flag) {
	if (!st || !flag) return fail_comm(MPI_COMM_WORLD, MPI_ERR_ARG, __func__, "NULL status or flag");
	*flag = st->rvma_cancelled != 0;
	return MPI_SUCCESS;
}

/* Advances request q without blocking (block 0) or until it is done:
 * returns whether it is done (REQ_DONE, status and class set). An RMA or
 * send request's rvma requests are tested, completed ones dropped. */
static int req_advance(struct req *q, int block) {
	if (q->kind == REQ_RECV) {
		if (block)
			recv_wait(q);
		else
			recv_pass();
		return q->kind == REQ_DONE;
	}
	if (q->kind == REQ_RVMA) {
		while (q->n > 0) {
			int rc, done = 1;
			rvma_request *r = &q->r[q->n - 1];
			rc = block ? rvma_request_wait(r) : rvma_request_test(r, &done);
			if (rc && !q->err) {
				snprintf(q->msg, sizeof q->msg, "request: %.300s (%s)", rvma_last_error_message(), rvma_strerror(rc));
				q->err = rv_class(rc, MPI_ERR_REQUEST);
			}
			if (!done) return 0;
			q->n--;
		}
		q->st.MPI_ERROR = q->err;
		q->kind = REQ_DONE;
	}
	return 1;
}

/* The request behind handle h: NULL for MPI_REQUEST_NULL (*bad 0) or an
 * invalid handle (*bad 1). */
static struct req *req_of(MPI_Request h, int *bad) {
	*bad = 0;
	if (h == MPI_REQUEST_NULL) return NULL;
	struct req *q = tbl_get(&reqs, h);
	if (!q) *bad = 1;
	return q;
}

/* Frees the done request behind *h into st: its class (its message
 * recorded as this thread's last). */
static int req_free_done(MPI_Request *h, struct req *q, MPI_Status *st) {
	int err = q->err;
	if (err) snprintf(last_msg, sizeof last_msg, "%s", q->msg), last_class = err;
	if (st) *st = q->st;
	req_drop(*h);
	*h = MPI_REQUEST_NULL;
	return err;
}

static void empty_status(MPI_Status *st) { set_status(st, MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_SUCCESS, 0); }

/* Completes request *h (block) or tests it: 0 or its class, *flag set
 * when given; the message of a failure recorded. */
static int req_finish(MPI_Request *h, MPI_Status *st, int block, int *flag) {
	int bad;
	struct req *q = req_of(*h, &bad);
	if (!q) {
		if (bad) {
			snprintf(last_msg, sizeof last_msg, "invalid request %d", *h);
			return last_class = MPI_ERR_REQUEST;
		}
		empty_status(st);
		if (flag) *flag = 1;
		return MPI_SUCCESS;
	}
	if (!req_advance(q, block)) {
		if (flag) *flag = 0;
		return MPI_SUCCESS;
	}
	if (flag) *flag = 1;
	return req_free_done(h, q, st);
}

int MPI_Wait(MPI_Request *h, MPI_Status *st) {
	if (!h) return fail_comm(MPI_COMM_WORLD, MPI_ERR_ARG, __func__, "NULL request");
	int err = req_finish(h, st, 1, NULL);
	return err ? fail_comm(MPI_COMM_WORLD, err, __func__, "%s", last_msg) : MPI_SUCCESS;
}

int MPI_Test(MPI_Request *h, int *flag, MPI_Status *st) {
	if (!h || !flag) return fail_comm(MPI_COMM_WORLD, MPI_ERR_ARG, __func__, "NULL request or flag");
	*flag = 0;
	int err = req_finish(h, st, 0, flag);
	return err ? fail_comm(MPI_COMM_WORLD, err, __func__, "%s", last_msg) : MPI_SUCCESS;
}

/* Checks an array of n request handles: 0 or MPI_ERR_REQUEST (message
 * recorded). */
static int check_reqs(const char *fn, int n, MPI_Request hs[]) {
	if (n < 0 || (n > 0 && !hs)) return fail_comm(MPI_COMM_WORLD, MPI_ERR_ARG, fn, "count %d or NULL requests", n);
	for (int i = 0; i < n; i++) {
		int bad;
		req_of(hs[i], &bad);
		if (bad) return fail_comm(MPI_COMM_WORLD, MPI_ERR_REQUEST, fn, "requests[%d]: invalid request %d", i, hs[i]);
	}
	return 0;
}

int MPI_Waitall(int n, MPI_Request hs[], MPI_Status sts[]) {
	int cls = check_reqs(__func__, n, hs);
	if (cls) return cls;
	int first = MPI_SUCCESS;
	char msg[MPI_MAX_ERROR_STRING] = "";
	for (int i = 0; i < n; i++) {
		int err = req_finish(&hs[i], sts ? &sts[i] : NULL, 1, NULL);
		if (sts) sts[i].MPI_ERROR = err;
		if (err && !first) first = err, snprintf(msg, sizeof msg, "request %d: %.400s", i, last_msg);
	}
	if (first) return fail_comm(MPI_COMM_WORLD, sts ? MPI_ERR_IN_STATUS : first, __func__, "%s", msg);
	return MPI_SUCCESS;
}

/* MPI_Testall: done (and freed) only if all are. */
int MPI_Testall(int n, MPI_Request hs[], int *flag, MPI_Status sts[]) {
	int cls = check_reqs(__func__, n, hs);
	if (cls) return cls;
	if (!flag) return fail_comm(MPI_COMM_WORLD, MPI_ERR_ARG, __func__, "NULL flag");
	int all = 1, bad;
	for (int i = 0; i < n; i++) {
		struct req *q = req_of(hs[i], &bad);
		if (q && !req_advance(q, 0)) all = 0;
	}
	*flag = all;
	if (!all) return MPI_SUCCESS;
	return MPI_Waitall(n, hs, sts);
}

/* One pass over the requests: the first done one (lowest index) is freed
 * into *index and st; *index MPI_UNDEFINED and *any 0 when every handle is
 * null. Returns whether one was done. */
static int any_done(int n, MPI_Request hs[], int *index, MPI_Status *st, int *any, int *err) {
	*any = 0, *err = 0;
	int bad;
	for (int i = 0; i < n; i++) {
		struct req *q = req_of(hs[i], &bad);
		if (!q) continue;
		*any = 1;
		if (req_advance(q, 0)) {
			*index = i;
			*err = req_free_done(&hs[i], q, st);
			return 1;
		}
	}
	*index = MPI_UNDEFINED;
	return 0;
}

/* Waits between passes of the Wait{any,some}: short sleeps, since there
 * is no single thing to block on. */
static void idle(int i) {
	if (i < 64) {
		sched_yield();
		return;
	}
	struct timespec ts = {0, i < 1024 ? 10000 : 100000};
	nanosleep(&ts, NULL);
}

int MPI_Waitany(int n, MPI_Request hs[], int *index, MPI_Status *st) {
	int cls = check_reqs(__func__, n, hs);
	if (cls) return cls;
	if (!index) return fail_comm(MPI_COMM_WORLD, MPI_ERR_ARG, __func__, "NULL index");
	for (int i = 0;; i++) {
		int any, err;
		if (any_done(n, hs, index, st, &any, &err))
			return err ? fail_comm(MPI_COMM_WORLD, err, __func__, "request %d: %s", *index, last_msg) : MPI_SUCCESS;
		if (!any) {
			empty_status(st);
			return MPI_SUCCESS;
		}
		idle(i);
	}
}

int MPI_Testany(int n, MPI_Request hs[], int *index, int *flag, MPI_Status *st) {
	int cls = check_reqs(__func__, n, hs);
	if (cls) return cls;
	if (!index || !flag) return fail_comm(MPI_COMM_WORLD, MPI_ERR_ARG, __func__, "NULL index or flag");
	int any, err;
	*flag = any_done(n, hs, index, st, &any, &err);
	if (!any) *flag = 1, empty_status(st);
	return err ? fail_comm(MPI_COMM_WORLD, err, __func__, "request %d: %s", *index, last_msg) : MPI_SUCCESS;
}

/* Every done request freed into indices and sts; *outcount their number,
 * MPI_UNDEFINED when every handle is null. */
static int some_done(const char *fn, int n, MPI_Request hs[], int *outcount, int indices[], MPI_Status sts[]) {
	int bad, any = 0, k = 0, first = 0;
	char msg[MPI_MAX_ERROR_STRING] = "";
	for (int i = 0; i < n; i++) {
		struct req *q = req_of(hs[i], &bad);
		if (!q) continue;
		any = 1;
		if (!req_advance(q, 0)) continue;
		int err = req_free_done(&hs[i], q, sts ? &sts[k] : NULL);
		if (err && !first) first = err, snprintf(msg, sizeof msg, "request %d: %.400s", i, last_msg);
		indices[k++] = i;
	}
	*outcount = any ? k : MPI_UNDEFINED;
	if (first) return fail_comm(MPI_COMM_WORLD, sts ? MPI_ERR_IN_STATUS : first, fn, "%s", msg);
	return MPI_SUCCESS;
}

int MPI_Testsome(int n, MPI_Request hs[], int *outcount, int indices[], MPI_Status sts[]) {
	int cls = check_reqs(__func__, n, hs);
	if (cls) return cls;
	if (!outcount || (n > 0 && !indices)) return fail_comm(MPI_COMM_WORLD, MPI_ERR_ARG, __func__, "NULL outcount or indices");
	return some_done(__func__, n, hs, outcount, indices, sts);
}

int MPI_Waitsome(int n, MPI_Request hs[], int *outcount, int indices[], MPI_Status sts[]) {
	int cls = check_reqs(__func__, n, hs);
	if (cls) return cls;
	if (!outcount || (n > 0 && !indices)) return fail_comm(MPI_COMM_WORLD, MPI_ERR_ARG, __func__, "NULL outcount or indices");
	for (int i = 0;; i++) {
		if ((cls = some_done(__func__, n, hs, outcount, indices, sts)) || *outcount != 0) return cls;
		idle(i);
	}
}

int MPI_Request_free(MPI_Request *h) {
	if (!h) return fail_comm(MPI_COMM_WORLD, MPI_ERR_ARG, __func__, "NULL request");
	struct req *q = tbl_get(&reqs, *h);
	if (!q) return fail_comm(MPI_COMM_WORLD, MPI_ERR_REQUEST, __func__, "invalid request %d", *h);
	if (q->kind == REQ_RECV)
		return fail_comm(MPI_COMM_WORLD, MPI_ERR_UNSUPPORTED_OPERATION, __func__,
		                 "freeing a pending MPI_Irecv: its message would be lost");
	/* Sends and RMA requests complete in the background; wait now. */
	return MPI_Wait(h, MPI_STATUS_IGNORE);
}

int MPI_Recv(void *buf, int count, MPI_Datatype t, int src, int tag, MPI_Comm c, MPI_Status *st) {
	MPI_Request h;
	int cls = MPI_Irecv(buf, count, t, src, tag, c, &h);
	if (cls) return cls;
	int err = req_finish(&h, st, 1, NULL);
	return err ? fail_comm(c, err, __func__, "%s", last_msg) : MPI_SUCCESS;
}

int MPI_Sendrecv(const void *sbuf, int scount, MPI_Datatype stype, int dest, int stag, void *rbuf, int rcount,
                 MPI_Datatype rtype, int src, int rtag, MPI_Comm c, MPI_Status *st) {
	MPI_Request r, s;
	int cls = MPI_Irecv(rbuf, rcount, rtype, src, rtag, c, &r);
	if (cls) return cls;
	if ((cls = MPI_Isend(sbuf, scount, stype, dest, stag, c, &s))) return cls;
	int err = req_finish(&r, st, 1, NULL);
	int err2 = req_finish(&s, NULL, 1, NULL);
	if (!err) err = err2;
	return err ? fail_comm(c, err, __func__, "%s", last_msg) : MPI_SUCCESS;
}

/* ---- Collectives ----------------------------------------------------------- */

int MPI_Barrier(MPI_Comm c) {
	CHECK_COMM(c, __func__);
	int rc = rvma_barrier(rv_world);
	return rc ? rvfail_comm(c, rc, __func__) : MPI_SUCCESS;
}

int MPI_Bcast(void *buf, int count, MPI_Datatype t, int root, MPI_Comm c) {
	CHECK_COMM(c, __func__);
	struct dtype *d;
	const char *why;
	int cls = type_check(t, count, &d, &why);
	if (cls) return fail_comm(c, cls, __func__, "%s (%d)", why, (int)t);
	if (root < 0 || root >= rv_size) return fail_comm(c, MPI_ERR_ROOT, __func__, "root %d of %d", root, rv_size);
	int64_t bytes = d->size * count;
	int direct = dense(d, count);
	void *tmp = direct ? buf : malloc((size_t)(bytes ? bytes : 1));
	if (!tmp) return fail_comm(c, MPI_ERR_NO_MEM, __func__, "out of memory");
	if (!direct && rv_rank == root) pack(d, count, buf, tmp);
	int rc = rvma_bcast(rv_world, root, tmp, (size_t)bytes);
	if (!direct) {
		if (!rc) unpack(d, count, tmp, buf);
		free(tmp);
	}
	return rc ? rvfail_comm(c, rc, __func__) : MPI_SUCCESS;
}

/* inout[i] = inout[i] op in[i] */
#define ARITH(T)                                                                             \
	do {                                                                                 \
		T *a = inout;                                                                \
		const T *b = in;                                                             \
		for (int64_t i = 0; i < n; i++) switch (op) {                                \
			case MPI_SUM: a[i] = a[i] + b[i]; break;                             \
			case MPI_PROD: a[i] = a[i] * b[i]; break;                            \
			case MPI_MIN: a[i] = b[i] < a[i] ? b[i] : a[i]; break;               \
			case MPI_MAX: a[i] = b[i] > a[i] ? b[i] : a[i]; break;               \
			case MPI_LAND: a[i] = a[i] && b[i]; break;                           \
			case MPI_LOR: a[i] = a[i] || b[i]; break;                            \
			case MPI_LXOR: a[i] = !a[i] != !b[i]; break;                         \
			default: return MPI_ERR_OP;                                          \
			}                                                                    \
	} while (0)
#define BITS(T)                                                                             \
	do {                                                                                \
		T *a = inout;                                                               \
		const T *b = in;                                                            \
		for (int64_t i = 0; i < n; i++) switch (op) {                               \
			case MPI_BAND: a[i] = a[i] & b[i]; break;                           \
			case MPI_BOR: a[i] = a[i] | b[i]; break;                            \
			case MPI_BXOR: a[i] = a[i] ^ b[i]; break;                           \
			default: return MPI_ERR_OP;                                         \
			}                                                                   \
	} while (0)
#define INTEGER(T)                                                                 \
	do {                                                                       \
		if (op == MPI_BAND || op == MPI_BOR || op == MPI_BXOR)             \
			BITS(T);                                                   \
		else                                                               \
			ARITH(T);                                                  \
	} while (0)

static int reduce_local(void *inout, const void *in, int64_t n, int kind, MPI_Op op) {
	switch (kind) {
	case K_I8: INTEGER(int8_t); break;
	case K_I16: INTEGER(int16_t); break;
	case K_I32: INTEGER(int32_t); break;
	case K_I64: INTEGER(int64_t); break;
	case K_U8: INTEGER(uint8_t); break;
	case K_U16: INTEGER(uint16_t); break;
	case K_U32: INTEGER(uint32_t); break;
	case K_U64: INTEGER(uint64_t); break;
	case K_BYTE: BITS(uint8_t); break;
	case K_BOOL: {
		_Bool *a = inout;
		const _Bool *b = in;
		for (int64_t i = 0; i < n; i++) switch (op) {
			case MPI_LAND: a[i] = a[i] && b[i]; break;
			case MPI_LOR: a[i] = a[i] || b[i]; break;
			case MPI_LXOR: a[i] = a[i] != b[i]; break;
			default: return MPI_ERR_OP;
			}
		break;
	}
	case K_F32:
		if (op != MPI_SUM && op != MPI_PROD && op != MPI_MIN && op != MPI_MAX) return MPI_ERR_OP;
		ARITH(float);
		break;
	case K_F64:
		if (op != MPI_SUM && op != MPI_PROD && op != MPI_MIN && op != MPI_MAX) return MPI_ERR_OP;
		ARITH(double);
		break;
	case K_LD:
		if (op != MPI_SUM && op != MPI_PROD && op != MPI_MIN && op != MPI_MAX) return MPI_ERR_OP;
		ARITH(long double);
		break;
	default: return MPI_ERR_TYPE;
	}
	return MPI_SUCCESS;
}

/* MINLOC and MAXLOC of the packed pair a (value, then index) and b into
 * a: the better value wins, the lower index on a tie. */
#define LOC(T)                                                                                     \
	do {                                                                                       \
		T x, y;                                                                            \
		memcpy(&x, a, sizeof x), memcpy(&y, b, sizeof y);                                  \
		better = op == MPI_MAXLOC ? y > x : y < x, equal = x == y;                         \
	} while (0)

static void loc_pick(char *a, const char *b, MPI_Datatype basic, MPI_Op op) {
	int better = 0, equal = 0, ia, ib;
	switch (basic) {
	case MPI_FLOAT_INT: LOC(float); break;
	case MPI_DOUBLE_INT: LOC(double); break;
	case MPI_LONG_INT: LOC(long); break;
	case MPI_2INT: LOC(int); break;
	case MPI_SHORT_INT: LOC(short); break;
	case MPI_LONG_DOUBLE_INT: LOC(long double); break;
	}
	int64_t vs = basics[basic].vsize;
	memcpy(&ia, a + vs, sizeof ia), memcpy(&ib, b + vs, sizeof ib);
	if (better)
		memcpy(a, b, (size_t)basics[basic].size);
	else if (equal && ib < ia)
		memcpy(a + vs, &ib, sizeof ib);
}
#undef LOC

int reduce_packed(void *inout, const void *in, int64_t n, MPI_Datatype basic, MPI_Op op) {
	if (basic <= 0 || basic >= NBASIC) return MPI_ERR_TYPE;
	int kind = basics[basic].kind;
	if (kind != K_PAIR && kind != K_PAIR8) return reduce_local(inout, in, n, kind, op);
	if (op != MPI_MINLOC && op != MPI_MAXLOC) return MPI_ERR_OP;
	int64_t sz = basics[basic].size;
	for (int64_t i = 0; i < n; i++) loc_pick((char *)inout + i * sz, (const char *)in + i * sz, basic, op);
	return MPI_SUCCESS;
}

int acc_path(MPI_Datatype basic, MPI_Op op) {
	int kind = basic > 0 && basic < NBASIC ? basics[basic].kind : K_NONE;
	if (kind == K_LD || kind == K_PAIR) return ACC_LOCKED;
	if (op == MPI_MINLOC || op == MPI_MAXLOC || op == MPI_LAND || op == MPI_LOR || op == MPI_LXOR) return ACC_CAS;
	return ACC_NATIVE;
}

/* Reduces the n contributions of bytes each in all (rank order) in the
 * order of MPICH's and Open MPI's recursive doubling, so that a floating
 * sum has the same bits as theirs: with pof2 the largest power of two up
 * to n and rem = n - pof2, ranks 2i and 2i+1 (i < rem) are combined
 * first, then the pof2 partial results pairwise, neighbours first. The
 * operations are commutative (a+b and b+a are the same bits), so only the
 * grouping matters. Returns the index of the slot holding the result. */
static int reduce_tree(char *all, size_t bytes, int n, int count, MPI_Datatype basic, MPI_Op op) {
	int pof2 = 1;
	while (pof2 * 2 <= n) pof2 *= 2;
	int rem = n - pof2;
	int *idx = malloc(sizeof(int) * (size_t)pof2);
	if (!idx) { /* rank order, still one result everywhere */
		for (int r = 1; r < n; r++) reduce_packed(all, all + (size_t)r * bytes, count, basic, op);
		return 0;
	}
	for (int i = 0; i < pof2; i++) {
		if (i < rem) {
			reduce_packed(all + (size_t)(2 * i + 1) * bytes, all + (size_t)(2 * i) * bytes, count, basic, op);
			idx[i] = 2 * i + 1;
		} else {
			idx[i] = i + rem;
		}
	}
	for (int mask = 1; mask < pof2; mask <<= 1)
		for (int i = 0; i < pof2; i += 2 * mask)
			reduce_packed(all + (size_t)idx[i] * bytes, all + (size_t)idx[i + mask] * bytes, count, basic, op);
	int root = idx[0];
	free(idx);
	return root;
}

/* The reduction of count packed elements of the predefined t in buf over
 * the ranks, in place: rvma's allreduce for 8-byte integers with SUM, MIN
 * and MAX and doubles with MIN and MAX (where the order of the ranks
 * cannot change a bit); otherwise every rank's contribution gathered and
 * reduced here in MPICH's order (reduce_tree). */
static int reduce_all(const char *fn, MPI_Comm c, void *buf, int count, MPI_Datatype t, MPI_Op op) {
	size_t bytes = (size_t)type_get(t)->size * (size_t)count;
	int kind = basics[t].kind;
	int rc;
	if ((kind == K_I64 && (op == MPI_SUM || op == MPI_MIN || op == MPI_MAX)) ||
	    (kind == K_F64 && (op == MPI_MIN || op == MPI_MAX))) {
		rvma_op rop = op == MPI_SUM ? RVMA_SUM : op == MPI_MIN ? RVMA_MIN : RVMA_MAX;
		rc = kind == K_I64 ? rvma_allreduce_int64(rv_world, rop, buf, (size_t)count)
		                   : rvma_allreduce_double(rv_world, rop, buf, (size_t)count);
		return rc ? rvfail_comm(c, rc, fn) : MPI_SUCCESS;
	}
	char *all = malloc(bytes * (size_t)rv_size + 1);
	if (!all) return fail_comm(c, MPI_ERR_NO_MEM, fn, "out of memory");
	rc = rvma_allgather(rv_world, buf, bytes, all);
	if (rc) {
		free(all);
		return rvfail_comm(c, rc, fn);
	}
	int root = reduce_tree(all, bytes, rv_size, count, t, op);
	if (bytes) memcpy(buf, all + (size_t)root * bytes, bytes);
	free(all);
	return MPI_SUCCESS;
}

/* The reduction of count elements of t over the ranks into out (in may be
 * out), by reduce_all; pairs whose C layout has a gap (MPI_DOUBLE_INT and
 * the like) are packed for it and unpacked after. */
static int allreduce(const char *fn, MPI_Comm c, const void *in, void *out, int count, MPI_Datatype t, MPI_Op op) {
	CHECK_COMM(c, fn);
	struct dtype *d = type_get(t);
	if (!d) return fail_comm(c, MPI_ERR_TYPE, fn, "invalid datatype %d", t);
	if (!d->predefined)
		return fail_comm(c, MPI_ERR_UNSUPPORTED_OPERATION, fn, "reductions take predefined datatypes only");
	if (count < 0) return fail_comm(c, MPI_ERR_COUNT, fn, "count %d", count);
	if (op < MPI_MAX || op > MPI_MAXLOC) return fail_comm(c, MPI_ERR_OP, fn, "operation %d: not a reduction this library has", op);
	/* Check the operation on this rank before the others wait. */
	char probe[32] = {0};
	int cls = reduce_packed(probe, probe, 1, t, op);
	if (cls == MPI_ERR_TYPE) return fail_comm(c, cls, fn, "datatype %d has no arithmetic", t);
	if (cls) return fail_comm(c, cls, fn, "operation %d does not apply to datatype %d", op, t);
	if (d->size == d->extent) {
		if (in != out && count) memmove(out, in, (size_t)d->size * (size_t)count);
		return reduce_all(fn, c, out, count, t, op);
	}
	char *tmp = malloc((size_t)d->size * (size_t)count + 1);
	if (!tmp) return fail_comm(c, MPI_ERR_NO_MEM, fn, "out of memory");
	pack(d, count, in, tmp);
	cls = reduce_all(fn, c, tmp, count, t, op);
	if (!cls) unpack(d, count, tmp, out);
	free(tmp);
	return cls;
}

int MPI_Allreduce(const void *in, void *out, int count, MPI_Datatype t, MPI_Op op, MPI_Comm c) {
	if (!out && count > 0) return fail_comm(c, MPI_ERR_BUFFER, __func__, "NULL recvbuf");
	return allreduce(__func__, c, in == MPI_IN_PLACE ? out : in, out, count, t, op);
}

int MPI_Reduce(const void *in, void *out, int count, MPI_Datatype t, MPI_Op op, int root, MPI_Comm c) {
	if (root < 0 || root >= rv_size) return fail_comm(c, MPI_ERR_ROOT, __func__, "root %d of %d", root, rv_size);
	struct dtype *d = type_get(t);
	if (!d) return fail_comm(c, MPI_ERR_TYPE, __func__, "invalid datatype %d", t);
	if (rv_rank == root) {
		if (!out && count > 0) return fail_comm(c, MPI_ERR_BUFFER, __func__, "NULL recvbuf at the root");
		return allreduce(__func__, c, in == MPI_IN_PLACE ? out : in, out, count, t, op);
	}
	size_t bytes = (size_t)d->extent * (size_t)(count > 0 ? count : 0);
	void *tmp = malloc(bytes + 1);
	if (!tmp) return fail_comm(c, MPI_ERR_NO_MEM, __func__, "out of memory");
	int cls = allreduce(__func__, c, in, tmp, count, t, op);
	free(tmp);
	return cls;
}

/* Every rank's count elements of st into rank order in out (rcount of rt
 * each); root < 0: all ranks receive. */
static int gather(const char *fn, const void *in, int scount, MPI_Datatype st, void *out, int rcount,
                  MPI_Datatype rt, int root, MPI_Comm c) {
	CHECK_COMM(c, fn);
	struct dtype *sd = NULL, *rd;
	const char *why;
	int receives = root < 0 || root == rv_rank;
	int cls = type_check(rt, rcount, &rd, &why);
	if (cls && receives) return fail_comm(c, cls, fn, "recvtype: %s", why);
	if (in != MPI_IN_PLACE && (cls = type_check(st, scount, &sd, &why))) return fail_comm(c, cls, fn, "sendtype: %s", why);
	if (root >= rv_size) return fail_comm(c, MPI_ERR_ROOT, fn, "root %d of %d", root, rv_size);
	int64_t bytes = in == MPI_IN_PLACE ? rd->size * rcount : sd->size * scount;
	if (receives && bytes != rd->size * rcount)
		return fail_comm(c, MPI_ERR_TRUNCATE, fn, "%lld bytes sent, %lld received per rank", (long long)bytes,
		                 (long long)(rd->size * rcount));
	char *mine = malloc((size_t)bytes + 1), *all = malloc((size_t)bytes * (size_t)rv_size + 1);
	if (!mine || !all) {
		free(mine), free(all);
		return fail_comm(c, MPI_ERR_NO_MEM, fn, "out of memory");
	}
	if (in == MPI_IN_PLACE)
		pack(rd, rcount, (char *)out + (int64_t)rv_rank * rcount * rd->extent, mine);
	else
		pack(sd, scount, in, mine);
	int rc = rvma_allgather(rv_world, mine, (size_t)bytes, all);
	if (!rc && receives)
		for (int r = 0; r < rv_size; r++) unpack(rd, rcount, all + (size_t)r * (size_t)bytes, (char *)out + (int64_t)r * rcount * rd->extent);
	free(mine), free(all);
	return rc ? rvfail_comm(c, rc, fn) : MPI_SUCCESS;
}

int MPI_Allgather(const void *in, int scount, MPI_Datatype st, void *out, int rcount, MPI_Datatype rt, MPI_Comm c) {
	return gather(__func__, in, scount, st, out, rcount, rt, -1, c);
}

int MPI_Gather(const void *in, int scount, MPI_Datatype st, void *out, int rcount, MPI_Datatype rt, int root,
               MPI_Comm c) {
	if (root < 0) return fail_comm(c, MPI_ERR_ROOT, __func__, "root %d", root);
	return gather(__func__, in, scount, st, out, rcount, rt, root, c);
}
