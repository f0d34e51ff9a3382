/*
 * capi_check.h — the checking helpers of the C ABI tests (capi_test.c for
 * libgradcomp.so, capi_cuda_test.c for libgradcomp_cuda.so): check
 * counters, CHECK/OK/FAILS, and a deterministic gradient generator. Include
 * once, after gradcomp.h.
 */
#ifndef GRADCOMP_CAPI_CHECK_H
#define GRADCOMP_CAPI_CHECK_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static int checks, failures;

static void failf(const char *file, int line, const char *fmt, ...) {
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "%s:%d: ", file, line);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	__atomic_add_fetch(&failures, 1, __ATOMIC_RELAXED);
}

#define CHECK(cond, ...)                                            \
	do {                                                        \
		__atomic_add_fetch(&checks, 1, __ATOMIC_RELAXED);   \
		if (!(cond)) failf(__FILE__, __LINE__, __VA_ARGS__);          \
	} while (0)

/* OK(call): the call returns GC_OK. */
#define OK(call)                                                                            \
	do {                                                                                \
		gc_status st_ = (call);                                                     \
		CHECK(st_ == GC_OK, "%s = %d, want GC_OK (%s)", #call, st_, gc_last_error()); \
	} while (0)

/* FAILS(call, want, text): the call returns want and the thread's last error
 * contains text and, where call is a gc_ function, starts with its name. */
#define FAILS(call, want, text) expect_fail(__FILE__, __LINE__, #call, (call), (want), (text))

static void expect_fail(const char *file, int line, const char *call, gc_status got, gc_status want, const char *text) {
	__atomic_add_fetch(&checks, 1, __ATOMIC_RELAXED);
	const char *msg = gc_last_error();
	char fn[64];
	size_t i = 0;
	while (call[i] && call[i] != '(' && i < sizeof fn - 1) {
		fn[i] = call[i];
		i++;
	}
	fn[i] = '\0';
	if (got != want) {
		failf(file, line, "%s = %d, want %d (message: %s)", call, got, want, msg);
	} else if (msg == NULL || (strncmp(call, "gc_", 3) == 0 && strncmp(msg, fn, strlen(fn)) != 0) ||
	           strstr(msg, text) == NULL) {
		failf(file, line, "%s: message %s does not start with %s and say \"%s\"", call, msg ? msg : "(null)", fn, text);
	}
}

/* A deterministic gradient: Student-t-ish values from a xorshift generator. */
static inline void fill(float *g, size_t n, uint64_t seed) {
	uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
	for (size_t i = 0; i < n; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		double u = ((x >> 11) + 0.5) / 9007199254740992.0;
		double v = (double)(x & 0xFFFF) / 65536.0 - 0.5;
		g[i] = (float)((u - 0.5) * 2.0 + v * v * v * 8.0);
	}
}

#endif
