/*
 * libmpi's windows: MPI's one-sided interface over rvma's windows.
 *
 * rvma's windows are created with disp_unit 1 and this file scales
 * displacements by the target's disp_unit (gathered at creation), so that
 * derived datatypes' byte offsets add to them. Datatypes become rvma
 * layouts: one strided layout per side when both sides have one (a
 * vector, or a contiguous run), else the sides are walked run by run.
 */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "impl.h"
#include "mpix_rvma.h"

struct win {
	rvma_win w;
	MPI_Comm comm;
	int nranks; /* the size of its group: 1 over MPI_COMM_SELF */
	int self;   /* over MPI_COMM_SELF in a world of more than one rank (rvma_comm_self's) */
	void *base;
	MPI_Aint size;
	int disp_unit, flavor, model;
	int *units; /* every rank's disp_unit */
	MPI_Errhandler eh;
	/* passive target epochs this rank has open (flushes need one) */
	int lock_all, nlocked;
	unsigned char *locked; /* per rank */
	int notified;          /* an MPIX notified window: puts and flushes need no epoch */
	char name[MPI_MAX_OBJECT_NAME];
	struct attr *attrs; /* the program's attributes, newest first */
};

/* Keyvals of window attributes: handles KEYVAL_BASE + index; one lives
 * while its handle or an attribute holds it. */
struct keyval {
	MPI_Win_copy_attr_function *copy;
	MPI_Win_delete_attr_function *del;
	void *extra;
	int refs, freed;
};
struct attr {
	int key;
	void *val;
	struct attr *next;
};
enum { KEYVAL_BASE = 0x67000000, NKEYVAL = 1024 };
static struct keyval *keyvals[NKEYVAL];

static struct keyval *keyval_get(int key) {
	if (key < KEYVAL_BASE || key >= KEYVAL_BASE + NKEYVAL) return NULL;
	pthread_mutex_lock(&rv_mu);
	struct keyval *k = keyvals[key - KEYVAL_BASE];
	pthread_mutex_unlock(&rv_mu);
	return k;
}

static void keyval_unref(int key) {
	pthread_mutex_lock(&rv_mu);
	struct keyval *k = keyvals[key - KEYVAL_BASE];
	if (k && --k->refs == 0) keyvals[key - KEYVAL_BASE] = NULL, free(k);
	pthread_mutex_unlock(&rv_mu);
}

static struct table wins = {.first = 1};

MPI_Errhandler win_eh(MPI_Win h);
MPI_Errhandler win_eh(MPI_Win h) {
	struct win *w = tbl_get(&wins, h);
	return w ? w->eh : 0;
}

#define GET_WIN(w, h, fn)                                                                      \
	if (NOT_INIT(fn)) return MPI_ERR_OTHER;                                                \
	struct win *w = tbl_get(&wins, h);                                                     \
	if (!w) return fail_win(h, MPI_ERR_WIN, fn, "invalid window %d", (int)h)

/* The mutex words of ACC_LOCKED accumulates: a window of one 8-byte word
 * per rank of a communicator, made with its first window (collective like
 * it) and under lock_all until MPI_Finalize. One word per target serves
 * every window of the communicator: such accumulates are rare and short.
 * The world's serves windows over the world; the windows over
 * MPI_COMM_SELF have their own. */
static rvma_win mx_world, mx_self;

static int mutex_init(rvma_win *m, rvma_comm c) {
	if (*m) return 0;
	void *base;
	int rc = rvma_win_allocate(c, 8, 1, &base, m);
	if (!rc) rc = rvma_win_lock_all(*m);
	return rc;
}

static void mutex_free(rvma_win *m) {
	if (!*m) return;
	rvma_win_unlock_all(*m);
	rvma_win_free(m);
}

void win_finalize(void) {
	mutex_free(&mx_world);
	mutex_free(&mx_self);
}

static int mutex_lock(rvma_win m, int target) {
	uint64_t mine = (uint64_t)rv_rank + 1, zero = 0, old;
	for (int i = 0;; i++) {
		int rc = rvma_compare_and_swap(m, &mine, &zero, &old, RVMA_UINT64, target, 0);
		if (!rc) rc = rvma_win_flush(m, target);
		if (rc || old == 0) return rc;
		if (i > 16) sched_yield();
	}
}

static int mutex_unlock(rvma_win m, int target) {
	uint64_t zero = 0, old;
	int rc = rvma_fetch_and_op(m, &zero, &old, RVMA_UINT64, RVMA_REPLACE, target, 0);
	return rc ? rc : rvma_win_flush(m, target);
}

/* The number of ranks of c's windows: 1 for MPI_COMM_SELF. */
static int comm_nranks(MPI_Comm c) { return comm_ctx(c) == -2 ? 1 : rv_size; }

/* How create makes the window: over the caller's memory, allocated,
 * allocated shared, or dynamic (memory attached later). */
enum { WIN_CREATE, WIN_ALLOC, WIN_SHARED, WIN_DYNAMIC };

static int create(const char *fn, int alloc, void *base, MPI_Aint size, int disp_unit, MPI_Comm c, void *baseptr,
                  MPI_Win *out, const rvma_notify_config *nc) {
	if (NOT_INIT(fn)) return MPI_ERR_OTHER;
	int x = comm_ctx(c);
	if (x == -1) return fail_comm(c, MPI_ERR_COMM, fn, "invalid communicator %d", c);
	/* MPI_COMM_SELF in a world of more than one: rvma's communicator of
	 * this process alone, where rank 0 is this process, as in MPI's. */
	rvma_comm rc_comm = rv_world;
	int nranks = rv_size;
	if (x == -2) {
		int rc = rvma_comm_self(&rc_comm);
		if (rc) return rvfail_comm(c, rc, fn);
		nranks = 1;
	}
	if (size < 0) return fail_comm(c, MPI_ERR_SIZE, fn, "size %lld", (long long)size);
	if (disp_unit <= 0) return fail_comm(c, MPI_ERR_DISP, fn, "disp_unit %d", disp_unit);
	if (!out || ((alloc == WIN_ALLOC || alloc == WIN_SHARED) && !baseptr))
		return fail_comm(c, MPI_ERR_ARG, fn, "NULL win or baseptr");
	if (!alloc && !base && size > 0) return fail_comm(c, MPI_ERR_BASE, fn, "NULL base with size %lld", (long long)size);
	struct win *w = calloc(1, sizeof *w);
	int *units = malloc(sizeof(int) * (size_t)nranks);
	unsigned char *locked = calloc((size_t)nranks, 1);
	if (!w || !units || !locked) {
		free(w), free(units), free(locked);
		return fail_comm(c, MPI_ERR_NO_MEM, fn, "out of memory");
	}
	int rc = mutex_init(x == -2 ? &mx_self : &mx_world, rc_comm);
	if (rc)
		w->w = 0;
	else if (nc)
		rc = alloc ? rvma_win_allocate_notified(rc_comm, (size_t)size, 1, nc, &w->base, &w->w)
		           : rvma_win_create_notified(rc_comm, base, (size_t)size, 1, nc, &w->w);
	else if (alloc == WIN_DYNAMIC)
		rc = rvma_win_create_dynamic(rc_comm, &w->w);
	else if (alloc == WIN_SHARED)
		rc = rvma_win_allocate_shared(rc_comm, (size_t)size, 1, &w->base, &w->w);
	else
		rc = alloc ? rvma_win_allocate(rc_comm, (size_t)size, 1, &w->base, &w->w)
		           : rvma_win_create(rc_comm, base, (size_t)size, 1, &w->w);
	if (!rc) rc = rvma_allgather(rc_comm, &disp_unit, sizeof disp_unit, units);
	if (rc) {
		if (w->w) rvma_win_free(&w->w);
		free(w), free(units), free(locked);
		if (rc == RVMA_ERR_UNSUPPORTED && alloc == WIN_SHARED)
			return fail_comm(c, MPI_ERR_RMA_SHARED, fn, "%s", rvma_last_error_message());
		return rvfail_comm(c, rc, fn);
	}
	if (!alloc) w->base = base;
	w->comm = c, w->size = size, w->disp_unit = disp_unit, w->units = units, w->locked = locked;
	w->nranks = nranks, w->self = x == -2;
	w->notified = nc != NULL;
	w->flavor = alloc == WIN_SHARED    ? MPI_WIN_FLAVOR_SHARED
	            : alloc == WIN_DYNAMIC ? MPI_WIN_FLAVOR_DYNAMIC
	            : alloc                ? MPI_WIN_FLAVOR_ALLOCATE
	                                   : MPI_WIN_FLAVOR_CREATE;
	w->model = MPI_WIN_UNIFIED;
	w->eh = MPI_ERRORS_ARE_FATAL;
	int h = tbl_add(&wins, w);
	if (h < 0) {
		rvma_win_free(&w->w);
		free(w), free(units);
		return fail_comm(c, MPI_ERR_NO_MEM, fn, "out of window handles");
	}
	if (baseptr) *(void **)baseptr = w->base;
	*out = h;
	return MPI_SUCCESS;
}

int MPI_Win_allocate(MPI_Aint size, int disp_unit, MPI_Info info, MPI_Comm c, void *baseptr, MPI_Win *win) {
	(void)info;
	return create(__func__, WIN_ALLOC, NULL, size, disp_unit, c, baseptr, win, NULL);
}

int MPI_Win_create(void *base, MPI_Aint size, int disp_unit, MPI_Info info, MPI_Comm c, MPI_Win *win) {
	(void)info;
	return create(__func__, WIN_CREATE, base, size, disp_unit, c, NULL, win, NULL);
}

int MPI_Win_allocate_shared(MPI_Aint size, int disp_unit, MPI_Info info, MPI_Comm c, void *baseptr, MPI_Win *win) {
	(void)info; /* contiguous even with alloc_shared_noncontig, which only permits otherwise */
	return create(__func__, WIN_SHARED, NULL, size, disp_unit, c, baseptr, win, NULL);
}

int MPI_Win_shared_query(MPI_Win h, int rank, MPI_Aint *size, int *disp_unit, void *baseptr) {
	GET_WIN(w, h, __func__);
	if (!size || !disp_unit || !baseptr) return fail_win(h, MPI_ERR_ARG, __func__, "NULL size, disp_unit or baseptr");
	if (rank != MPI_PROC_NULL && (rank < 0 || rank >= w->nranks))
		return fail_win(h, MPI_ERR_RANK, __func__, "rank %d not in the window's group of %d", rank, w->nranks);
	size_t n = 0;
	void *p = NULL;
	if (rank == MPI_PROC_NULL) {
		/* the lowest rank whose part is not empty (of a shared window:
		 * the start of the block) */
		if (w->flavor != MPI_WIN_FLAVOR_SHARED)
			return fail_win(h, MPI_ERR_RANK, __func__, "MPI_PROC_NULL on a window that is not shared");
		for (int r = 0; r < w->nranks; r++) {
			int rc = rvma_win_shared_query(w->w, r, &n, &p);
			if (rc) return rvfail_win(h, rc, __func__);
			if (n > 0) {
				rank = r;
				break;
			}
		}
		if (rank == MPI_PROC_NULL) n = 0, p = NULL, rank = 0;
	} else {
		int rc = rvma_win_shared_query(w->w, rank, &n, &p);
		if (rc == RVMA_ERR_UNSUPPORTED && w->flavor != MPI_WIN_FLAVOR_SHARED)
			n = 0, p = NULL; /* not mapped here: MPI-4's answer */
		else if (rc)
			return rvfail_win(h, rc, __func__);
	}
	*size = (MPI_Aint)n;
	*disp_unit = w->units[rank];
	*(void **)baseptr = n ? p : NULL; /* an empty part has no address (as MPICH's) */
	return MPI_SUCCESS;
}

/* Dynamic windows: MPI_Win_attach registers the memory here, alone; an
 * origin learns from the target which registration holds an address the
 * first time it uses one (see rma's DynWin), and target displacements are
 * addresses (MPI_Get_address), disp_unit 1. */
int MPI_Win_create_dynamic(MPI_Info info, MPI_Comm c, MPI_Win *win) {
	(void)info;
	return create(__func__, WIN_DYNAMIC, NULL, 0, 1, c, NULL, win, NULL);
}

int MPI_Win_attach(MPI_Win h, void *base, MPI_Aint size) {
	GET_WIN(w, h, __func__);
	if (w->flavor != MPI_WIN_FLAVOR_DYNAMIC)
		return fail_win(h, MPI_ERR_RMA_FLAVOR, __func__, "window %d is not dynamic", h);
	if (size < 0) return fail_win(h, MPI_ERR_SIZE, __func__, "size %lld", (long long)size);
	int rc = rvma_win_attach(w->w, base, (size_t)size);
	if (rc == RVMA_ERR_ARG) return fail_win(h, MPI_ERR_RMA_ATTACH, __func__, "%s", rvma_last_error_message());
	return rc ? rvfail_win(h, rc, __func__) : MPI_SUCCESS;
}

int MPI_Win_detach(MPI_Win h, const void *base) {
	GET_WIN(w, h, __func__);
	if (w->flavor != MPI_WIN_FLAVOR_DYNAMIC)
		return fail_win(h, MPI_ERR_RMA_FLAVOR, __func__, "window %d is not dynamic", h);
	int rc = rvma_win_detach(w->w, base);
	if (rc == RVMA_ERR_ARG) return fail_win(h, MPI_ERR_RMA_ATTACH, __func__, "%s", rvma_last_error_message());
	return rc ? rvfail_win(h, rc, __func__) : MPI_SUCCESS;
}

int MPI_Get_address(const void *location, MPI_Aint *address) {
	if (!address) return fail_comm(MPI_COMM_WORLD, MPI_ERR_ARG, __func__, "NULL address");
	*address = (MPI_Aint)(uintptr_t)location;
	return MPI_SUCCESS;
}

MPI_Aint MPI_Aint_add(MPI_Aint base, MPI_Aint disp) { return (MPI_Aint)((uintptr_t)base + (uintptr_t)disp); }

MPI_Aint MPI_Aint_diff(MPI_Aint addr1, MPI_Aint addr2) { return (MPI_Aint)((uintptr_t)addr1 - (uintptr_t)addr2); }

/* Removes attribute key of w, calling its delete function: 0 or its
 * class (then the attribute stays). */
static int attr_delete(MPI_Win h, struct win *w, int key, const char *fn) {
	for (struct attr **p = &w->attrs; *p; p = &(*p)->next) {
		if ((*p)->key != key) continue;
		struct keyval *k = keyval_get(key);
		if (k && k->del) {
			int rc = k->del(h, key, (*p)->val, k->extra);
			if (rc) return fail_win(h, MPI_ERR_OTHER, fn, "the delete function of keyval %#x returned %d", key, rc);
		}
		struct attr *a = *p;
		*p = a->next;
		free(a);
		keyval_unref(key);
		return 0;
	}
	return -1;
}

int MPI_Win_free(MPI_Win *h) {
	if (!h) return fail_comm(MPI_COMM_WORLD, MPI_ERR_ARG, __func__, "NULL win");
	GET_WIN(w, *h, __func__);
	while (w->attrs) {
		int cls = attr_delete(*h, w, w->attrs->key, __func__);
		if (cls) return cls;
	}
	MPI_Errhandler eh = w->eh;
	tbl_del(&wins, *h);
	if (eh_user(eh)) eh_ref(eh, -1), eh = MPI_ERRORS_RETURN; /* a failure of the free is returned */
	int rc = rvma_win_free(&w->w);
	free(w->units), free(w->locked), free(w);
	MPI_Win old = *h;
	*h = MPI_WIN_NULL;
	if (rc) {
		int cls = rv_class(rc, MPI_ERR_WIN);
		if (eh == MPI_ERRORS_RETURN) return cls;
		return fail_win(old, cls, __func__, "%s", rvma_last_error_message());
	}
	return MPI_SUCCESS;
}

int MPI_Win_get_attr(MPI_Win h, int key, void *val, int *flag) {
	GET_WIN(w, h, __func__);
	if (!val || !flag) return fail_win(h, MPI_ERR_ARG, __func__, "NULL attribute_val or flag");
	*flag = 1;
	switch (key) {
	case MPI_WIN_BASE: *(void **)val = w->base; break;
	case MPI_WIN_SIZE: *(MPI_Aint **)val = &w->size; break;
	case MPI_WIN_DISP_UNIT: *(int **)val = &w->disp_unit; break;
	case MPI_WIN_CREATE_FLAVOR: *(int **)val = &w->flavor; break;
	case MPI_WIN_MODEL: *(int **)val = &w->model; break;
	default:
		*flag = 0;
		for (struct attr *a = w->attrs; a; a = a->next)
			if (a->key == key) *(void **)val = a->val, *flag = 1;
	}
	return MPI_SUCCESS;
}

int MPI_Win_create_keyval(MPI_Win_copy_attr_function *copy, MPI_Win_delete_attr_function *del, int *key,
                          void *extra) {
	if (!key) return fail_comm(MPI_COMM_WORLD, MPI_ERR_ARG, __func__, "NULL keyval");
	struct keyval *k = calloc(1, sizeof *k);
	if (!k) return fail_comm(MPI_COMM_WORLD, MPI_ERR_NO_MEM, __func__, "out of memory");
	*k = (struct keyval){copy, del, extra, 1, 0};
	int i;
	pthread_mutex_lock(&rv_mu);
	for (i = 0; i < NKEYVAL && keyvals[i]; i++) {}
	if (i < NKEYVAL) keyvals[i] = k;
	pthread_mutex_unlock(&rv_mu);
	if (i == NKEYVAL) {
		free(k);
		return fail_comm(MPI_COMM_WORLD, MPI_ERR_NO_MEM, __func__, "all %d keyvals in use", NKEYVAL);
	}
	*key = KEYVAL_BASE + i;
	return MPI_SUCCESS;
}

int MPI_Win_free_keyval(int *key) {
	struct keyval *k = key ? keyval_get(*key) : NULL;
	if (!k || k->freed) return fail_comm(MPI_COMM_WORLD, MPI_ERR_KEYVAL, __func__, "invalid keyval");
	k->freed = 1;
	keyval_unref(*key);
	*key = MPI_KEYVAL_INVALID;
	return MPI_SUCCESS;
}

int MPI_Win_set_attr(MPI_Win h, int key, void *val) {
	GET_WIN(w, h, __func__);
	struct keyval *k = keyval_get(key);
	if (!k || k->freed) return fail_win(h, MPI_ERR_KEYVAL, __func__, "invalid keyval %#x", key);
	int cls = attr_delete(h, w, key, __func__);
	if (cls > 0) return cls;
	struct attr *a = malloc(sizeof *a);
	if (!a) return fail_win(h, MPI_ERR_NO_MEM, __func__, "out of memory");
	pthread_mutex_lock(&rv_mu);
	k->refs++;
	pthread_mutex_unlock(&rv_mu);
	*a = (struct attr){key, val, w->attrs};
	w->attrs = a;
	return MPI_SUCCESS;
}

int MPI_Win_delete_attr(MPI_Win h, int key) {
	GET_WIN(w, h, __func__);
	if (!keyval_get(key)) return fail_win(h, MPI_ERR_KEYVAL, __func__, "invalid keyval %#x", key);
	int cls = attr_delete(h, w, key, __func__);
	if (cls < 0) return fail_win(h, MPI_ERR_KEYVAL, __func__, "no attribute of keyval %#x", key);
	return cls;
}

int MPI_Win_set_name(MPI_Win h, const char *name) {
	GET_WIN(w, h, __func__);
	if (!name) return fail_win(h, MPI_ERR_ARG, __func__, "NULL name");
	snprintf(w->name, sizeof w->name, "%s", name);
	return MPI_SUCCESS;
}

int MPI_Win_get_name(MPI_Win h, char *name, int *len) {
	GET_WIN(w, h, __func__);
	if (!name || !len) return fail_win(h, MPI_ERR_ARG, __func__, "NULL name or resultlen");
	snprintf(name, MPI_MAX_OBJECT_NAME, "%s", w->name);
	*len = (int)strlen(name);
	return MPI_SUCCESS;
}

int MPI_Win_get_group(MPI_Win h, MPI_Group *g) {
	GET_WIN(w, h, __func__);
	return MPI_Comm_group(w->comm, g);
}

int MPI_Win_set_errhandler(MPI_Win h, MPI_Errhandler e) {
	GET_WIN(w, h, __func__);
	if (e != MPI_ERRORS_RETURN && e != MPI_ERRORS_ARE_FATAL && e != MPI_ERRORS_ABORT && !eh_user(e))
		return fail_win(h, MPI_ERR_ARG, __func__, "error handler %d: not a window's", e);
	eh_ref(e, 1);
	eh_ref(w->eh, -1);
	w->eh = e;
	return MPI_SUCCESS;
}

int MPI_Win_get_errhandler(MPI_Win h, MPI_Errhandler *e) {
	GET_WIN(w, h, __func__);
	if (!e) return fail_win(h, MPI_ERR_ARG, __func__, "NULL errhandler");
	*e = w->eh;
	eh_ref(*e, 1); /* the program frees what it got (MPI_Errhandler_free) */
	return MPI_SUCCESS;
}

/* ---- Data movement -------------------------------------------------------- */

/* The target's displacement in bytes: 0, or a class (message recorded). */
static int target_bytes(const char *fn, MPI_Win h, struct win *w, int target, MPI_Aint disp, int64_t *out) {
	if (target < 0 || target >= w->nranks)
		return fail_win(h, MPI_ERR_RANK, fn, "target rank %d not in the window's group of %d", target, w->nranks);
	if (disp < 0) return fail_win(h, MPI_ERR_DISP, fn, "negative target displacement %lld", (long long)disp);
	int64_t b;
	if (__builtin_mul_overflow((int64_t)disp, (int64_t)w->units[target], &b))
		return fail_win(h, MPI_ERR_RMA_RANGE, fn, "displacement %lld times disp_unit %d overflows", (long long)disp,
		                w->units[target]);
	*out = b;
	return 0;
}

static int check_types(const char *fn, MPI_Win h, MPI_Datatype ot, int oc, struct dtype **od, MPI_Datatype tt, int tc,
                       struct dtype **td) {
	const char *why;
	int cls = type_check(ot, oc, od, &why);
	if (cls) return fail_win(h, cls, fn, "origin: %s (%d)", why, (int)ot);
	if ((cls = type_check(tt, tc, td, &why))) return fail_win(h, cls, fn, "target: %s (%d)", why, (int)tt);
	if ((*od)->size * oc != (*td)->size * tc)
		return fail_win(h, MPI_ERR_TYPE, fn, "origin moves %lld bytes, target %lld", (long long)((*od)->size * oc),
		                (long long)((*td)->size * tc));
	return 0;
}

/* A strided group of n pairs of runs of len bytes: origin offsets o,
 * o+os, ..., target offsets t, t+ts, ... (n 0: empty). */
struct run {
	int64_t o, t, len, n, os, ts;
	rvma_request req;
};

/* Adds the pair (o, t, len) to g if it continues it: 1, else 0. */
static int run_extend(struct run *g, int64_t o, int64_t t, int64_t len) {
	if (g->n == 0 || len != g->len) return 0;
	if (g->n == 1) {
		if (o - g->o < len || t - g->t < len) return 0; /* strides go forward, blocks apart */
		g->os = o - g->o, g->ts = t - g->t, g->n = 2;
		return 1;
	}
	if (o != g->o + g->n * g->os || t != g->t + g->n * g->ts) return 0;
	g->n++;
	return 1;
}

/* Puts or gets group g (with a request in g->req when q): rvma's code. */
static int run_issue(struct win *w, int put, void *origin, int target, int64_t tb, struct run *g, struct req *q) {
	char *o = (char *)origin + g->o;
	rvma_request *rp = q ? &g->req : NULL;
	g->req = RVMA_REQUEST_NULL;
	if (g->n == 1) {
		if (put) return q ? rvma_rput(w->w, o, (size_t)g->len, target, tb + g->t, rp) : rvma_put(w->w, o, (size_t)g->len, target, tb + g->t);
		return q ? rvma_rget(w->w, o, (size_t)g->len, target, tb + g->t, rp) : rvma_get(w->w, o, (size_t)g->len, target, tb + g->t);
	}
	rvma_layout ol = {g->n, g->len, g->os}, tl = {g->n, g->len, g->ts};
	if (put)
		return q ? rvma_rput_strided(w->w, o, &ol, target, tb + g->t, &tl, rp)
		         : rvma_put_strided(w->w, o, &ol, target, tb + g->t, &tl);
	return q ? rvma_rget_strided(w->w, o, &ol, target, tb + g->t, &tl, rp)
	         : rvma_get_strided(w->w, o, &ol, target, tb + g->t, &tl);
}

/* Registers the origin bytes that count copies of t span, when they come
 * in many pieces: each rvma call would otherwise register the rest of its
 * own span (a struct type's 262144 copies: a registration per call). */
static void register_span(struct win *w, void *origin, const struct dtype *t, int64_t count) {
	if (t->nblk * count < 16) return;
	int64_t lo = INT64_MAX, hi = INT64_MIN, reach;
	for (int64_t j = 0; j < t->nblk; j++)
		if (t->blk[j].len > 0) {
			if (t->blk[j].off < lo) lo = t->blk[j].off;
			if (t->blk[j].off + t->blk[j].len > hi) hi = t->blk[j].off + t->blk[j].len;
		}
	if (lo > hi || __builtin_mul_overflow(count - 1, t->extent, &reach)) return;
	if (reach < 0) lo += reach;
	else hi += reach;
	/* A hint: an error here shows again at the call that moves the bytes. */
	(void)rvma_register_origin(w->w, (char *)origin + lo, (size_t)(hi - lo));
}

/* Put (put=1) or get: one rvma call when both sides have a strided
 * layout, else one per run. Requests go into q if given. */
static int move(const char *fn, int put, void *origin, int oc, MPI_Datatype ot, int target, MPI_Aint disp, int tc,
                MPI_Datatype tt, MPI_Win h, struct req *q) {
	GET_WIN(w, h, fn);
	struct dtype *od, *td;
	int cls = check_types(fn, h, ot, oc, &od, tt, tc, &td);
	if (cls) return cls;
	if (target == MPI_PROC_NULL) return MPI_SUCCESS;
	int64_t tb;
	if ((cls = target_bytes(fn, h, w, target, disp, &tb))) return cls;
	int64_t bytes = od->size * oc;
	if (bytes == 0) return MPI_SUCCESS;
	if (!origin && od->predefined) return fail_win(h, MPI_ERR_BUFFER, fn, "NULL origin buffer");
	rvma_layout ol, tl;
	int64_t oo, to;
	int rc = 0;
	rvma_request r = RVMA_REQUEST_NULL, *rp = q ? &r : NULL;
	if (layout_of(od, oc, &ol, &oo) && layout_of(td, tc, &tl, &to)) {
		char *o = (char *)origin + oo;
		if (ol.count == 1 && tl.count == 1) {
			if (put)
				rc = q ? rvma_rput(w->w, o, (size_t)bytes, target, tb + to, rp) : rvma_put(w->w, o, (size_t)bytes, target, tb + to);
			else
				rc = q ? rvma_rget(w->w, o, (size_t)bytes, target, tb + to, rp) : rvma_get(w->w, o, (size_t)bytes, target, tb + to);
		} else if (put) {
			rc = q ? rvma_rput_strided(w->w, o, &ol, target, tb + to, &tl, rp)
			       : rvma_put_strided(w->w, o, &ol, target, tb + to, &tl);
		} else {
			rc = q ? rvma_rget_strided(w->w, o, &ol, target, tb + to, &tl, rp)
			       : rvma_get_strided(w->w, o, &ol, target, tb + to, &tl);
		}
		if (!rc && q && req_push(q, r)) return fail_win(h, MPI_ERR_NO_MEM, fn, "out of memory");
		return rc ? rvfail_win(h, rc, fn) : MPI_SUCCESS;
	}
	/* The sides' runs paired up; consecutive pairs of one length at
	 * constant strides on both sides (a face of a 3-D array: one row of
	 * elements after another) go as one strided call. */
	register_span(w, origin, od, oc);
	struct walk wo, wt;
	walk_init(&wo, od, oc);
	walk_init(&wt, td, tc);
	struct run g = {0};
	int64_t left = bytes, toff = 0, tlen = 0;
	while (left > 0 && !rc) {
		if (tlen == 0) walk_next(&wt, INT64_MAX, &toff, &tlen);
		int64_t off, len;
		walk_next(&wo, tlen, &off, &len);
		if (!run_extend(&g, off, toff, len)) {
			if (g.n) {
				rc = run_issue(w, put, origin, target, tb, &g, q);
				if (!rc && q && req_push(q, g.req)) return fail_win(h, MPI_ERR_NO_MEM, fn, "out of memory");
			}
			g = (struct run){.o = off, .t = toff, .len = len, .n = 1};
		}
		toff += len, tlen -= len, left -= len;
	}
	if (!rc && g.n) {
		rc = run_issue(w, put, origin, target, tb, &g, q);
		if (!rc && q && req_push(q, g.req)) return fail_win(h, MPI_ERR_NO_MEM, fn, "out of memory");
	}
	return rc ? rvfail_win(h, rc, fn) : MPI_SUCCESS;
}

int MPI_Put(const void *origin, int oc, MPI_Datatype ot, int target, MPI_Aint disp, int tc, MPI_Datatype tt, MPI_Win h) {
	return move(__func__, 1, (void *)origin, oc, ot, target, disp, tc, tt, h, NULL);
}

int MPI_Get(void *origin, int oc, MPI_Datatype ot, int target, MPI_Aint disp, int tc, MPI_Datatype tt, MPI_Win h) {
	return move(__func__, 0, origin, oc, ot, target, disp, tc, tt, h, NULL);
}

/* A request for the calls of fn; on failure its rvma requests are waited
 * for and it is dropped. */
static int with_request(const char *fn, MPI_Win h, MPI_Request *request, struct req **q) {
	if (!request) return fail_win(h, MPI_ERR_ARG, fn, "NULL request");
	if (!(*q = req_new(REQ_RVMA, request))) return fail_win(h, MPI_ERR_NO_MEM, fn, "out of request handles");
	return 0;
}

static int end_request(int cls, struct req *q, MPI_Request *request) {
	if (cls) {
		rvma_request_waitall((size_t)q->n, q->r);
		req_drop(*request);
		*request = MPI_REQUEST_NULL;
	}
	return cls;
}

int MPI_Rput(const void *origin, int oc, MPI_Datatype ot, int target, MPI_Aint disp, int tc, MPI_Datatype tt,
             MPI_Win h, MPI_Request *request) {
	struct req *q;
	int cls = with_request(__func__, h, request, &q);
	if (cls) return cls;
	return end_request(move(__func__, 1, (void *)origin, oc, ot, target, disp, tc, tt, h, q), q, request);
}

int MPI_Rget(void *origin, int oc, MPI_Datatype ot, int target, MPI_Aint disp, int tc, MPI_Datatype tt, MPI_Win h,
             MPI_Request *request) {
	struct req *q;
	int cls = with_request(__func__, h, request, &q);
	if (cls) return cls;
	return end_request(move(__func__, 0, origin, oc, ot, target, disp, tc, tt, h, q), q, request);
}

static int rvma_op_of(MPI_Op op) {
	switch (op) {
	case MPI_SUM: return RVMA_SUM;
	case MPI_PROD: return RVMA_PROD;
	case MPI_MIN: return RVMA_MIN;
	case MPI_MAX: return RVMA_MAX;
	case MPI_BAND: return RVMA_BAND;
	case MPI_BOR: return RVMA_BOR;
	case MPI_BXOR: return RVMA_BXOR;
	case MPI_REPLACE: return RVMA_REPLACE;
	case MPI_NO_OP: return RVMA_NO_OP;
	default: return 0;
	}
}

/* The rvma element type and op of an accumulate: 0 or a class. */
static int acc_kind(const char *fn, MPI_Win h, const struct dtype *d, MPI_Datatype t, MPI_Op op, int *rt, int *rop,
                    int64_t *esz) {
	*rop = rvma_op_of(op);
	if (!*rop) return fail_win(h, MPI_ERR_OP, fn, "invalid operation %d", op);
	*rt = type_rvma(d->basic);
	/* Types without arithmetic (MPI_BYTE, MPI_C_BOOL, ...) are replaced,
	 * fetched and combined bit by bit as unsigned integers of their
	 * size, one element each. */
	if (!*rt && (op == MPI_REPLACE || op == MPI_NO_OP || op == MPI_BAND || op == MPI_BOR || op == MPI_BXOR))
		*rt = type_rvma_bits(d->basic, op != MPI_REPLACE && op != MPI_NO_OP);
	/* Arithmetic on MPI_BYTE and the like, or on mixed elements, is no
	 * one's. */
	if (!*rt)
		return fail_win(h, MPI_ERR_TYPE, fn,
		                "datatype %d with operation %d: accumulates take one predefined element type with "
		                "arithmetic (MPI_BYTE and the like: MPI_REPLACE, MPI_NO_OP and the bitwise operations)",
		                (int)t, op);
	struct dtype *b = type_get(d->basic);
	*esz = b->size;
	return 0;
}

/* An accumulate of no data: nothing to do, whatever its datatypes (MPI),
 * once its operation, rank and displacement are valid. */
static int zero_bytes(const char *fn, MPI_Win h, struct win *w, MPI_Op op, int target, MPI_Aint disp) {
	if (!rvma_op_of(op) && !(op >= MPI_LAND && op <= MPI_MAXLOC))
		return fail_win(h, MPI_ERR_OP, fn, "invalid operation %d", op);
	int64_t tb;
	return target == MPI_PROC_NULL ? MPI_SUCCESS : target_bytes(fn, h, w, target, disp, &tb);
}

/* The unsigned rvma type of an element of n bytes (1, 2, 4 or 8). */
static int uint_of(int64_t n) {
	return n == 1 ? RVMA_UINT8 : n == 2 ? RVMA_UINT16 : n == 4 ? RVMA_UINT32 : RVMA_UINT64;
}

/* An accumulate, get_accumulate or fetch_and_op that rvma cannot apply as
 * one operation (acc_path: ACC_CAS or ACC_LOCKED): the origin's elements
 * packed (od, oc; none for MPI_NO_OP), the target's (td, tc at byte tb)
 * read, combined here by reduce_packed and written back, the target's
 * previous elements unpacked into result (rd, rcount) if any. Done, and
 * visible at the target, when it returns. */
static int emulate(const char *fn, MPI_Win h, struct win *w, int path, const void *origin, const struct dtype *od,
                   int oc, void *result, const struct dtype *rd, int rcount, const struct dtype *td, int tc,
                   MPI_Op op, int target, int64_t tb) {
	MPI_Datatype basic = td->basic;
	int64_t esz = type_get(basic)->size, bytes = td->size * tc;
	if (op != MPI_REPLACE && op != MPI_NO_OP) {
		char probe[32] = {0};
		if (reduce_packed(probe, probe, 1, basic, op))
			return fail_win(h, MPI_ERR_OP, fn, "operation %d does not apply to datatype %d", op, (int)basic);
	}
	char *t = malloc((size_t)bytes + 1), *o = op == MPI_NO_OP ? NULL : malloc((size_t)bytes + 1);
	if (!t || (op != MPI_NO_OP && !o)) {
		free(t), free(o);
		return fail_win(h, MPI_ERR_NO_MEM, fn, "out of memory");
	}
	if (o) pack(od, oc, origin, o);
	struct walk wt;
	int64_t off, len, at;
	int rc = 0;
	if (path == ACC_CAS) {
		/* Element by element: read, combine, compare-and-swap until no
		 * other update came between. */
		int ut = uint_of(esz);
		walk_init(&wt, td, tc);
		for (at = 0; !rc && walk_next(&wt, INT64_MAX, &off, &len);)
			for (int64_t k = 0; k < len && !rc; k += esz, at += esz) {
				uint64_t cur = 0, next, old = 0;
				rc = rvma_fetch_and_op(w->w, NULL, &cur, ut, RVMA_NO_OP, target, tb + off + k);
				if (!rc) rc = rvma_win_flush(w->w, target);
				while (!rc && o) {
					next = cur;
					reduce_packed(&next, o + at, 1, basic, op);
					if (next == cur) break;
					rc = rvma_compare_and_swap(w->w, &next, &cur, &old, ut, target, tb + off + k);
					if (!rc) rc = rvma_win_flush(w->w, target);
					if (rc || old == cur) break;
					cur = old;
				}
				memcpy(t + at, &cur, (size_t)esz);
			}
	} else {
		/* Under the target's mutex: read, combine, write back. */
		rvma_win m = w->self ? mx_self : mx_world;
		rc = mutex_lock(m, target);
		if (rc) goto out;
		walk_init(&wt, td, tc);
		for (at = 0; !rc && walk_next(&wt, INT64_MAX, &off, &len); at += len)
			rc = rvma_get(w->w, t + at, (size_t)len, target, tb + off);
		if (!rc) rc = rvma_win_flush(w->w, target);
		if (!rc && result) unpack(rd, rcount, t, result), result = NULL;
		if (!rc && o) {
			if (op == MPI_REPLACE)
				memcpy(t, o, (size_t)bytes);
			else
				reduce_packed(t, o, bytes / esz, basic, op);
			walk_init(&wt, td, tc);
			for (at = 0; !rc && walk_next(&wt, INT64_MAX, &off, &len); at += len)
				rc = rvma_put(w->w, t + at, (size_t)len, target, tb + off);
			if (!rc) rc = rvma_win_flush(w->w, target);
		}
		int rc2 = mutex_unlock(m, target);
		if (!rc) rc = rc2;
	}
	if (!rc && result) unpack(rd, rcount, t, result);
out:
	free(t), free(o);
	return rc ? rvfail_win(h, rc, fn) : MPI_SUCCESS;
}

static int accumulate(const char *fn, const void *origin, int oc, MPI_Datatype ot, int target, MPI_Aint disp, int tc,
                      MPI_Datatype tt, MPI_Op op, MPI_Win h, struct req *q) {
	GET_WIN(w, h, fn);
	struct dtype *od, *td;
	int cls = check_types(fn, h, ot, oc, &od, tt, tc, &td);
	if (cls) return cls;
	int64_t left = od->size * oc;
	if (left == 0) return zero_bytes(fn, h, w, op, target, disp);
	int path = acc_path(td->basic, op);
	if (path != ACC_NATIVE) {
		if (od->basic != td->basic) return fail_win(h, MPI_ERR_TYPE, fn, "origin and target datatypes have different elements");
		if (target == MPI_PROC_NULL) return MPI_SUCCESS;
		int64_t tb;
		if ((cls = target_bytes(fn, h, w, target, disp, &tb))) return cls;
		if (!origin && od->predefined) return fail_win(h, MPI_ERR_BUFFER, fn, "NULL origin buffer");
		return emulate(fn, h, w, path, origin, od, oc, NULL, NULL, 0, td, tc, op, target, tb);
	}
	int rt, rop, rt2, rop2;
	int64_t esz, esz2;
	if ((cls = acc_kind(fn, h, od, ot, op, &rt, &rop, &esz)) || (cls = acc_kind(fn, h, td, tt, op, &rt2, &rop2, &esz2)))
		return cls;
	if (rt != rt2) return fail_win(h, MPI_ERR_TYPE, fn, "origin and target datatypes have different elements");
	if (target == MPI_PROC_NULL) return MPI_SUCCESS;
	int64_t tb;
	if ((cls = target_bytes(fn, h, w, target, disp, &tb))) return cls;
	if (!origin && od->predefined) return fail_win(h, MPI_ERR_BUFFER, fn, "NULL origin buffer");
	struct walk wo, wt;
	walk_init(&wo, od, oc);
	walk_init(&wt, td, tc);
	int64_t toff = 0, tlen = 0;
	int rc = 0;
	while (left > 0 && !rc) {
		if (tlen == 0) walk_next(&wt, INT64_MAX, &toff, &tlen);
		int64_t off, len;
		walk_next(&wo, tlen, &off, &len);
		const char *o = (const char *)origin + off;
		size_t n = (size_t)(len / esz);
		rvma_request r = RVMA_REQUEST_NULL;
		rc = q ? rvma_raccumulate(w->w, o, n, rt, rop, target, tb + toff, &r)
		       : rvma_accumulate(w->w, o, n, rt, rop, target, tb + toff);
		if (!rc && q && req_push(q, r)) return fail_win(h, MPI_ERR_NO_MEM, fn, "out of memory");
		toff += len, tlen -= len, left -= len;
	}
	return rc ? rvfail_win(h, rc, fn) : MPI_SUCCESS;
}

int MPI_Accumulate(const void *origin, int oc, MPI_Datatype ot, int target, MPI_Aint disp, int tc, MPI_Datatype tt,
                   MPI_Op op, MPI_Win h) {
	return accumulate(__func__, origin, oc, ot, target, disp, tc, tt, op, h, NULL);
}

int MPI_Raccumulate(const void *origin, int oc, MPI_Datatype ot, int target, MPI_Aint disp, int tc, MPI_Datatype tt,
                    MPI_Op op, MPI_Win h, MPI_Request *request) {
	struct req *q;
	int cls = with_request(__func__, h, request, &q);
	if (cls) return cls;
	return end_request(accumulate(__func__, origin, oc, ot, target, disp, tc, tt, op, h, q), q, request);
}

/* Get_accumulate walks its three sides together: one rvma call per run
 * that is contiguous in the origin, the result and the target alike (a
 * single call when all three are contiguous). */
static int get_accumulate(const char *fn, const void *origin, int oc, MPI_Datatype ot, void *result, int rc_,
                          MPI_Datatype rtype, int target, MPI_Aint disp, int tc, MPI_Datatype tt, MPI_Op op, MPI_Win h,
                          struct req *q) {
	GET_WIN(w, h, fn);
	struct dtype *rd, *td, *od = NULL;
	int cls = check_types(fn, h, rtype, rc_, &rd, tt, tc, &td);
	if (cls) return cls;
	if (op != MPI_NO_OP) {
		const char *why;
		if ((cls = type_check(ot, oc, &od, &why))) return fail_win(h, cls, fn, "origin: %s (%d)", why, (int)ot);
		if (od->size * oc != td->size * tc) return fail_win(h, MPI_ERR_TYPE, fn, "origin and target sizes differ");
	}
	int64_t left = td->size * tc;
	if (left == 0) return zero_bytes(fn, h, w, op, target, disp);
	int path = acc_path(td->basic, op);
	if (path != ACC_NATIVE) {
		if (rd->basic != td->basic || (od && od->basic != td->basic))
			return fail_win(h, MPI_ERR_TYPE, fn, "the datatypes have different elements");
		if (target == MPI_PROC_NULL) return MPI_SUCCESS;
		int64_t tb;
		if ((cls = target_bytes(fn, h, w, target, disp, &tb))) return cls;
		if (!result && rd->predefined) return fail_win(h, MPI_ERR_BUFFER, fn, "NULL result buffer");
		if (od && !origin && od->predefined) return fail_win(h, MPI_ERR_BUFFER, fn, "NULL origin buffer");
		return emulate(fn, h, w, path, origin, od, oc, result, rd, rc_, td, tc, op, target, tb);
	}
	int rt, rop, rt2, rop2;
	int64_t esz, esz2;
	if ((cls = acc_kind(fn, h, td, tt, op, &rt, &rop, &esz)) || (cls = acc_kind(fn, h, rd, rtype, op, &rt2, &rop2, &esz2)))
		return cls;
	if (rt2 != rt) return fail_win(h, MPI_ERR_TYPE, fn, "the datatypes have different elements");
	if (od && (cls = acc_kind(fn, h, od, ot, op, &rt2, &rop2, &esz2))) return cls;
	if (rt2 != rt) return fail_win(h, MPI_ERR_TYPE, fn, "the datatypes have different elements");
	if (target == MPI_PROC_NULL) return MPI_SUCCESS;
	int64_t tb;
	if ((cls = target_bytes(fn, h, w, target, disp, &tb))) return cls;
	if (!result && rd->predefined) return fail_win(h, MPI_ERR_BUFFER, fn, "NULL result buffer");
	if (od && !origin && od->predefined) return fail_win(h, MPI_ERR_BUFFER, fn, "NULL origin buffer");
	struct walk wo, wr, wt;
	if (od) walk_init(&wo, od, oc);
	walk_init(&wr, rd, rc_);
	walk_init(&wt, td, tc);
	int64_t toff = 0, tlen = 0, roff = 0, rlen = 0, ooff = 0, olen = 0;
	int rc = 0;
	while (left > 0 && !rc) {
		if (tlen == 0) walk_next(&wt, INT64_MAX, &toff, &tlen);
		if (rlen == 0) walk_next(&wr, INT64_MAX, &roff, &rlen);
		if (od && olen == 0) walk_next(&wo, INT64_MAX, &ooff, &olen);
		int64_t len = tlen < rlen ? tlen : rlen;
		if (od && olen < len) len = olen;
		const void *o = od ? (const char *)origin + ooff : NULL;
		rvma_request r = RVMA_REQUEST_NULL;
		size_t n = (size_t)(len / esz);
		rc = q ? rvma_rget_accumulate(w->w, o, (char *)result + roff, n, rt, rop, target, tb + toff, &r)
		       : rvma_get_accumulate(w->w, o, (char *)result + roff, n, rt, rop, target, tb + toff);
		if (!rc && q && req_push(q, r)) return fail_win(h, MPI_ERR_NO_MEM, fn, "out of memory");
		toff += len, tlen -= len, roff += len, rlen -= len, left -= len;
		if (od) ooff += len, olen -= len;
	}
	return rc ? rvfail_win(h, rc, fn) : MPI_SUCCESS;
}

int MPI_Get_accumulate(const void *origin, int oc, MPI_Datatype ot, void *result, int rcount, MPI_Datatype rt,
                       int target, MPI_Aint disp, int tc, MPI_Datatype tt, MPI_Op op, MPI_Win h) {
	return get_accumulate(__func__, origin, oc, ot, result, rcount, rt, target, disp, tc, tt, op, h, NULL);
}

int MPI_Rget_accumulate(const void *origin, int oc, MPI_Datatype ot, void *result, int rcount, MPI_Datatype rt,
                        int target, MPI_Aint disp, int tc, MPI_Datatype tt, MPI_Op op, MPI_Win h, MPI_Request *request) {
	struct req *q;
	int cls = with_request(__func__, h, request, &q);
	if (cls) return cls;
	return end_request(get_accumulate(__func__, origin, oc, ot, result, rcount, rt, target, disp, tc, tt, op, h, q), q,
	                   request);
}

int MPI_Fetch_and_op(const void *origin, void *result, MPI_Datatype t, int target, MPI_Aint disp, MPI_Op op, MPI_Win h) {
	GET_WIN(w, h, __func__);
	struct dtype *d = type_get(t);
	if (!d || !d->predefined) return fail_win(h, MPI_ERR_TYPE, __func__, "datatype %d: a predefined one is needed", t);
	int rt, rop, cls;
	int64_t esz;
	int path = acc_path(t, op);
	if (path != ACC_NATIVE) {
		if (op < MPI_MAX || op > MPI_NO_OP) return fail_win(h, MPI_ERR_OP, __func__, "invalid operation %d", op);
		if (target == MPI_PROC_NULL) return MPI_SUCCESS;
		int64_t tb;
		if ((cls = target_bytes(__func__, h, w, target, disp, &tb))) return cls;
		return emulate(__func__, h, w, path, origin, d, 1, result, d, 1, d, 1, op, target, tb);
	}
	if ((cls = acc_kind(__func__, h, d, t, op, &rt, &rop, &esz))) return cls;
	if (target == MPI_PROC_NULL) return MPI_SUCCESS;
	int64_t tb;
	if ((cls = target_bytes(__func__, h, w, target, disp, &tb))) return cls;
	int rc = rvma_fetch_and_op(w->w, op == MPI_NO_OP ? NULL : origin, result, rt, rop, target, tb);
	return rc ? rvfail_win(h, rc, __func__) : MPI_SUCCESS;
}

int MPI_Compare_and_swap(const void *origin, const void *compare, void *result, MPI_Datatype t, int target,
                         MPI_Aint disp, MPI_Win h) {
	GET_WIN(w, h, __func__);
	struct dtype *d = type_get(t);
	if (!d || !d->predefined) return fail_win(h, MPI_ERR_TYPE, __func__, "datatype %d: a predefined one is needed", t);
	int rt, rop, cls;
	int64_t esz;
	if (acc_path(t, MPI_REPLACE) != ACC_NATIVE)
		return fail_win(h, MPI_ERR_TYPE, __func__, "datatype %d: compare-and-swap takes integer, logical, byte "
		                "and floating elements of 8 bytes or less", (int)t);
	if ((cls = acc_kind(__func__, h, d, t, MPI_REPLACE, &rt, &rop, &esz))) return cls;
	if (target == MPI_PROC_NULL) return MPI_SUCCESS;
	int64_t tb;
	if ((cls = target_bytes(__func__, h, w, target, disp, &tb))) return cls;
	int rc = rvma_compare_and_swap(w->w, origin, compare, result, rt, target, tb);
	return rc ? rvfail_win(h, rc, __func__) : MPI_SUCCESS;
}

/* ---- Synchronisation ---------------------------------------------------- */

static int rv_assert(int a) {
	return (a & MPI_MODE_NOCHECK ? RVMA_MODE_NOCHECK : 0) | (a & MPI_MODE_NOSTORE ? RVMA_MODE_NOSTORE : 0) |
	       (a & MPI_MODE_NOPUT ? RVMA_MODE_NOPUT : 0) | (a & MPI_MODE_NOPRECEDE ? RVMA_MODE_NOPRECEDE : 0) |
	       (a & MPI_MODE_NOSUCCEED ? RVMA_MODE_NOSUCCEED : 0);
}

#define SIMPLE(name, call)                                               \
	int name(MPI_Win h) {                                            \
		GET_WIN(w, h, __func__);                                 \
		int rc = call;                                           \
		return rc ? rvfail_win(h, rc, __func__) : MPI_SUCCESS;   \
	}

SIMPLE(MPI_Win_complete, rvma_win_complete(w->w))
SIMPLE(MPI_Win_wait, rvma_win_wait(w->w))
int MPI_Win_unlock_all(MPI_Win h) {
	GET_WIN(w, h, __func__);
	int rc = rvma_win_unlock_all(w->w);
	if (rc) return rvfail_win(h, rc, __func__);
	w->lock_all = 0;
	return MPI_SUCCESS;
}

/* Flushes are for passive target epochs (MPI: MPI_ERR_RMA_SYNC outside
 * one; rvma would flush in any epoch). */
static int passive(const char *fn, MPI_Win h, struct win *w, int rank) {
	if (w->notified || (rank >= 0 ? w->lock_all || w->locked[rank] : w->lock_all || w->nlocked > 0)) return 0;
	if (rank >= 0) return fail_win(h, MPI_ERR_RMA_SYNC, fn, "no passive target epoch towards rank %d (lock it first)", rank);
	return fail_win(h, MPI_ERR_RMA_SYNC, fn, "no passive target epoch (MPI_Win_lock or MPI_Win_lock_all first)");
}

int MPI_Win_flush_all(MPI_Win h) {
	GET_WIN(w, h, __func__);
	int cls = passive(__func__, h, w, -1);
	if (cls) return cls;
	int rc = rvma_win_flush_all(w->w);
	return rc ? rvfail_win(h, rc, __func__) : MPI_SUCCESS;
}

int MPI_Win_flush_local_all(MPI_Win h) {
	GET_WIN(w, h, __func__);
	int cls = passive(__func__, h, w, -1);
	if (cls) return cls;
	int rc = rvma_win_flush_local_all(w->w);
	return rc ? rvfail_win(h, rc, __func__) : MPI_SUCCESS;
}
SIMPLE(MPI_Win_sync, rvma_win_sync(w->w))

int MPI_Win_unlock(int rank, MPI_Win h) {
	GET_WIN(w, h, __func__);
	if (rank == MPI_PROC_NULL) return MPI_SUCCESS;
	int rc = rvma_win_unlock(w->w, rank);
	if (rc) return rvfail_win(h, rc, __func__);
	if (w->locked[rank]) w->locked[rank] = 0, w->nlocked--;
	return MPI_SUCCESS;
}

#define FLUSH(name, call)                                                                                          \
	int name(int rank, MPI_Win h) {                                                                            \
		GET_WIN(w, h, __func__);                                                                           \
		if (rank == MPI_PROC_NULL) return MPI_SUCCESS;                                                     \
		if (rank < 0 || rank >= w->nranks)                                                                 \
			return fail_win(h, MPI_ERR_RANK, __func__, "rank %d not in the window's group of %d", rank, w->nranks); \
		int cls = passive(__func__, h, w, rank);                                                           \
		if (cls) return cls;                                                                               \
		int rc = call;                                                                                     \
		return rc ? rvfail_win(h, rc, __func__) : MPI_SUCCESS;                                             \
	}

FLUSH(MPI_Win_flush, rvma_win_flush(w->w, rank))
FLUSH(MPI_Win_flush_local, rvma_win_flush_local(w->w, rank))

int MPI_Win_fence(int a, MPI_Win h) {
	GET_WIN(w, h, __func__);
	int rc = rvma_win_fence(w->w, rv_assert(a));
	return rc ? rvfail_win(h, rc, __func__) : MPI_SUCCESS;
}

static int pscw(const char *fn, int post, MPI_Group gh, int a, MPI_Win h) {
	GET_WIN(w, h, fn);
	struct group *g = group_get(gh);
	if (!g) return fail_win(h, MPI_ERR_GROUP, fn, "invalid group %d", gh);
	const int *ranks = g->ranks;
	int zero = 0;
	if (w->self && g->n > 0) {
		/* groups hold world ranks; the window's only rank is 0 */
		if (g->n > 1 || g->ranks[0] != rv_rank)
			return fail_win(h, MPI_ERR_GROUP, fn, "a window over MPI_COMM_SELF has this process only");
		ranks = &zero;
	}
	int rc = post ? rvma_win_post(w->w, ranks, g->n, rv_assert(a)) : rvma_win_start(w->w, ranks, g->n, rv_assert(a));
	return rc ? rvfail_win(h, rc, fn) : MPI_SUCCESS;
}

int MPI_Win_post(MPI_Group g, int a, MPI_Win h) { return pscw(__func__, 1, g, a, h); }

int MPI_Win_start(MPI_Group g, int a, MPI_Win h) { return pscw(__func__, 0, g, a, h); }

int MPI_Win_test(MPI_Win h, int *flag) {
	GET_WIN(w, h, __func__);
	if (!flag) return fail_win(h, MPI_ERR_ARG, __func__, "NULL flag");
	int rc = rvma_win_test(w->w, flag);
	return rc ? rvfail_win(h, rc, __func__) : MPI_SUCCESS;
}

int MPI_Win_lock(int type, int rank, int a, MPI_Win h) {
	(void)a;
	GET_WIN(w, h, __func__);
	if (type != MPI_LOCK_SHARED && type != MPI_LOCK_EXCLUSIVE)
		return fail_win(h, MPI_ERR_LOCKTYPE, __func__, "lock type %d", type);
	if (rank == MPI_PROC_NULL) return MPI_SUCCESS;
	int rc = rvma_win_lock(w->w, type == MPI_LOCK_SHARED ? RVMA_LOCK_SHARED : RVMA_LOCK_EXCLUSIVE, rank);
	if (rc) return rvfail_win(h, rc, __func__);
	if (rank >= 0 && rank < w->nranks && !w->locked[rank]) w->locked[rank] = 1, w->nlocked++;
	return MPI_SUCCESS;
}

int MPI_Win_lock_all(int a, MPI_Win h) {
	(void)a;
	GET_WIN(w, h, __func__);
	int rc = rvma_win_lock_all(w->w);
	if (rc) return rvfail_win(h, rc, __func__);
	w->lock_all = 1;
	return MPI_SUCCESS;
}

/* ---- rvma's extensions (mpix_rvma.h) ------------------------------------ */

/* cfg as rvma's configuration (counts into counts, nfrom of them): 0 or a
 * class. */
static int notify_config(const char *fn, MPI_Comm c, const MPIX_Notify *cfg, rvma_notify_config *nc, int64_t **counts) {
	*counts = NULL;
	if (!cfg) return fail_comm(c, MPI_ERR_ARG, fn, "NULL MPIX_Notify");
	int n = comm_nranks(c);
	if (cfg->nfrom < 0 || cfg->nfrom > n || (cfg->nfrom > 0 && (!cfg->from_ranks || !cfg->from_counts)))
		return fail_comm(c, MPI_ERR_ARG, fn, "nfrom %d (0..%d) or NULL from_ranks/from_counts", cfg->nfrom, n);
	if (cfg->count != MPIX_NOTIFY_BYTES && cfg->count != MPIX_NOTIFY_PUTS)
		return fail_comm(c, MPI_ERR_ARG, fn, "count %d: MPIX_NOTIFY_BYTES or MPIX_NOTIFY_PUTS", cfg->count);
	for (int i = 0; i < cfg->nfrom; i++)
		if (cfg->from_ranks[i] < 0 || cfg->from_ranks[i] >= n)
			return fail_comm(c, MPI_ERR_RANK, fn, "from_ranks[%d] = %d of %d ranks", i, cfg->from_ranks[i], n);
	*nc = (rvma_notify_config){.expect = cfg->expect, .nexpect_from = cfg->nfrom, .count = cfg->count,
	                           .depth = cfg->depth, .history = cfg->history};
	if (cfg->nfrom > 0) {
		if (!(*counts = malloc(sizeof(int64_t) * (size_t)cfg->nfrom))) return fail_comm(c, MPI_ERR_NO_MEM, fn, "out of memory");
		for (int i = 0; i < cfg->nfrom; i++) (*counts)[i] = cfg->from_counts[i];
		nc->expect_from_ranks = cfg->from_ranks, nc->expect_from_counts = *counts;
	}
	return 0;
}

int MPIX_Win_allocate_notified(MPI_Aint size, int disp_unit, const MPIX_Notify *cfg, MPI_Info info, MPI_Comm c,
                               void *baseptr, MPI_Win *win) {
	(void)info;
	rvma_notify_config nc;
	int64_t *counts;
	int cls = notify_config(__func__, c, cfg, &nc, &counts);
	if (!cls) cls = create(__func__, WIN_ALLOC, NULL, size, disp_unit, c, baseptr, win, &nc);
	free(counts);
	return cls;
}

int MPIX_Win_create_notified(void *base, MPI_Aint size, int disp_unit, const MPIX_Notify *cfg, MPI_Info info,
                             MPI_Comm c, MPI_Win *win) {
	(void)info;
	rvma_notify_config nc;
	int64_t *counts;
	int cls = notify_config(__func__, c, cfg, &nc, &counts);
	if (!cls) cls = create(__func__, WIN_CREATE, base, size, disp_unit, c, NULL, win, &nc);
	free(counts);
	return cls;
}

int MPIX_Win_wait_epoch(MPI_Win h, MPI_Count *epoch) {
	GET_WIN(w, h, __func__);
	uint64_t e = 0;
	int rc = rvma_win_wait_epoch(w->w, &e);
	if (rc) return rvfail_win(h, rc, __func__);
	if (epoch) *epoch = (MPI_Count)e;
	return MPI_SUCCESS;
}

int MPIX_Win_test_epoch(MPI_Win h, int *flag, MPI_Count *epoch) {
	GET_WIN(w, h, __func__);
	if (!flag) return fail_win(h, MPI_ERR_ARG, __func__, "NULL flag");
	uint64_t e = 0;
	int rc = rvma_win_test_epoch(w->w, flag, &e);
	if (rc) return rvfail_win(h, rc, __func__);
	if (epoch && *flag) *epoch = (MPI_Count)e;
	return MPI_SUCCESS;
}

int MPIX_Win_epoch(MPI_Win h, MPI_Count *epoch) {
	GET_WIN(w, h, __func__);
	if (!epoch) return fail_win(h, MPI_ERR_ARG, __func__, "NULL epoch");
	uint64_t e = 0;
	int rc = rvma_win_epoch(w->w, &e);
	if (rc) return rvfail_win(h, rc, __func__);
	*epoch = (MPI_Count)e;
	return MPI_SUCCESS;
}

SIMPLE(MPIX_Win_abandon_epoch, rvma_win_abandon_epoch(w->w))

int MPIX_Win_rewind(MPI_Win h, int k, MPI_Count *epoch) {
	GET_WIN(w, h, __func__);
	uint64_t e = 0;
	int rc = rvma_win_rewind(w->w, k, &e);
	if (rc == RVMA_ERR_NOT_RETAINED)
		return fail_win(h, MPI_ERR_RMA_RANGE, __func__, "%s (%s)", rvma_last_error_message(), rvma_strerror(rc));
	if (rc) return rvfail_win(h, rc, __func__);
	if (epoch) *epoch = (MPI_Count)e;
	return MPI_SUCCESS;
}

int MPIX_Comm_transport(MPI_Comm c, int rank, char *name, int *len) {
	if (NOT_INIT(__func__)) return MPI_ERR_OTHER;
	if (comm_ctx(c) == -1) return fail_comm(c, MPI_ERR_COMM, __func__, "invalid communicator %d", c);
	if (comm_ctx(c) == -2) {
		if (rank != 0) return fail_comm(c, MPI_ERR_RANK, __func__, "rank %d of MPI_COMM_SELF", rank);
		rank = rv_rank;
	}
	if (rank < 0 || rank >= rv_size) return fail_comm(c, MPI_ERR_RANK, __func__, "rank %d of %d", rank, rv_size);
	if (!name || !len) return fail_comm(c, MPI_ERR_ARG, __func__, "NULL name or resultlen");
	const char *s = "";
	int rc = rvma_comm_transport(rv_world, rank, &s);
	if (rc) return rvfail_comm(c, rc, __func__);
	snprintf(name, MPIX_MAX_TRANSPORT_NAME, "%s", s ? s : "");
	*len = (int)strlen(name);
	return MPI_SUCCESS;
}
