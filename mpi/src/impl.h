/* The internals of libmpi shared by its files (not installed). */
#ifndef RVMA_MPI_IMPL_H
#define RVMA_MPI_IMPL_H

#include <pthread.h>
#include <stdint.h>

#include "mpi.h"
#include "rvma.h"

/* The world: every communicator of this library is the world or a
 * duplicate of it (same ranks), so rank r of any of them is rank r of
 * rv_world. */
extern rvma_comm rv_world;
extern int rv_rank, rv_size, rv_up;

/* One lock for the handle tables (held briefly, never across a call into
 * librvma). */
extern pthread_mutex_t rv_mu;

/* A growing table of pointers; handle = index, slots below first are
 * reserved for predefined handles. */
struct table {
	void **v;
	int n, first, hint;
};
int tbl_add(struct table *t, void *p); /* the handle, or -1 */
void *tbl_get(struct table *t, int h);
void *tbl_del(struct table *t, int h);

/* Errors. Each failing call records a message (thread local), then the
 * handler decides: return the class, or print and abort. */
int fail_comm(MPI_Comm comm, int cls, const char *fn, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
int fail_win(MPI_Win win, int cls, const char *fn, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* rvma's code rc as an MPI class (handle: the class of an invalid handle
 * in this call), with rvma's message. */
int rv_class(int rc, int handle_class);
int rvfail_comm(MPI_Comm comm, int rc, const char *fn);
int rvfail_win(MPI_Win win, int rc, const char *fn);

/* The program's window error handlers: the function of a handle (NULL if
 * it is none), and a reference more (d 1) or less (d -1). */
MPI_Win_errhandler_function *eh_user(MPI_Errhandler e);
void eh_ref(MPI_Errhandler e, int d);

#define NOT_INIT(fn) (!rv_up ? fail_comm(MPI_COMM_WORLD, MPI_ERR_OTHER, fn, "MPI is not initialized (or finalized)") : 0)

/* Communicators: their tag context (tags are shifted into the upper bits
 * of rvma's 30-bit tags). */
int comm_ctx(MPI_Comm comm); /* -1 if invalid, -2 for MPI_COMM_SELF */

/* Groups: world ranks. */
struct group {
	int n;
	int *ranks;
};
struct group *group_get(MPI_Group g);

/* Datatypes: a list of blocks (byte offsets and lengths, merged when
 * adjacent) and, when the blocks are uniform, the strided layout they
 * form. */
struct blk {
	int64_t off, len;
};
struct dtype {
	int predefined, committed;
	int basic;        /* the predefined type it is made of, 0 if none */
	int64_t size;     /* bytes of data */
	int64_t extent;   /* ub - lb */
	int64_t tlb;      /* the lower bound (MPI_Type_get_extent's lb) */
	int64_t nblk;
	struct blk *blk;
	int uniform;      /* blk[] is one strided layout: */
	int64_t off0, lc, lb, ls;
};
struct dtype *type_get(MPI_Datatype t); /* NULL if invalid */
/* rvma's element type of a predefined type, 0 if none. */
int type_rvma(MPI_Datatype basic);
/* The unsigned rvma type of a predefined type's size for the types
 * without arithmetic that accumulates may still replace, fetch or combine
 * bit by bit (MPI_BYTE, MPI_PACKED, MPI_C_BOOL, MPI_WCHAR; MPI_2INT and
 * MPI_FLOAT_INT replaced and fetched whole, not bitwise), 0 if none. */
int type_rvma_bits(MPI_Datatype basic, int bitwise);
/* The alignment of a predefined type (1..16). */
int64_t type_align(MPI_Datatype basic);
/* Checks a datatype and count for a communication call: 0 or a class
 * (message recorded by the caller through fail_*; *why says). */
int type_check(MPI_Datatype t, int count, struct dtype **out, const char **why);
/* The strided layout of count copies of t, if one: 1, else 0. */
int layout_of(const struct dtype *t, int64_t count, rvma_layout *l, int64_t *off0);
/* Whether count copies of t are one run of bytes from offset 0. */
int dense(const struct dtype *t, int64_t count);
void pack(const struct dtype *t, int64_t count, const void *from, void *to);
void unpack(const struct dtype *t, int64_t count, const void *from, void *to);

/* inout[i] = inout[i] op in[i] for n elements of the predefined type
 * basic, packed (a pair's value then its index, without the gap C puts
 * between them): MPI's arithmetic, logical and bitwise operations, and
 * MINLOC and MAXLOC on pairs. 0, MPI_ERR_OP or MPI_ERR_TYPE. */
int reduce_packed(void *inout, const void *in, int64_t n, MPI_Datatype basic, MPI_Op op);
/* How an accumulate of elements of basic with op is applied: by rvma
 * (ACC_NATIVE); read and compare-and-swapped element by element, for
 * operations rvma lacks on elements of 8 bytes or less, so that they
 * stay atomic with rvma's own (ACC_CAS); or read, combined and written
 * back under a per-target mutex, for every accumulate of long double and
 * the gapped pairs, which no rvma atomic covers (ACC_LOCKED). */
enum { ACC_NATIVE, ACC_CAS, ACC_LOCKED };
int acc_path(MPI_Datatype basic, MPI_Op op);
/* Frees what windows share (MPI_Finalize). */
void win_finalize(void);

/* A walk over the blocks of count copies of a type. */
struct walk {
	const struct dtype *t;
	int64_t count, i, j, used;
};
void walk_init(struct walk *w, const struct dtype *t, int64_t count);
/* The next run of up to max bytes: 1 with *off and *len, 0 at the end. */
int walk_next(struct walk *w, int64_t max, int64_t *off, int64_t *len);

/* Requests. */
enum { REQ_RVMA = 1, REQ_RECV, REQ_DONE };
struct req {
	int kind;
	int n, cap;
	rvma_request *r; /* REQ_RVMA */
	/* REQ_RECV: rvma's source, tag and tag mask of the match; a
	 * staging buffer when the datatype is not dense; active while a wait
	 * blocks in rvma_recv_match for it; key the rvma key of a wait in
	 * progress for it (MPI_THREAD_MULTIPLE: a wait MPI_Cancel can end),
	 * 0 if none */
	MPI_Comm comm;
	int src, tag, rtag, mask, active;
	uint64_t key;
	void *buf, *tmp;
	int count;
	MPI_Datatype type;
	struct dtype *d;
	struct req *next;
	/* REQ_DONE (and a failed REQ_RVMA's class and message) */
	MPI_Status st;
	int err;
	char msg[400];
};
struct req *req_new(int kind, MPI_Request *h); /* NULL: out of handles */
int req_push(struct req *q, rvma_request r);     /* 0 or -1 */
void req_drop(MPI_Request h);

#endif
