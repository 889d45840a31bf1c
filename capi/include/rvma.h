/*
 * rvma.h: the C API of rvma's one-sided communication (the Go package rma).
 *
 * Link with librvma (pkg-config --cflags --libs rvma). Programs run under
 * rvma's launcher (rvmarun -n N prog), MPICH's mpiexec (PMI-1), or Slurm
 * with RVMA_RENDEZVOUS, as Go programs do; alone they are a world of one.
 *
 * Conventions
 *
 *   Errors. Every function returns RVMA_SUCCESS (0) or one of the rvma_error
 *   codes below; it changes its output arguments only on success, except
 *   rvma_recv's length on RVMA_ERR_TRUNCATE and the handles that
 *   rvma_win_free and the request calls free whatever the outcome (the
 *   window or request is gone even when its operation failed).
 *   rvma_strerror(code) names a
 *   code; rvma_last_error_message() is the full message of the last call
 *   that failed on the calling thread (the operation, the rank and the
 *   cause), valid until that thread's next failing call.
 *
 *   Argument checks. What the library can check it does, before anything
 *   moves: invalid or freed handles (RVMA_ERR_HANDLE), NULL with a non-zero
 *   length, a length or count that does not fit the address space, unknown
 *   enumerators (RVMA_ERR_ARG), ranks (RVMA_ERR_RANK), displacements outside
 *   the target's window (RVMA_ERR_BOUNDS), calls outside an epoch
 *   (RVMA_ERR_EPOCH). It cannot tell that a non-NULL pointer points to as
 *   many bytes as the length says: that is the caller's promise.
 *   A collective call (window creation, fence, barrier, ...) that fails its
 *   argument checks on one rank only returns at once there: window creation
 *   still fails on every rank (it agrees on failure), the others may wait.
 *
 *   Handles. rvma_comm, rvma_win and rvma_request are integer handles
 *   indexing tables inside the library, never pointers; 0 is the null
 *   handle of each. A freed or foreign handle is RVMA_ERR_HANDLE, not a
 *   crash.
 *
 *   Buffers. The caller owns every buffer it passes; the library keeps no
 *   pointer to it beyond what the call documents. Origin buffers of puts
 *   and accumulates must not change, and result buffers of gets and
 *   fetching operations must not be read or freed, until the operation has
 *   completed (its request, or the next flush, unlock, complete or fence).
 *   Memory given to rvma_win_create[_notified] is the window's memory until
 *   rvma_win_free returns on this rank: it must stay allocated until then.
 *   Memory from rvma_win_allocate[_notified] belongs to the library and is
 *   released by rvma_win_free.
 *
 *   Threads. The library is thread safe (MPI_THREAD_MULTIPLE), with MPI's
 *   usual restrictions: synchronisation calls on one window (fence,
 *   start/complete, post/wait, lock/unlock of one target) are made by one
 *   thread at a time, and every rank calls collectives in the same order.
 *   Blocking calls block the calling thread only; a background thread of
 *   the library makes progress meanwhile.
 *
 *   Types. Datatypes are little-endian elements (int32 ... double); data
 *   movement is in bytes, with rvma_layout for strided data (MPI's vector
 *   type, in bytes). Displacements are in the target window's disp_unit.
 */
#ifndef RVMA_H
#define RVMA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define RVMA_API_VERSION 1

/* Handles. */
typedef uint64_t rvma_comm;
typedef uint64_t rvma_win;
typedef uint64_t rvma_request;
#define RVMA_COMM_NULL ((rvma_comm)0)
#define RVMA_WIN_NULL ((rvma_win)0)
#define RVMA_REQUEST_NULL ((rvma_request)0)

/* Error codes. */
typedef enum rvma_error {
	RVMA_SUCCESS = 0,
	RVMA_ERR_ARG = 1,          /* invalid argument: NULL with a length, bad count, unknown enumerator */
	RVMA_ERR_HANDLE = 2,       /* invalid, freed or foreign handle */
	RVMA_ERR_RANK = 3,         /* rank not in the communicator */
	RVMA_ERR_BOUNDS = 4,       /* access outside the target's window */
	RVMA_ERR_EPOCH = 5,        /* no access epoch open for the target (MPI_ERR_RMA_SYNC) */
	RVMA_ERR_SYNC = 6,         /* synchronisation call out of order (MPI_ERR_RMA_SYNC) */
	RVMA_ERR_DATATYPE = 7,     /* datatype/op mismatch, bad layout, unequal lengths */
	RVMA_ERR_PEER = 8,         /* a peer failed or is unreachable */
	RVMA_ERR_REMOTE = 9,       /* a collective call failed on another rank */
	RVMA_ERR_CLOSED = 10,      /* the communicator or window is closed */
	RVMA_ERR_BOOTSTRAP = 11,   /* the environment describes no usable job */
	RVMA_ERR_STATE = 12,       /* not initialized, already initialized, or finalized */
	RVMA_ERR_NOT_RETAINED = 13,/* rewind further back than the window's history */
	RVMA_ERR_REFUSED = 14,     /* a notified put refused by the target */
	RVMA_ERR_TRUNCATE = 15,    /* a received message is longer than the buffer */
	RVMA_ERR_TIMEOUT = 16,     /* a bounded wait ran out */
	RVMA_ERR_UNSUPPORTED = 17, /* not implemented, or not by this provider */
	RVMA_ERR_RESOURCE = 18,    /* out of memory or handles */
	RVMA_ERR_OTHER = 19,       /* anything else: see rvma_last_error_message() */
	RVMA_ERR_CANCELLED = 20    /* a wait ended by rvma_msg_cancel */
} rvma_error;

/* The name of an error code ("RVMA_ERR_BOUNDS: access outside the target
 * window"); a static string, never NULL. */
const char *rvma_strerror(int code);

/* The message of the last call that failed on the calling thread, or "".
 * The string belongs to the library (thread-local storage) and stays valid
 * until the thread's next failing call. */
const char *rvma_last_error_message(void);

/* Element types of accumulates, atomics and reductions. */
typedef enum rvma_datatype {
	RVMA_INT32 = 1,
	RVMA_INT64 = 2,
	RVMA_UINT32 = 3,
	RVMA_UINT64 = 4,
	RVMA_FLOAT = 5,
	RVMA_DOUBLE = 6,
	RVMA_INT8 = 7,
	RVMA_UINT8 = 8,
	RVMA_INT16 = 9,
	RVMA_UINT16 = 10
} rvma_datatype;

/* Accumulate operations (MPI's predefined ones; BAND, BOR, BXOR on
 * integers only). Reductions (rvma_allreduce_*) take SUM, MIN and MAX. */
typedef enum rvma_op {
	RVMA_SUM = 1,
	RVMA_PROD = 2,
	RVMA_MIN = 3,
	RVMA_MAX = 4,
	RVMA_BAND = 5,
	RVMA_BOR = 6,
	RVMA_BXOR = 7,
	RVMA_REPLACE = 8,
	RVMA_NO_OP = 9
} rvma_op;

/* Lock types. */
enum { RVMA_LOCK_EXCLUSIVE = 1, RVMA_LOCK_SHARED = 2 };

/* Assertions of fence, post and start (MPI_MODE_*). rvma acts on
 * NOSUCCEED (no epoch follows the fence); the others, and unknown bits,
 * are accepted as hints. */
enum {
	RVMA_MODE_NOCHECK = 1,
	RVMA_MODE_NOSTORE = 2,
	RVMA_MODE_NOPUT = 4,
	RVMA_MODE_NOPRECEDE = 8,
	RVMA_MODE_NOSUCCEED = 16
};

/* The largest tag of rvma_send and rvma_recv (tags are 0..RVMA_TAG_UB). */
#define RVMA_TAG_UB ((1 << 30) - 1)
/* The source of rvma_recv_match that matches every rank. */
#define RVMA_ANY_SOURCE (-1)

/* Strided data: count blocks of block bytes, stride bytes apart (stride >=
 * block when count > 1). It spans (count-1)*stride + block bytes. */
typedef struct rvma_layout {
	int64_t count, block, stride;
} rvma_layout;

/* One piece of an indexed transfer (rvma_put_runs, rvma_get_runs): len
 * bytes at origin + origin_off and at the target's disp + target_off (in
 * the target's displacement units, as disp). */
typedef struct rvma_run {
	int64_t origin_off, target_off, len;
} rvma_run;

/* What a notified window counts. */
enum { RVMA_COUNT_BYTES = 0, RVMA_COUNT_OPS = 1 };

/* A notified window (RVMA's): the target says how many bytes (or puts)
 * complete an epoch, and rvma_win_wait_epoch returns when they have
 * arrived, with no fence and no message. Puts into it need no epoch.
 * Zeroed fields mean defaults. */
typedef struct rvma_notify_config {
	/* Bytes (or puts) per epoch from all origins together, used when
	 * nexpect_from is 0. */
	int64_t expect;
	/* Or per origin: nexpect_from ranks and what each must put per epoch
	 * (each origin has its own mailbox, so one that runs ahead is never
	 * counted into the current epoch; a put from a rank not listed is
	 * refused with RVMA_ERR_EPOCH). Read during the call only. */
	const int *expect_from_ranks;
	const int64_t *expect_from_counts;
	int nexpect_from;
	/* RVMA_COUNT_BYTES (default) or RVMA_COUNT_OPS (each contiguous run
	 * of target bytes of a put counts one). */
	int count;
	/* Epochs posted ahead (default 2, 1..64). */
	int depth;
	/* Completed epochs kept for rvma_win_rewind (default 0). */
	int history;
} rvma_notify_config;

/* The library's Go side declares these functions itself, without const:
 * it includes this header for the types only. */
#ifndef RVMA_TYPES_ONLY

/* ---- Process and communicator ---------------------------------------- */

/* Bootstraps this process's rank from the environment (rvmarun, Hydra's
 * PMI-1, Slurm, else a world of one) and returns the world communicator.
 * Collective over the job. Once per process: a second call, or one after
 * rvma_finalize, fails with RVMA_ERR_STATE. */
int rvma_init(rvma_comm *world);

/* Ends the world communicator (collective: waits for every rank, bounded
 * once an operation failed). Windows not freed are released; every handle
 * becomes invalid. Call it when no other thread is inside the library. */
int rvma_finalize(void);

/* This process alone as a communicator of one rank (MPI_COMM_SELF), made
 * at the first call and the same handle after; not collective. Windows
 * over it are this process's memory, with every operation and
 * synchronisation of a window (rank 0 is this process). Ended by
 * rvma_finalize. RVMA_ERR_STATE before rvma_init. */
int rvma_comm_self(rvma_comm *self);

/* Whether rvma_init, resp. rvma_finalize, has succeeded (callable any
 * time, from any thread). */
int rvma_initialized(int *flag);
int rvma_finalized(int *flag);

int rvma_comm_rank(rvma_comm comm, int *rank);
int rvma_comm_size(rvma_comm comm, int *size);

/* The provider of this rank's connection to rank: "shm", "udp" or "loop",
 * or "" before the first operation toward it connected it. A static
 * string. */
int rvma_comm_transport(rvma_comm comm, int rank, const char **name);

/* ---- Collectives and messages ---------------------------------------- */

int rvma_barrier(rvma_comm comm);

/* Copies root's len bytes at buf into every rank's buf (same len
 * everywhere). */
int rvma_bcast(rvma_comm comm, int root, void *buf, size_t len);

/* Gathers len bytes from every rank into out (size*len bytes, rank
 * order). Every rank passes the same len (RVMA_ERR_DATATYPE otherwise). */
int rvma_allgather(rvma_comm comm, const void *mine, size_t len, void *out);

/* Replaces vals[0..count) on every rank by the element-wise reduction over
 * all ranks (op RVMA_SUM, RVMA_MIN or RVMA_MAX; the same count
 * everywhere). Doubles are reduced in rank order: every rank gets the
 * same bits. */
int rvma_allreduce_int64(rvma_comm comm, rvma_op op, int64_t *vals, size_t count);
int rvma_allreduce_double(rvma_comm comm, rvma_op op, double *vals, size_t count);

/* Point-to-point messages (0 <= tag <= RVMA_TAG_UB); messages from one
 * source with one tag arrive in send order. rvma_send returns when the
 * destination has the data; rvma_isend copies buf before it returns, and
 * its request completes when the destination has it. rvma_recv waits for
 * the next message from src with tag and copies it into buf; *len is its
 * length. A longer message is truncated to cap bytes (*len is still its
 * full length) and the call returns RVMA_ERR_TRUNCATE. */
int rvma_send(rvma_comm comm, int dst, int tag, const void *buf, size_t len);
int rvma_isend(rvma_comm comm, int dst, int tag, const void *buf, size_t len, rvma_request *req);
int rvma_recv(rvma_comm comm, int src, int tag, void *buf, size_t cap, size_t *len);

/* Matching receives, for MPI's MPI_ANY_SOURCE and MPI_ANY_TAG: they take
 * the earliest-arrived message from src (or any rank: RVMA_ANY_SOURCE)
 * whose tag t has (t & mask) == (tag & mask) (mask -1: exactly tag; 0: any
 * tag; 0 <= tag <= RVMA_TAG_UB), copy it into buf as rvma_recv does (*len
 * its length, RVMA_ERR_TRUNCATE if it is longer than cap), and give its
 * source and tag in *source and *mtag (each may be NULL). Messages from
 * one source with one tag are still taken in send order. rvma_recv_match
 * waits for one (a wait for any source never gives up on a dead peer).
 * rvma_try_recv_match does not wait: it drives the connections once and
 * sets *flag to 0 if no message matches; unless before is 0 it only takes
 * messages whose arrival number is below before (rvma_msg_arrived), so
 * that a series of calls sees one snapshot. */
int rvma_recv_match(rvma_comm comm, int src, int tag, int mask, void *buf, size_t cap, size_t *len, int *source,
                    int *mtag);
int rvma_try_recv_match(rvma_comm comm, int src, int tag, int mask, uint64_t before, void *buf, size_t cap,
                        size_t *len, int *source, int *mtag, int *flag);
/* Messages to this rank are numbered 1, 2, ... as they arrive (received
 * or not, collectives' included): *next is the number the next one will
 * get. rvma_msg_wait waits until message number n has arrived. */
int rvma_msg_arrived(rvma_comm comm, uint64_t *next);
int rvma_msg_wait(rvma_comm comm, uint64_t n);

/* Probes, for MPI_Probe and MPI_Iprobe: the matching receives' choice of
 * message, left in place; *source, *mtag and *len (each may be NULL) give
 * its source, tag and length, and the matching receive (or rvma_recv from
 * that source with that tag) that runs next takes it. rvma_probe_match
 * waits for one; rvma_try_probe_match does not (*flag 0 if none matches;
 * before as in rvma_try_recv_match). */
int rvma_probe_match(rvma_comm comm, int src, int tag, int mask, int *source, int *mtag, size_t *len);
int rvma_try_probe_match(rvma_comm comm, int src, int tag, int mask, uint64_t before, int *source, int *mtag,
                         size_t *len, int *flag);
/* Cancellable waits, for MPI_Cancel of a receive that another thread waits
 * for: rvma_recv_match_key and rvma_msg_wait_key are rvma_recv_match and
 * rvma_msg_wait that rvma_msg_cancel(comm, key) ends with
 * RVMA_ERR_CANCELLED, having taken nothing, also when it was called
 * before they began. key (not 0) is the caller's and names one wait: a
 * key once cancelled must not be used again. */
int rvma_recv_match_key(rvma_comm comm, int src, int tag, int mask, void *buf, size_t cap, size_t *len, int *source,
                        int *mtag, uint64_t key);
int rvma_msg_wait_key(rvma_comm comm, uint64_t n, uint64_t key);
int rvma_msg_cancel(rvma_comm comm, uint64_t key);

/* ---- Windows ----------------------------------------------------------- */

/* Collective. A window of size bytes that the library allocates (zeroed,
 * page-aligned; on shared memory, mapped by the ranks of the host, so
 * their accesses are copies made by the origin: prefer it to
 * rvma_win_create). *base receives its address (NULL if size is 0); it is
 * valid until rvma_win_free. disp_unit is the unit of displacements into
 * this rank's part (0 means 1). base may be NULL. */
int rvma_win_allocate(rvma_comm comm, size_t size, int disp_unit, void **base, rvma_win *win);

/* Collective. A window over the caller's memory [base, base+size), which
 * must stay allocated until rvma_win_free returns. base may be NULL only
 * when size is 0. */
int rvma_win_create(rvma_comm comm, void *base, size_t size, int disp_unit, rvma_win *win);

/* The notified variants (see rvma_notify_config). */
int rvma_win_allocate_notified(rvma_comm comm, size_t size, int disp_unit, const rvma_notify_config *cfg,
                               void **base, rvma_win *win);
int rvma_win_create_notified(rvma_comm comm, void *base, size_t size, int disp_unit,
                             const rvma_notify_config *cfg, rvma_win *win);

/* Collective. A window whose parts every rank loads and stores directly
 * (MPI_Win_allocate_shared): one block, the ranks' parts contiguous in
 * rank order, *base this rank's part (zeroed). Only ranks of one host
 * over shared memory have it: elsewhere every rank fails with
 * RVMA_ERR_UNSUPPORTED and no window. Stores are ordered with the
 * window's operations and with other ranks' loads by its
 * synchronisation (fence, a barrier, sync, locks). */
int rvma_win_allocate_shared(rvma_comm comm, size_t size, int disp_unit, void **base, rvma_win *win);

/* Rank's part of the window as this process sees it: *base and *size.
 * For a shared window, always; for another window, this rank's part, or
 * a peer's where the provider maps it here (memory the library allocated
 * on one host over shared memory), else RVMA_ERR_UNSUPPORTED. A part of
 * size 0 may have base NULL. Valid until rvma_win_free. */
int rvma_win_shared_query(rvma_win win, int rank, size_t *size, void **base);

/* Collective. A dynamic window (MPI_Win_create_dynamic): no memory at
 * first; each rank attaches and detaches its own, alone, and origins
 * address it by its address in the target's process ((int64_t)(intptr_t)p
 * as the displacement of every data-movement call; disp_unit 1). Its
 * synchronisation is every other window's. rvma_win_attach makes [base,
 * base+size) reachable (the caller keeps it allocated until it is
 * detached or the window freed; RVMA_ERR_ARG if it overlaps memory
 * attached already); rvma_win_detach withdraws the memory attached at
 * base once the ranks that used it have forgotten it. An access outside
 * attached memory fails with RVMA_ERR_BOUNDS. */
int rvma_win_create_dynamic(rvma_comm comm, rvma_win *win);
int rvma_win_attach(rvma_win win, void *base, size_t size);
int rvma_win_detach(rvma_win win, const void *base);

/* Collective. Completes this rank's operations on the window, waits for
 * every rank to stop using it, and frees it; *win becomes RVMA_WIN_NULL.
 * The window is freed even when an operation failed (whose error is then
 * returned on every rank). */
int rvma_win_free(rvma_win *win);

/* This rank's part of the window: its address, size and disp_unit (any of
 * the outputs may be NULL). */
int rvma_win_get_info(rvma_win win, void **base, size_t *size, int *disp_unit);

/* ---- Data movement ------------------------------------------------------ */

/* Puts len bytes from origin into target's window at displacement disp. It
 * completes at the next synchronisation (flush, unlock, complete, fence;
 * for a notified window, the target's epoch). */
int rvma_put(rvma_win win, const void *origin, size_t len, int target, int64_t disp);
/* Gets len bytes from target's window at disp into origin. */
int rvma_get(rvma_win win, void *origin, size_t len, int target, int64_t disp);
/* Strided: the origin layout's bytes (at origin) move to the target
 * layout's (at disp); both layouts move the same number of bytes. */
int rvma_put_strided(rvma_win win, const void *origin, const rvma_layout *origin_layout, int target,
                     int64_t disp, const rvma_layout *target_layout);
int rvma_get_strided(rvma_win win, void *origin, const rvma_layout *origin_layout, int target, int64_t disp,
                     const rvma_layout *target_layout);
/* Registers len bytes at origin for the operations that will move pieces
 * of them, ahead of them (a hint: each operation registers what it moves
 * otherwise, the rest of its own span, one region per call). */
int rvma_register_origin(rvma_win win, const void *origin, size_t len);
/* Indexed: each of the count runs moves as rvma_put (rvma_get) of its
 * bytes would, in one call that registers the memory they span once: the
 * pieces of a datatype no layout describes (MPI's struct and indexed
 * types). Runs may come in any order, and origin_off may be negative. Every
 * run is checked before any moves. */
int rvma_put_runs(rvma_win win, const void *origin, const rvma_run *runs, size_t count, int target, int64_t disp);
int rvma_get_runs(rvma_win win, void *origin, const rvma_run *runs, size_t count, int target, int64_t disp);

/* target[disp...] = op(target, origin) over count elements of dt, each
 * element atomically; accumulates from one origin to one target apply in
 * issue order. */
int rvma_accumulate(rvma_win win, const void *origin, size_t count, rvma_datatype dt, rvma_op op, int target,
                    int64_t disp);
/* rvma_accumulate that also returns the previous target values in result
 * (count elements). With RVMA_NO_OP origin is not read and may be NULL. */
int rvma_get_accumulate(rvma_win win, const void *origin, void *result, size_t count, rvma_datatype dt,
                        rvma_op op, int target, int64_t disp);
/* One element: result = target[disp]; target[disp] = op(target[disp],
 * *origin). origin may be NULL with RVMA_NO_OP. */
int rvma_fetch_and_op(rvma_win win, const void *origin, void *result, rvma_datatype dt, rvma_op op, int target,
                      int64_t disp);
/* One element: result = target[disp]; if it equals *compare (bit for bit),
 * target[disp] = *origin. */
int rvma_compare_and_swap(rvma_win win, const void *origin, const void *compare, void *result, rvma_datatype dt,
                          int target, int64_t disp);

/* Request variants: the same operations, completing individually (and at
 * the next synchronisation). A request may come back RVMA_REQUEST_NULL
 * when the operation has completed already. */
int rvma_rput(rvma_win win, const void *origin, size_t len, int target, int64_t disp, rvma_request *req);
int rvma_rget(rvma_win win, void *origin, size_t len, int target, int64_t disp, rvma_request *req);
int rvma_rput_strided(rvma_win win, const void *origin, const rvma_layout *origin_layout, int target,
                      int64_t disp, const rvma_layout *target_layout, rvma_request *req);
int rvma_rget_strided(rvma_win win, void *origin, const rvma_layout *origin_layout, int target, int64_t disp,
                      const rvma_layout *target_layout, rvma_request *req);
int rvma_raccumulate(rvma_win win, const void *origin, size_t count, rvma_datatype dt, rvma_op op, int target,
                     int64_t disp, rvma_request *req);
int rvma_rget_accumulate(rvma_win win, const void *origin, void *result, size_t count, rvma_datatype dt,
                         rvma_op op, int target, int64_t disp, rvma_request *req);
int rvma_rfetch_and_op(rvma_win win, const void *origin, void *result, rvma_datatype dt, rvma_op op, int target,
                       int64_t disp, rvma_request *req);
int rvma_rcompare_and_swap(rvma_win win, const void *origin, const void *compare, void *result,
                           rvma_datatype dt, int target, int64_t disp, rvma_request *req);

/* Waits for a request and frees it (*req becomes RVMA_REQUEST_NULL, also
 * when the operation failed; a null request returns at once). */
int rvma_request_wait(rvma_request *req);
/* Whether a request has completed, without blocking; if so it is freed as
 * by rvma_request_wait (and *flag is 1; a null request is complete). */
int rvma_request_test(rvma_request *req, int *flag);
/* Waits for n requests; returns the first error, having waited for all. */
int rvma_request_waitall(size_t n, rvma_request *reqs);

/* ---- Synchronisation ---------------------------------------------------- */

/* Active target, collective (MPI_Win_fence). */
int rvma_win_fence(rvma_win win, int assert_);
/* Exposure epoch for the n origins in group (MPI_Win_post); ends with
 * rvma_win_wait, or rvma_win_test returning flag 1. */
int rvma_win_post(rvma_win win, const int *group, int n, int assert_);
/* Access epoch to the n targets in group (MPI_Win_start); waits until each
 * has posted. Ends with rvma_win_complete. */
int rvma_win_start(rvma_win win, const int *group, int n, int assert_);
int rvma_win_complete(rvma_win win);
int rvma_win_wait(rvma_win win);
int rvma_win_test(rvma_win win, int *flag);

/* Passive target: lock_type RVMA_LOCK_SHARED or RVMA_LOCK_EXCLUSIVE. */
int rvma_win_lock(rvma_win win, int lock_type, int target);
int rvma_win_unlock(rvma_win win, int target);
int rvma_win_lock_all(rvma_win win);
int rvma_win_unlock_all(rvma_win win);

/* Completes this rank's operations towards target (or all targets) at the
 * target. The _local variants equal the others: origin buffers are kept
 * until the target has acknowledged them. */
int rvma_win_flush(rvma_win win, int target);
int rvma_win_flush_all(rvma_win win);
int rvma_win_flush_local(rvma_win win, int target);
int rvma_win_flush_local_all(rvma_win win);
/* A memory barrier (memory is unified: MPI_Win_sync). */
int rvma_win_sync(rvma_win win);

/* ---- Notified windows --------------------------------------------------- */

/* Waits until this rank's next epoch is complete (every expected byte or
 * put arrived); *epoch is its number (1 for the first; may be NULL). The
 * data is in the window's memory. */
int rvma_win_wait_epoch(rvma_win win, uint64_t *epoch);
/* rvma_win_wait_epoch without blocking: *flag is 1 and the epoch consumed
 * if it was complete, else 0. */
int rvma_win_test_epoch(rvma_win win, int *flag, uint64_t *epoch);
/* Epochs completed and waited for so far. */
int rvma_win_epoch(rvma_win win, uint64_t *epoch);
/* Discards the current, partial epoch (call it when no origin is putting). */
int rvma_win_abandon_epoch(rvma_win win);
/* Rolls the window back k >= 1 epochs (1: the last completed one) from its
 * history; *epoch is the epoch it is now at (may be NULL).
 * RVMA_ERR_NOT_RETAINED if the history does not reach. */
int rvma_win_rewind(rvma_win win, int k, uint64_t *epoch);

#endif /* RVMA_TYPES_ONLY */

#ifdef __cplusplus
}
#endif

#endif /* RVMA_H */
