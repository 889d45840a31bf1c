// Private helpers of librvma (helpers.c), called from Go.
#ifndef RVMA_HELPERS_H
#define RVMA_HELPERS_H

#include <stddef.h>

// Hidden: they are no part of librvma's interface.
#define RVMA_HIDDEN __attribute__((visibility("hidden")))

RVMA_HIDDEN void rvma__set_error(const char *msg, size_t n);
RVMA_HIDDEN void *rvma__alloc(size_t n);
RVMA_HIDDEN void rvma__free(void *p);
RVMA_HIDDEN const char *rvma__transport_name(int i);

#endif
