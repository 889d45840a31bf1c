/*
 * halo3d: examples/halo3d written against MPI, so that the two can be run
 * side by side and their checksums compared digit for digit
 * (scripts/halo3d-vs-mpi.sh, examples/halo3d/mpi_test.go).
 *
 * Build: mpicc -O2 -o halo3d_mpi halo3d.c
 * Run:   mpiexec -n 4 ./halo3d_mpi [-n 64] [-l NX,NY,NZ] [--iters 100]
 *               [--warmup 10] [--sync sendrecv,fence,pscw,lock]
 *               [--exchange-only] [--json] [--serial=false]
 *
 * The problem is examples/halo3d's: an NX x NY x NZ block of doubles per
 * rank (-n N: N^3) plus one ghost layer, in two arrays; ranks on a
 * non-periodic 3-D grid whose shape is chosen as halo3d's dimsCreate does
 * (MPI_Dims_create's even split, largest first; computed here rather than
 * by MPI_Dims_create so that no MPI library can choose differently), rank
 * r at coordinates (r / (D1 D2), r / D2 % D1, r % D2); the global x=0
 * ghost plane fixed at 1.0, the other global faces at 0.0, interior point
 * (gx, gy, gz) (global, from 1) starting at ((3gx + 5gy + 7gz) mod 11)/10;
 * each iteration exchanges the six faces and then does a 7-point Jacobi
 * step, (x- + x+ + y- + y+ + z- + z+) / 6.0 summed in that order. The
 * checksum is the global sum of the interior, each rank's sum (i, j, k
 * order) added up in rank order as rvma's AllreduceFloat64 does, so the
 * two programs agree bit for bit, not only to the printed 10 decimals.
 *
 * Variants (halo3d's, less notify, rvma's notified window, which MPI has
 * not):
 *   sendrecv  faces packed into buffers, MPI_Isend/MPI_Irecv, unpacked
 *   fence     MPI_Put of the faces into the neighbours' ghost layers between
 *             MPI_Win_fence(NOPRECEDE) and MPI_Win_fence(NOSTORE|NOSUCCEED)
 *   pscw      the same puts inside MPI_Win_post/start ... complete/wait,
 *             the groups being the neighbours
 *   lock      under one MPI_Win_lock_all per run: the puts, MPI_Win_flush_all,
 *             then an MPI_Accumulate(+1, int64) on a counter of the target's
 *             per direction, MPI_Win_flush_all, and the target polls its
 *             counters until they reach the iteration number (an MPI_NO_OP
 *             MPI_Fetch_and_op on itself: MPI's atomic read), then
 *             MPI_Win_sync. One counter per direction as in halo3d: with one
 *             per rank a neighbour one iteration ahead can make up for one
 *             behind.
 * The puts use the faces' layouts in halo3d: an x face is contiguous (rows
 * j = 1..NY of the plane with their ghost columns); a y face is
 * MPI_Type_vector(NX, NZ, stride of x); a z face is one double per (i, j)
 * with j's ghost rows included, so that its stride is uniform:
 * MPI_Type_vector(NX (NY+2), 1, stride of y). The ghost cells the z and x
 * faces carry are never read at the target.
 *
 * Output (rank 0), as halo3d's: a header and a line per variant with us
 * per iteration (the slowest rank's time over the timed iterations) and the
 * checksum with 10 decimals, or with --json one line per variant with
 * halo3d's fields; then unless --serial=false (or --exchange-only) the
 * whole grid solved serially on rank 0 ("serial-ref"). A variant is ok when
 * its checksum is within 1e-9 (relative) of sendrecv's, run first (and
 * unreported) if --sync does not start with it. Exit status 1 if one is not.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <mpi.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* KEEP marks the functions that call MPI and return: GCC must not decide
 * from their bodies what their calls may be left out. GCC 12.2 (Debian 12)
 * at -O2 deleted every call of an earlier put_faces, a loop of MPI_Put over
 * g->src[d][s]: its pure-const pass read an address IVOPTS had formed from
 * the negated grid pointer as a null dereference, ended the block there,
 * before MPI_Put, and so found the function pure, its calls dead. noipa
 * keeps callers from using such findings. */
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 8
#define KEEP __attribute__((noipa))
#else
#define KEEP
#endif

enum { MAX_SYNCS = 64 };

struct opts {
    int local[3];
    int iters, warmup;
    const char *syncs[MAX_SYNCS];
    int nsyncs;
    int exchange_only, json, serial;
};

/* One rank's block: two padded arrays and six counters (lock) in one
 * window's memory. */
struct grid {
    int rank, size;
    int nx, ny, nz;
    long sx, sy; /* strides in elements (z stride 1) */
    long v;      /* padded volume */
    int dims[3], coords[3];
    int nbr[3][2]; /* neighbour rank per dim and side, -1 if none */
    int nbrs[6], nnbrs;
    double *mem, *u[2];
    int64_t *counter;
    MPI_Win win;
    MPI_Group group; /* the neighbours, for pscw */
    /* the faces to put, one per neighbour: my boundary face on side s of
     * dimension d and the neighbour's ghost layer it fills, as element
     * offsets within an array, count elements of type */
    struct face {
        int rank, count;
        long src, dst;
        MPI_Datatype type;
    } face[6];
    int nfaces;
    MPI_Datatype vec[3]; /* y and z faces' strided layouts */
    double *sendbuf[3][2], *recvbuf[3][2];
};

struct result {
    const char *sync;
    int ranks;
    char dims[64];
    int compute;
    double us, checksum;
    int ok;
};

static int my_rank;

static void die(const char *msg) {
    fprintf(stderr, "halo3d (MPI): rank %d: %s\n", my_rank, msg);
    MPI_Abort(MPI_COMM_WORLD, 2);
    exit(2);
}

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size);
    if (!p) die("out of memory");
    return p;
}

/* halo3d's dimsCreate: p's prime factors, largest first, each multiplying
 * the smallest dimension so far (the first of equals), sorted descending. */
static void dims_create(int p, int d[3]) {
    int primes[64], np = 0;
    for (int f = 2; f * f <= p; f++)
        for (; p % f == 0; p /= f) primes[np++] = f;
    if (p > 1) primes[np++] = p;
    d[0] = d[1] = d[2] = 1;
    for (int i = np - 1; i >= 0; i--) {
        int k = 0;
        for (int j = 1; j < 3; j++)
            if (d[j] < d[k]) k = j;
        d[k] *= primes[i];
    }
    for (int i = 0; i < 3; i++)
        for (int j = i + 1; j < 3; j++)
            if (d[j] > d[i]) {
                int t = d[i];
                d[i] = d[j], d[j] = t;
            }
}

static long idx(const struct grid *g, long i, long j, long k) { return i * g->sx + j * g->sy + k; }

/* the size of a face's interior, as sendrecv packs it, in elements */
static int face_elems(const struct grid *g, int d) {
    return d == 0 ? g->ny * g->nz : d == 1 ? g->nx * g->nz : g->nx * g->ny;
}

static void new_grid(struct grid *g, int rank, int size, const int local[3]) {
    memset(g, 0, sizeof *g);
    g->rank = rank, g->size = size;
    g->nx = local[0], g->ny = local[1], g->nz = local[2];
    dims_create(size, g->dims);
    g->sy = g->nz + 2;
    g->sx = (long)(g->ny + 2) * g->sy;
    g->v = (long)(g->nx + 2) * g->sx;
    g->coords[0] = rank / (g->dims[1] * g->dims[2]);
    g->coords[1] = rank / g->dims[2] % g->dims[1];
    g->coords[2] = rank % g->dims[2];
    for (int d = 0; d < 3; d++)
        for (int s = 0; s < 2; s++) {
            int c[3] = {g->coords[0], g->coords[1], g->coords[2]};
            c[d] += s ? 1 : -1;
            g->nbr[d][s] = -1;
            if (c[d] >= 0 && c[d] < g->dims[d]) {
                g->nbr[d][s] = (c[0] * g->dims[1] + c[1]) * g->dims[2] + c[2];
                g->nbrs[g->nnbrs++] = g->nbr[d][s];
            }
        }

    /* Two arrays, then six int64 counters; displacements in doubles. */
    MPI_Aint bytes = (MPI_Aint)(2 * g->v + 6) * 8;
    if (MPI_Win_allocate(bytes, 8, MPI_INFO_NULL, MPI_COMM_WORLD, &g->mem, &g->win) != MPI_SUCCESS)
        die("MPI_Win_allocate failed");
    g->u[0] = g->mem, g->u[1] = g->mem + g->v;
    g->counter = (int64_t *)(g->mem + 2 * g->v);

    MPI_Group world;
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    MPI_Group_incl(world, g->nnbrs, g->nbrs, &g->group);
    MPI_Group_free(&world);

    /* x: rows j=1..ny of plane i, ghost columns included: contiguous */
    g->vec[0] = MPI_DOUBLE;
    /* y: one row of nz per i */
    MPI_Type_vector(g->nx, g->nz, (int)g->sx, MPI_DOUBLE, &g->vec[1]);
    MPI_Type_commit(&g->vec[1]);
    /* z: one element per (i, j), the ghost rows j=0 and ny+1 included so
     * that the stride is uniform */
    MPI_Type_vector(g->nx * (g->ny + 2), 1, (int)g->sy, MPI_DOUBLE, &g->vec[2]);
    MPI_Type_commit(&g->vec[2]);
    int n[3] = {g->nx, g->ny, g->nz};
    for (int d = 0; d < 3; d++) {
        for (int s = 0; s < 2; s++) {
            g->sendbuf[d][s] = xcalloc((size_t)face_elems(g, d), sizeof(double));
            g->recvbuf[d][s] = xcalloc((size_t)face_elems(g, d), sizeof(double));
            if (g->nbr[d][s] < 0) continue;
            int mine = s == 0 ? 1 : n[d];
            int ghost = s == 0 ? n[d] + 1 : 0; /* the neighbour's ghost plane on side 1-s */
            struct face *f = &g->face[g->nfaces++];
            f->rank = g->nbr[d][s];
            f->type = g->vec[d];
            f->count = d == 0 ? (int)((long)g->ny * g->sy) : 1;
            switch (d) {
            case 0:
                f->src = idx(g, mine, 1, 0), f->dst = idx(g, ghost, 1, 0);
                break;
            case 1:
                f->src = idx(g, 1, mine, 1), f->dst = idx(g, 1, ghost, 1);
                break;
            default:
                f->src = idx(g, 1, 0, mine), f->dst = idx(g, 1, 0, ghost);
            }
        }
    }
}

static void free_grid(struct grid *g) {
    for (int d = 0; d < 3; d++)
        for (int s = 0; s < 2; s++) free(g->sendbuf[d][s]), free(g->recvbuf[d][s]);
    MPI_Type_free(&g->vec[1]);
    MPI_Type_free(&g->vec[2]);
    MPI_Group_free(&g->group);
    MPI_Win_free(&g->win);
}

static void init_array(double *u, int ax, int ay, int az, long ox, long oy, long oz, int xlo) {
    long ty = az + 2, tx = (ay + 2) * ty;
    memset(u, 0, sizeof(double) * (size_t)((ax + 2) * tx));
    for (long i = 1; i <= ax; i++)
        for (long j = 1; j <= ay; j++)
            for (long k = 1; k <= az; k++)
                u[i * tx + j * ty + k] = (double)((3 * (ox + i) + 5 * (oy + j) + 7 * (oz + k)) % 11) / 10.0;
    if (xlo)
        for (long c = 0; c < tx; c++) u[c] = 1.0;
}

/* init_arrays sets the initial state of both arrays and the counters. */
static void init_arrays(struct grid *g) {
    long ox = (long)g->coords[0] * g->nx, oy = (long)g->coords[1] * g->ny, oz = (long)g->coords[2] * g->nz;
    for (int a = 0; a < 2; a++) init_array(g->u[a], g->nx, g->ny, g->nz, ox, oy, oz, g->coords[0] == 0);
    memset(g->counter, 0, 6 * sizeof(int64_t));
}

static void jacobi(double *restrict un, const double *restrict u, int ax, int ay, int az, long tx, long ty) {
    for (long i = 1; i <= ax; i++)
        for (long j = 1; j <= ay; j++) {
            long c = i * tx + j * ty;
            for (long k = 1; k <= az; k++)
                un[c + k] = (u[c + k - tx] + u[c + k + tx] + u[c + k - ty] + u[c + k + ty] + u[c + k - 1] + u[c + k + 1]) / 6.0;
        }
}

static double interior_sum(const double *u, int ax, int ay, int az, long tx, long ty) {
    double s = 0.0;
    for (long i = 1; i <= ax; i++)
        for (long j = 1; j <= ay; j++)
            for (long k = 1; k <= az; k++) s += u[i * tx + j * ty + k];
    return s;
}

/* pack copies my face (d, s) of array u into buf, or unpacks buf into the
 * ghost layer on side s when unpack is set; a then b, as halo3d does. */
static void pack(const struct grid *g, double *u, int d, int s, double *buf, int unpack) {
    int n[3] = {g->nx, g->ny, g->nz};
    long plane = 1;
    if (unpack)
        plane = s == 0 ? 0 : n[d] + 1;
    else if (s == 1)
        plane = n[d];
    int e0 = d == 0 ? g->ny : g->nx, e1 = d == 2 ? g->ny : g->nz;
    long m = 0;
    for (long a = 1; a <= e0; a++)
        for (long b = 1; b <= e1; b++) {
            long at = d == 0 ? idx(g, plane, a, b) : d == 1 ? idx(g, a, plane, b) : idx(g, a, b, plane);
            if (unpack)
                u[at] = buf[m];
            else
                buf[m] = u[at];
            m++;
        }
}

/* put_faces puts my faces of array cur into the neighbours' ghost layers;
 * the caller's synchronisation completes them. */
static KEEP void put_faces(struct grid *g, int cur) {
    const double *u = g->u[cur];
    MPI_Aint base = (MPI_Aint)cur * g->v;
    for (int i = 0; i < g->nfaces; i++) {
        const struct face *f = &g->face[i];
        MPI_Put(u + f->src, f->count, f->type, f->rank, base + f->dst, f->count, f->type, g->win);
    }
}

/* the value of my counter k, read atomically with respect to the
 * neighbours' accumulates (halo3d's atomic load) */
static KEEP int64_t read_counter(struct grid *g, int k) {
    int64_t val;
    MPI_Fetch_and_op(NULL, &val, MPI_INT64_T, g->rank, (MPI_Aint)(2 * g->v + k), MPI_NO_OP, g->win);
    MPI_Win_flush(g->rank, g->win);
    return val;
}

static KEEP void exchange(struct grid *g, const char *sync, int cur, int64_t iter) {
    if (!strcmp(sync, "sendrecv")) {
        MPI_Request reqs[12];
        MPI_Status st[12];
        int nreq = 0;
        for (int d = 0; d < 3; d++)
            for (int s = 0; s < 2; s++)
                if (g->nbr[d][s] >= 0) /* sent towards side 1-s */
                    MPI_Irecv(g->recvbuf[d][s], face_elems(g, d), MPI_DOUBLE, g->nbr[d][s], 2 * d + (1 - s), MPI_COMM_WORLD,
                              &reqs[nreq++]);
        for (int d = 0; d < 3; d++)
            for (int s = 0; s < 2; s++)
                if (g->nbr[d][s] >= 0) {
                    pack(g, g->u[cur], d, s, g->sendbuf[d][s], 0);
                    MPI_Isend(g->sendbuf[d][s], face_elems(g, d), MPI_DOUBLE, g->nbr[d][s], 2 * d + s, MPI_COMM_WORLD,
                              &reqs[nreq++]);
                }
        MPI_Waitall(nreq, reqs, st);
        for (int d = 0; d < 3; d++)
            for (int s = 0; s < 2; s++)
                if (g->nbr[d][s] >= 0) pack(g, g->u[cur], d, s, g->recvbuf[d][s], 1);
    } else if (!strcmp(sync, "fence")) {
        MPI_Win_fence(MPI_MODE_NOPRECEDE, g->win);
        put_faces(g, cur);
        MPI_Win_fence(MPI_MODE_NOSTORE | MPI_MODE_NOSUCCEED, g->win);
    } else if (!strcmp(sync, "pscw")) {
        MPI_Win_post(g->group, 0, g->win);
        MPI_Win_start(g->group, 0, g->win);
        put_faces(g, cur);
        MPI_Win_complete(g->win);
        MPI_Win_wait(g->win);
    } else if (!strcmp(sync, "lock")) {
        put_faces(g, cur);
        MPI_Win_flush_all(g->win);
        int64_t one = 1;
        for (int d = 0; d < 3; d++)
            for (int s = 0; s < 2; s++)
                if (g->nbr[d][s] >= 0)
                    MPI_Accumulate(&one, 1, MPI_INT64_T, g->nbr[d][s], (MPI_Aint)(2 * g->v + 2 * d + 1 - s), 1, MPI_INT64_T,
                                   MPI_SUM, g->win);
        MPI_Win_flush_all(g->win);
        for (int d = 0; d < 3; d++)
            for (int s = 0; s < 2; s++) {
                if (g->nbr[d][s] < 0) continue;
                /* Spin briefly, then nap, so that ranks sharing a core
                 * (oversubscription) let each other run. */
                for (int i = 0; read_counter(g, 2 * d + s) < iter; i++) {
                    if (i < 200) {
                        sched_yield();
                    } else {
                        struct timespec ts = {0, 20000};
                        nanosleep(&ts, NULL);
                    }
                }
            }
        MPI_Win_sync(g->win);
    } else {
        die("unknown variant");
    }
}

/* The global sum of x over the ranks, added up in rank order as rvma's
 * AllreduceFloat64 does (MPI_Allreduce's order is the library's). */
static KEEP double sum_in_rank_order(double x, int size) {
    double *all = xcalloc((size_t)size, sizeof(double));
    MPI_Allgather(&x, 1, MPI_DOUBLE, all, 1, MPI_DOUBLE, MPI_COMM_WORLD);
    double s = all[0];
    for (int r = 1; r < size; r++) s += all[r];
    free(all);
    return s;
}

/* run_variant runs one variant from the initial state: the slowest rank's
 * time per iteration in us and the global checksum. */
static KEEP void run_variant(struct grid *g, const char *sync, const struct opts *o, double *us, double *sum) {
    int lock = !strcmp(sync, "lock");
    init_arrays(g);
    if (lock) {
        MPI_Win_lock_all(0, g->win);
        MPI_Win_sync(g->win); /* the cleared counters, before anyone adds to them */
    }
    MPI_Barrier(MPI_COMM_WORLD);
    int cur = 0;
    double t0 = 0;
    for (int it = 1; it <= o->warmup + o->iters; it++) {
        if (it == o->warmup + 1) {
            MPI_Barrier(MPI_COMM_WORLD);
            t0 = MPI_Wtime();
        }
        exchange(g, sync, cur, it);
        if (!o->exchange_only) jacobi(g->u[1 - cur], g->u[cur], g->nx, g->ny, g->nz, g->sx, g->sy);
        cur = 1 - cur;
    }
    double el = MPI_Wtime() - t0, max;
    if (lock) MPI_Win_unlock_all(g->win);
    MPI_Allreduce(&el, &max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    *sum = sum_in_rank_order(interior_sum(g->u[cur], g->nx, g->ny, g->nz, g->sx, g->sy), g->size);
    MPI_Barrier(MPI_COMM_WORLD);
    *us = max / o->iters * 1e6;
}

static double serial(int gx, int gy, int gz, int steps) {
    long ty = gz + 2, tx = (gy + 2) * ty, n = (gx + 2) * tx;
    double *a = xcalloc((size_t)n, sizeof(double)), *b = xcalloc((size_t)n, sizeof(double));
    init_array(a, gx, gy, gz, 0, 0, 0, 1);
    init_array(b, gx, gy, gz, 0, 0, 0, 1);
    for (int i = 0; i < steps; i++) {
        jacobi(b, a, gx, gy, gz, tx, ty);
        double *t = a;
        a = b, b = t;
    }
    double s = interior_sum(a, gx, gy, gz, tx, ty);
    free(a), free(b);
    return s;
}

static double maxf(double a, double b) { return a > b ? a : b; }

static int close_to(double a, double b) {
    double m = maxf(fabs(a), fabs(b));
    return fabs(a - b) <= 1e-9 * maxf(m, 1);
}

/* go_float formats f as Go's encoding/json does: the shortest decimal that
 * reads back as f, without an exponent unless |f| < 1e-6 or >= 1e21. */
static void go_float(char *out, size_t size, double f) {
    if (f == 0 || !isfinite(f)) {
        snprintf(out, size, f == 0 ? (signbit(f) ? "-0" : "0") : "null");
        return;
    }
    char e[40];
    int p;
    for (p = 1; p < 17; p++) {
        snprintf(e, sizeof e, "%.*e", p - 1, f);
        if (strtod(e, NULL) == f) break;
    }
    snprintf(e, sizeof e, "%.*e", p - 1, f);
    double a = fabs(f);
    if (a < 1e-6 || a >= 1e21) {
        size_t n = strlen(e); /* Go: e-07 is e-7, e+21 stays */
        if (n >= 4 && e[n - 4] == 'e' && e[n - 3] == '-' && e[n - 2] == '0') e[n - 2] = e[n - 1], e[n - 1] = 0;
        snprintf(out, size, "%s", e);
        return;
    }
    char digits[40], *q = e, *o = out;
    int nd = 0;
    if (*q == '-') *o++ = *q++;
    for (; *q && *q != 'e'; q++)
        if (*q != '.') digits[nd++] = *q;
    int exp = atoi(q + 1);
    if (exp < 0) {
        o += sprintf(o, "0.");
        for (int i = 0; i < -exp - 1; i++) *o++ = '0';
        memcpy(o, digits, (size_t)nd), o += nd;
    } else {
        for (int i = 0; i <= exp; i++) *o++ = i < nd ? digits[i] : '0';
        if (nd > exp + 1) {
            *o++ = '.';
            memcpy(o, digits + exp + 1, (size_t)(nd - exp - 1)), o += nd - exp - 1;
        }
    }
    *o = 0;
}

static void print_json(const struct result *r, const struct opts *o) {
    char us[48], sum[48];
    go_float(us, sizeof us, r->us);
    go_float(sum, sizeof sum, r->checksum);
    printf("{\"example\":\"halo3d\",\"sync\":\"%s\",\"ranks\":%d,\"dims\":\"%s\",\"n\":%d,\"iters\":%d,\"warmup\":%d,"
           "\"compute\":%s,\"us_per_iter\":%s,\"checksum\":%s,\"ok\":%s}\n",
           r->sync, r->ranks, r->dims, o->local[0], o->iters, o->warmup, r->compute ? "true" : "false", us, sum,
           r->ok ? "true" : "false");
}

static void usage(const char *why) {
    if (my_rank == 0) {
        if (why) fprintf(stderr, "halo3d (MPI): %s\n", why);
        fprintf(stderr, "usage: halo3d [-n N] [-l NX,NY,NZ] [--iters N] [--warmup N] [--sync sendrecv,fence,pscw,lock] "
                        "[--exchange-only] [--json] [--serial=false]\n");
    }
    MPI_Finalize();
    exit(2);
}

static int parse_int(const char *v, int *out) {
    char *end;
    long x = strtol(v, &end, 10);
    if (end == v || *end || x < -2147483647L || x > 2147483647L) return -1;
    *out = (int)x;
    return 0;
}

static int parse_bool(const char *v, int *out) {
    static const char *t[] = {"1", "t", "T", "true", "TRUE", "True"}, *f[] = {"0", "f", "F", "false", "FALSE", "False"};
    for (int i = 0; i < 6; i++) {
        if (!strcmp(v, t[i])) return *out = 1, 0;
        if (!strcmp(v, f[i])) return *out = 0, 0;
    }
    return -1;
}

/* parse_args takes flags as Go's flag package does: -name or --name, a
 * value as the next argument or after =, booleans only after =. */
static void parse_args(int argc, char **argv, struct opts *o) {
    int n = 64;
    const char *local = NULL;
    char *syncs = "sendrecv,fence,pscw,lock";
    for (int i = 1; i < argc; i++) {
        char *a = argv[i];
        if (a[0] != '-' || !a[1]) usage("unexpected argument");
        a += a[1] == '-' ? 2 : 1;
        char name[32];
        const char *v = strchr(a, '=');
        size_t len = v ? (size_t)(v - a) : strlen(a);
        if (len >= sizeof name) usage("unknown flag");
        memcpy(name, a, len), name[len] = 0;
        if (v) v++;
        int *b = !strcmp(name, "exchange-only") ? &o->exchange_only
                 : !strcmp(name, "json")        ? &o->json
                 : !strcmp(name, "serial")      ? &o->serial
                                                : NULL;
        if (b) {
            if (v ? parse_bool(v, b) : (*b = 1, 0)) usage("bad boolean");
            continue;
        }
        if (!strcmp(name, "h") || !strcmp(name, "help")) usage(NULL);
        if (!v) {
            if (i + 1 >= argc) usage("flag needs an argument");
            v = argv[++i];
        }
        int bad = 0;
        if (!strcmp(name, "n"))
            bad = parse_int(v, &n);
        else if (!strcmp(name, "l"))
            local = v;
        else if (!strcmp(name, "iters"))
            bad = parse_int(v, &o->iters);
        else if (!strcmp(name, "warmup"))
            bad = parse_int(v, &o->warmup);
        else if (!strcmp(name, "sync"))
            syncs = strdup(v);
        else
            usage("unknown flag");
        if (bad) usage("bad number");
    }
    o->local[0] = o->local[1] = o->local[2] = n;
    if (local && sscanf(local, "%d,%d,%d", &o->local[0], &o->local[1], &o->local[2]) != 3) usage("-l NX,NY,NZ");
    for (char *save = NULL, *t = strtok_r(strdup(syncs), ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (!strcmp(t, "notify")) usage("notify is rvma's notified window, which MPI has not");
        if (strcmp(t, "sendrecv") && strcmp(t, "fence") && strcmp(t, "pscw") && strcmp(t, "lock"))
            usage("unknown --sync variant");
        if (o->nsyncs == MAX_SYNCS) usage("too many variants");
        o->syncs[o->nsyncs++] = t;
    }
    if (!o->nsyncs || o->iters < 1 || o->warmup < 0 || o->local[0] < 1 || o->local[1] < 1 || o->local[2] < 1)
        usage("bad sizes");
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int size;
    MPI_Comm_rank(MPI_COMM_WORLD, &my_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    struct opts o = {.iters = 100, .warmup = 10, .serial = 1};
    parse_args(argc, argv, &o);

    struct grid g;
    new_grid(&g, my_rank, size, o.local);
    int *model, found;
    MPI_Win_get_attr(g.win, MPI_WIN_MODEL, &model, &found);
    if (!found || *model != MPI_WIN_UNIFIED)
        for (int i = 0; i < o.nsyncs; i++)
            if (!strcmp(o.syncs[i], "lock")) die("lock needs the unified memory model, which this window has not");

    /* sendrecv's checksum is the reference */
    const char *order[MAX_SYNCS + 1];
    int norder = 0, skip_first = 0;
    if (strcmp(o.syncs[0], "sendrecv")) order[norder++] = "sendrecv", skip_first = 1;
    for (int i = 0; i < o.nsyncs; i++) order[norder++] = o.syncs[i];
    struct result res[MAX_SYNCS];
    int nres = 0, all_ok = 1;
    double ref = 0;
    for (int i = 0; i < norder; i++) {
        double us, sum;
        run_variant(&g, order[i], &o, &us, &sum);
        if (i == 0) ref = sum;
        if (i == 0 && skip_first) continue;
        struct result *r = &res[nres++];
        *r = (struct result){.sync = order[i], .ranks = size, .compute = !o.exchange_only, .us = us, .checksum = sum,
                             .ok = close_to(sum, ref)};
        snprintf(r->dims, sizeof r->dims, "%dx%dx%d", g.dims[0], g.dims[1], g.dims[2]);
        all_ok = all_ok && r->ok;
        if (my_rank == 0 && o.json) print_json(r, &o);
    }
    if (my_rank == 0 && !o.json) {
        printf("halo3d: %d ranks (%dx%dx%d), %dx%dx%d per rank, %d+%d iterations%s\n", size, g.dims[0], g.dims[1], g.dims[2],
               o.local[0], o.local[1], o.local[2], o.warmup, o.iters, o.exchange_only ? ", exchange only" : "");
        double fence = 0;
        for (int i = 0; i < nres; i++)
            if (!strcmp(res[i].sync, "fence")) fence = res[i].us;
        for (int i = 0; i < nres; i++) {
            char ratio[48] = "";
            if (fence > 0) snprintf(ratio, sizeof ratio, "  %.2fx fence", res[i].us / fence);
            printf("  %-9s %10.1f us/iter%s  checksum %.10f  ok=%s\n", res[i].sync, res[i].us, ratio, res[i].checksum,
                   res[i].ok ? "true" : "false");
        }
    }
    if (o.serial && !o.exchange_only && my_rank == 0) {
        int gx = o.local[0] * g.dims[0], gy = o.local[1] * g.dims[1], gz = o.local[2] * g.dims[2];
        int steps = o.warmup + o.iters;
        double t0 = MPI_Wtime(), sum = serial(gx, gy, gz, steps);
        struct result r = {.sync = "serial-ref", .ranks = 1, .dims = "1x1x1", .compute = 1, .checksum = sum, .ok = close_to(sum, ref)};
        r.us = (double)(long long)((MPI_Wtime() - t0) * 1e6) / steps; /* whole microseconds, as halo3d */
        all_ok = all_ok && r.ok;
        if (o.json)
            print_json(&r, &o);
        else
            printf("  %-9s %10.1f us/iter  checksum %.10f  ok=%s (the whole %dx%dx%d grid on rank 0)\n", r.sync, r.us, r.checksum,
                   r.ok ? "true" : "false", gx, gy, gz);
    }
    fflush(stdout);
    free_grid(&g);
    MPI_Finalize();
    return all_ok ? 0 : 1;
}
