/* lasterror.h — the per-thread last-error buffer behind gc_last_error()
 * (gradcomp.h); private to libgradcomp.so. */
#ifndef GRADCOMP_LASTERROR_H
#define GRADCOMP_LASTERROR_H

#include <stddef.h>

/* Sets the calling thread's last-error message to msg[0..len), truncated to
 * the buffer, NUL-terminated. msg need not be NUL-terminated. */
__attribute__((visibility("hidden"))) void gc_set_last_error(const char *msg, size_t len);

#endif
