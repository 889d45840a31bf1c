/*
 * rma_bench: rvma-perf's MPI-style rma tests written against MPI's
 * one-sided interface, so that the two can be run side by side on one
 * machine and compared result by result (scripts/rma-vs-mpi.sh).
 *
 * Build: mpicc -O2 -o rma_bench rma_bench.c
 * Run:   mpiexec -n 2 ./rma_bench TESTS [--size N[,N...]] [--duration S]
 *                [--iters N] [--warmup N] [--provider LABEL] [--json]
 *
 * TESTS is a comma-separated list of rvma-perf's test names:
 *   rma_put_flush_lat  MPI_Put + MPI_Win_flush, under MPI_Win_lock(shared)
 *   rma_get_lat        MPI_Get + MPI_Win_flush
 *   rma_acc_lat        MPI_Accumulate (MPI_SUM, one int64) + MPI_Win_flush
 *   rma_fop_lat        MPI_Fetch_and_op (MPI_SUM, int64) + MPI_Win_flush
 *   rma_cas_lat        MPI_Compare_and_swap (int64, always succeeds) + flush
 *   rma_put_notify_lat ping-pong under MPI_Win_lock_all: put + flush + a
 *                      1-byte MPI_Send the peer receives; half a round trip
 *   rma_put_rate       64 puts of --size to distinct offsets + one flush
 *                      per round, in MB/s (10^6 bytes/s) and Mops
 *   rma_barrier_lat    MPI_Barrier, both ranks in the loop
 *   rma_fence_lat      MPI_Win_fence(0), both ranks in the loop
 * (rvma-perf's rma_notify_lat, a notified window, has no MPI counterpart.)
 *
 * The scheme is rvma-perf's (cmd/rvma-perf/rmaops.go): rank 0 is the
 * origin, rank 1 the target, waiting in MPI_Barrier during one-sided tests;
 * --warmup untimed operations (default 1000, rounds of rma_put_rate 10);
 * then operations timed in batches of 10 (rounds one by one) until the
 * batches add up to --duration seconds (default 2) or --iters operations
 * have run. A batch's time over 10 is one sample; p50 and p99 are over the
 * samples, avg over all. Ping-pong ranks agree every 10 batches, untimed,
 * whether to go on. One JSON line per result, in rvma-perf's Result format.
 */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { BATCH = 10, AGREE_EVERY = 10, RATE_WINDOW = 64, TAG_NOTE = 7, TAG_STOP = 8 };

struct opts {
    double duration;
    long iters, warmup;
    const char *provider;
    int json;
};

/* What a test needs while it runs; an operation is a function of it and
 * of the operation's index. */
struct run {
    const struct opts *o;
    const char *test;
    size_t size;
    MPI_Win win;
    char *src;
    char *dst;
    int rank, peer;
    int64_t one, swap, cmp, result;
    long misses;
};

typedef void (*op_fn)(struct run *r, long i);

static int my_rank;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void die(const char *msg) {
    fprintf(stderr, "rma_bench: rank %d: %s\n", my_rank, msg);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

/* ---- the operations ---- */

static void op_put(struct run *r, long i) {
    (void)i;
    MPI_Put(r->src, (int)r->size, MPI_BYTE, 1, 0, (int)r->size, MPI_BYTE, r->win);
    MPI_Win_flush(1, r->win);
}

static void op_get(struct run *r, long i) {
    (void)i;
    MPI_Get(r->dst, (int)r->size, MPI_BYTE, 1, 0, (int)r->size, MPI_BYTE, r->win);
    MPI_Win_flush(1, r->win);
}

static void op_acc(struct run *r, long i) {
    (void)i;
    MPI_Accumulate(&r->one, 1, MPI_INT64_T, 1, 0, 1, MPI_INT64_T, MPI_SUM, r->win);
    MPI_Win_flush(1, r->win);
}

static void op_fop(struct run *r, long i) {
    (void)i;
    MPI_Fetch_and_op(&r->one, &r->result, MPI_INT64_T, 1, 0, MPI_SUM, r->win);
    MPI_Win_flush(1, r->win);
}

/* The i-th swap expects i and leaves i+1: every compare succeeds. */
static void op_cas(struct run *r, long i) {
    r->cmp = i;
    r->swap = i + 1;
    MPI_Compare_and_swap(&r->swap, &r->cmp, &r->result, MPI_INT64_T, 1, 0, r->win);
    MPI_Win_flush(1, r->win);
    if (r->result != i) r->misses++;
}

static void op_rate(struct run *r, long i) {
    (void)i;
    for (int j = 0; j < RATE_WINDOW; j++)
        MPI_Put(r->src + (size_t)j * r->size, (int)r->size, MPI_BYTE, 1, (MPI_Aint)((size_t)j * r->size),
                (int)r->size, MPI_BYTE, r->win);
    MPI_Win_flush(1, r->win);
}

static void notify_put(struct run *r) {
    char note = 1;
    MPI_Put(r->src, (int)r->size, MPI_BYTE, r->peer, 0, (int)r->size, MPI_BYTE, r->win);
    MPI_Win_flush(r->peer, r->win);
    MPI_Send(&note, 1, MPI_CHAR, r->peer, TAG_NOTE, MPI_COMM_WORLD);
}

static void notify_wait(struct run *r) {
    char note;
    MPI_Recv(&note, 1, MPI_CHAR, r->peer, TAG_NOTE, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
}

static void op_notify_round(struct run *r, long i) {
    (void)i;
    if (r->rank == 0) {
        notify_put(r);
        notify_wait(r);
    } else {
        notify_wait(r);
        notify_put(r);
    }
}

static void op_barrier(struct run *r, long i) {
    (void)r, (void)i;
    MPI_Barrier(MPI_COMM_WORLD);
}

static void op_fence(struct run *r, long i) {
    (void)i;
    MPI_Win_fence(0, r->win);
}

/* ---- timing ---- */

struct samples {
    double *v; /* seconds per operation, one per batch */
    long n, cap;
    double total; /* seconds the batches took */
};

static void add_sample(struct samples *s, double per_op, double batch_s) {
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 4096;
        s->v = realloc(s->v, (size_t)s->cap * sizeof *s->v);
        if (!s->v) die("out of memory");
    }
    s->v[s->n++] = per_op;
    s->total += batch_s;
}

static long warm_ops(const struct opts *o, int rate) {
    if (o->warmup > 0) return o->warmup;
    long w = rate ? 10 : 1000;
    if (o->iters > 0) {
        long t = o->iters / 10;
        if (t < 2) t = 2;
        if (t < w) w = t;
    }
    return w;
}

/* Runs op in batches until the time or the count is reached. With both
 * ranks in the loop (pingpong), rank 0's decision reaches rank 1 every
 * AGREE_EVERY batches, outside the timed batches. */
static void timed_phase(struct run *r, op_fn op, long batch, long from, int pingpong, struct samples *s) {
    const struct opts *o = r->o;
    for (long i = from;; i += batch) {
        double t0 = now();
        for (long k = 0; k < batch; k++) op(r, i + k);
        double d = now() - t0;
        add_sample(s, d / (double)batch, d);
        char stop = o->iters > 0 ? s->n * batch >= o->iters : s->total >= o->duration;
        if (pingpong) {
            if (s->n % AGREE_EVERY != 0) continue;
            if (r->rank == 0)
                MPI_Send(&stop, 1, MPI_CHAR, 1, TAG_STOP, MPI_COMM_WORLD);
            else
                MPI_Recv(&stop, 1, MPI_CHAR, 0, TAG_STOP, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        }
        if (stop) break;
    }
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* ops operations of size bytes; samples are divided by div (2: one way). */
static void report(const struct run *r, struct samples *s, long ops, int div, int rate) {
    const struct opts *o = r->o;
    qsort(s->v, (size_t)s->n, sizeof *s->v, cmp_double);
    double el = s->total;
    double p50 = s->v[s->n / 2] * 1e6 / div, p99 = s->v[s->n * 99 / 100] * 1e6 / div;
    double avg = el * 1e6 / (double)ops / div;
    double gbps = (double)ops * (double)r->size * 8 / el / 1e9, mops = (double)ops / el / 1e6;
    double mbps = rate ? (double)ops * (double)r->size / el / 1e6 : 0;
    if (o->json) {
        printf("{\"test\":\"%s\",\"provider\":\"%s\",\"size\":%zu,\"iters\":%ld,\"qps\":1,\"seconds\":%.6f,"
               "\"gbps\":%.6g,\"mops\":%.6g,\"lat_us_p50\":%.6g,\"lat_us_p99\":%.6g,\"lat_us_avg\":%.6g",
               r->test, o->provider, r->size, ops, el, gbps, mops, rate ? 0 : p50, rate ? 0 : p99, rate ? 0 : avg);
        if (rate) printf(",\"mb_per_s\":%.6g", mbps);
        printf(",\"ranks\":\"processes\"}\n");
    } else if (rate) {
        printf("%-18s %-10s size %8zu  iters %9ld  %10.1f MB/s  %8.4f Mops\n", r->test, o->provider, r->size, ops,
               mbps, mops);
    } else {
        printf("%-18s %-10s size %8zu  iters %9ld  lat p50 %.3f us  p99 %.3f us  avg %.3f us\n", r->test,
               o->provider, r->size, ops, p50, p99, avg);
    }
    fflush(stdout);
}

/* ---- the tests ---- */

static op_fn one_sided_op(const char *test) {
    if (!strcmp(test, "rma_put_flush_lat")) return op_put;
    if (!strcmp(test, "rma_get_lat")) return op_get;
    if (!strcmp(test, "rma_acc_lat")) return op_acc;
    if (!strcmp(test, "rma_fop_lat")) return op_fop;
    if (!strcmp(test, "rma_cas_lat")) return op_cas;
    return NULL;
}

static int is_atomic(const char *test) {
    return !strcmp(test, "rma_acc_lat") || !strcmp(test, "rma_fop_lat") || !strcmp(test, "rma_cas_lat");
}

static void run_test(const struct opts *o, const char *test, size_t size) {
    int rate = !strcmp(test, "rma_put_rate"), pingpong = !strcmp(test, "rma_put_notify_lat");
    int coll = !strcmp(test, "rma_barrier_lat") || !strcmp(test, "rma_fence_lat");
    op_fn op = rate ? op_rate : pingpong ? op_notify_round : one_sided_op(test);
    if (coll) op = strcmp(test, "rma_fence_lat") ? op_barrier : op_fence;
    if (!op) {
        if (my_rank == 0)
            fprintf(stderr, "rma_bench: %s: %s\n", test,
                    strcmp(test, "rma_notify_lat") ? "unknown test" : "a notified window, which MPI has not");
        return;
    }
    if (is_atomic(test)) size = 8;
    struct run r = {.o = o, .test = test, .size = size, .rank = my_rank, .peer = 1 - my_rank, .one = 1};
    size_t winsz = rate ? RATE_WINDOW * size : size < 8 ? 8 : size;
    char *base;
    MPI_Win_allocate((MPI_Aint)winsz, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &base, &r.win);
    memset(base, 0, winsz);
    r.src = calloc(rate ? RATE_WINDOW * size : size + 1, 1);
    r.dst = calloc(size + 1, 1);
    if (!r.src || !r.dst) die("out of memory");
    MPI_Barrier(MPI_COMM_WORLD); /* every window zeroed before any access */

    struct samples s = {0};
    long warm = warm_ops(o, rate);
    if (coll) {
        /* Both ranks in the loop; one barrier or fence is one operation. */
        for (long i = 0; i < warm; i++) op(&r, i);
        timed_phase(&r, op, BATCH, 0, 1, &s);
        if (my_rank == 0) report(&r, &s, s.n * BATCH, 1, 0);
    } else if (pingpong) {
        MPI_Win_lock_all(0, r.win);
        for (long i = 0; i < warm; i++) op(&r, i);
        timed_phase(&r, op, BATCH, 0, 1, &s);
        MPI_Win_unlock_all(r.win);
        if (my_rank == 0) report(&r, &s, s.n * BATCH, 2, 0);
    } else if (my_rank == 0) {
        MPI_Win_lock(MPI_LOCK_SHARED, 1, 0, r.win);
        for (long i = 0; i < warm; i++) op(&r, i);
        long batch = rate ? 1 : BATCH;
        timed_phase(&r, op, batch, warm, 0, &s);
        long ops = s.n * batch;
        /* The atomics leave a count of themselves in the word: a benchmark
         * that moved nothing would be caught here. */
        if (is_atomic(test)) {
            int64_t word;
            MPI_Get(&word, 1, MPI_INT64_T, 1, 0, 1, MPI_INT64_T, r.win);
            MPI_Win_flush(1, r.win);
            if (word != warm + ops || r.misses) {
                char msg[160];
                snprintf(msg, sizeof msg, "%s: the target word is %lld after %ld operations (%ld failed compares)",
                         test, (long long)word, warm + ops, r.misses);
                die(msg);
            }
        }
        MPI_Win_unlock(1, r.win);
        if (rate)
            report(&r, &s, ops * RATE_WINDOW, RATE_WINDOW, 1);
        else
            report(&r, &s, ops, 1, 0);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Win_free(&r.win);
    free(s.v);
    free(r.src);
    free(r.dst);
}

/* ---- command line ---- */

static void usage(void) {
    if (my_rank == 0)
        fprintf(stderr, "usage: rma_bench TEST[,TEST...] [--size N[,N...]] [--duration S] [--iters N] "
                        "[--warmup N] [--provider LABEL] [--json]\n");
    MPI_Finalize();
    exit(2);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int np;
    MPI_Comm_rank(MPI_COMM_WORLD, &my_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &np);
    if (np != 2) die("needs exactly 2 ranks");
    struct opts o = {.duration = 2, .provider = "mpi"};
    const char *tests = NULL, *sizes = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--json")) {
            o.json = 1;
        } else if (a[0] == '-' && !v) {
            usage();
        } else if (!strcmp(a, "--size")) {
            sizes = v, i++;
        } else if (!strcmp(a, "--duration")) {
            o.duration = atof(v), i++;
        } else if (!strcmp(a, "--iters")) {
            o.iters = atol(v), i++;
        } else if (!strcmp(a, "--warmup")) {
            o.warmup = atol(v), i++;
        } else if (!strcmp(a, "--provider")) {
            o.provider = v, i++;
        } else if (a[0] != '-' && !tests) {
            tests = a;
        } else {
            usage();
        }
    }
    if (!tests || o.duration <= 0 || o.iters < 0 || o.warmup < 0) usage();
    char *tl = strdup(tests);
    for (char *save = NULL, *t = strtok_r(tl, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        /* rvma-perf's default sizes: 8 B for latency tests, 64 KiB else. */
        char *sl = strdup(sizes ? sizes : strstr(t, "_lat") ? "8" : "65536");
        for (char *save2 = NULL, *z = strtok_r(sl, ",", &save2); z; z = strtok_r(NULL, ",", &save2)) {
            long sz = atol(z);
            if (sz < 1 || sz > (1L << 30) / RATE_WINDOW) usage();
            run_test(&o, t, (size_t)sz);
        }
        free(sl);
    }
    free(tl);
    MPI_Finalize();
    return 0;
}
