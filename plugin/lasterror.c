/* lasterror.c — gc_last_error's storage: one buffer per OS thread. Go sets
 * it through gc_set_last_error from the export the thread called into (a cgo
 * callback runs on the calling thread, and so does a C call made from it). */
#include <string.h>

#include "include/gradcomp.h"
#include "lasterror.h"

/* Messages longer than this (including the NUL) are cut; Go cuts them first
 * at a UTF-8 boundary (errorBufLen in status.go). */
#define GC_ERRBUF_LEN 1024

static __thread char gc_errbuf[GC_ERRBUF_LEN];

void gc_set_last_error(const char *msg, size_t len) {
	if (len >= GC_ERRBUF_LEN) {
		len = GC_ERRBUF_LEN - 1;
	}
	memcpy(gc_errbuf, msg, len);
	gc_errbuf[len] = '\0';
}

const char *gc_last_error(void) { return gc_errbuf; }
