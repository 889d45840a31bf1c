/* Assertions of the C test suite: each failure names the rank, the line,
 * the call, its code and rvma's message, and exits 1 (rvmarun then stops
 * the other ranks and fails the job). */
#ifndef RVMA_TEST_CHECK_H
#define RVMA_TEST_CHECK_H

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rvma.h"

static int me = -1, np = 0;
static rvma_comm world;

#define CHECK(call)                                                                                 \
	do {                                                                                        \
		int rc_ = (call);                                                                   \
		if (rc_ != RVMA_SUCCESS) {                                                          \
			fprintf(stderr, "[%d] %s:%d: %s: %s (%s)\n", me, __FILE__, __LINE__, #call, \
			        rvma_strerror(rc_), rvma_last_error_message());                      \
			exit(1);                                                                    \
		}                                                                                   \
	} while (0)

/* The call must fail with code, and leave a message. */
#define EXPECT_ERR(code, call)                                                                           \
	do {                                                                                             \
		int rc_ = (call);                                                                        \
		if (rc_ != (code)) {                                                                     \
			fprintf(stderr, "[%d] %s:%d: %s: got %s, want %s (%s)\n", me, __FILE__, __LINE__, \
			        #call, rvma_strerror(rc_), rvma_strerror(code), rvma_last_error_message()); \
			exit(1);                                                                         \
		}                                                                                        \
		if (rvma_last_error_message()[0] == 0) {                                                 \
			fprintf(stderr, "[%d] %s:%d: %s: no message\n", me, __FILE__, __LINE__, #call);   \
			exit(1);                                                                         \
		}                                                                                        \
	} while (0)

#define EXPECT(cond, ...)                                                                      \
	do {                                                                                   \
		if (!(cond)) {                                                                 \
			fprintf(stderr, "[%d] %s:%d: %s: ", me, __FILE__, __LINE__, #cond);    \
			fprintf(stderr, __VA_ARGS__);                                          \
			fprintf(stderr, "\n");                                                 \
			exit(1);                                                               \
		}                                                                              \
	} while (0)

static void setup(void) {
	CHECK(rvma_init(&world));
	CHECK(rvma_comm_rank(world, &me));
	CHECK(rvma_comm_size(world, &np));
}

/* Rank 0 says the test passed once every rank got there. */
static void finish(const char *name) {
	CHECK(rvma_barrier(world));
	CHECK(rvma_finalize());
	if (me == 0)
		printf("%s: ok on %d ranks\n", name, np);
}

/* A byte pattern that differs by origin, target and position. */
static inline unsigned char pat(int origin, int target, size_t i) {
	return (unsigned char)(origin * 31 + target * 7 + i * 13 + (i >> 8));
}

#endif
