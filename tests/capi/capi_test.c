/*
 * capi_test.c — drives every function of gradcomp.h through libgradcomp.so:
 * round trips for several specs, error feedback (plain and deferred, with
 * commit, retain and discard), state save/load, bad inputs of every kind,
 * calls from several threads at once, and 10,000 compress/decompress calls
 * with the process's RSS before and after. Prints one line per failed check
 * and a summary; exits 1 if any check failed.
 *
 * Built by `make capi`:
 *   cc -std=c11 -Iplugin/include tests/capi/capi_test.c -Lbuild -lgradcomp -pthread
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gradcomp.h"

#include "capi_check.h"

static gc_compressor create(const char *spec) {
	gc_compressor h = 0;
	gc_status st = gc_compressor_create(spec, 1, &h);
	CHECK(st == GC_OK && h != 0, "create(%s) = %d, handle %llu (%s)", spec, st, (unsigned long long)h,
	      gc_last_error());
	return h;
}

/* compress_alloc compresses into a fresh buffer of gc_max_encoded_len bytes. */
static uint8_t *compress_alloc(gc_compressor h, uint64_t bucket, uint64_t step, uint32_t flags, const float *g,
                               size_t n, size_t *written, gc_status *st) {
	size_t cap = 0;
	OK(gc_max_encoded_len(h, n, &cap));
	uint8_t *p = malloc(cap ? cap : 1);
	*st = gc_compress(h, bucket, step, flags, g, n, p, cap, written);
	return p;
}

/* state returns h's saved error-feedback memory (malloc'd) and its length. */
static uint8_t *state(gc_compressor h, size_t *len) {
	*len = 0;
	OK(gc_state_size(h, len));
	uint8_t *s = malloc(*len + 1);
	size_t w = 0;
	OK(gc_state_save(h, s, *len, &w));
	CHECK(w == *len, "state_save wrote %zu, state_size said %zu", w, *len);
	return s;
}

/* residual reads bucket's residual out of a saved state (format "GCEF" v1,
 * see compress/feedback.go) into e[0..n); returns 0 if it is not there. */
static int residual(const uint8_t *s, size_t len, uint64_t bucket, float *e, size_t n) {
	if (len < 13 || memcmp(s, "GCEF", 4) != 0) return 0;
	uint32_t count;
	memcpy(&count, s + 5, 4);
	size_t off = 9;
	for (uint32_t b = 0; b < count && off + 16 <= len; b++) {
		uint64_t id, m;
		memcpy(&id, s + off, 8);
		memcpy(&m, s + off + 8, 8);
		off += 16;
		if (id == bucket && m == n && off + 4 * n <= len) {
			memcpy(e, s + off, 4 * n);
			return 1;
		}
		off += 4 * m;
	}
	return 0;
}

static void test_version(void) {
	uint32_t v = gc_abi_version();
	CHECK(v >> 16 == GRADCOMP_ABI_MAJOR && (long)(v & 0xFFFF) >= (long)GRADCOMP_ABI_MINOR,
	      "gc_abi_version = %#x, header is %#x", v, GRADCOMP_ABI_VERSION);
	const char *ver = gc_version();
	CHECK(ver != NULL && ver[0] != '\0', "gc_version is empty");
	CHECK(gc_last_error() != NULL, "gc_last_error is NULL");
}

/* Round trips: payload length, decode, decode-add, exactness of the lossless
 * specs, and the error-feedback invariant e == g − D(c) on a first call. */
static void test_roundtrip(void) {
	static const char *specs[] = {
	    "none", "fp16", "bf16", "topk:0.01", "topk:0.1:sampled", "randomk:0.05",
	    "int8", "int4:bucket=128", "int2", "sign", "topk:0.05:lossless=zstd", "int4:lossless=huff0",
	};
	const size_t n = 10007;
	float *g = malloc(4 * n), *d = malloc(4 * n), *d2 = malloc(4 * n), *e = malloc(4 * n);
	fill(g, n, 1);
	for (size_t s = 0; s < sizeof specs / sizeof *specs; s++) {
		const char *spec = specs[s];
		gc_compressor h = create(spec);
		char buf[128];
		size_t len = 0;
		OK(gc_compressor_spec(h, buf, sizeof buf, &len));
		CHECK(len == strlen(buf) && len > 0, "%s: spec length %zu, string %s", spec, len, buf);
		gc_compressor h2 = create(buf); /* the canonical spec is accepted and canonical */
		char buf2[128];
		OK(gc_compressor_spec(h2, buf2, sizeof buf2, &len));
		CHECK(strcmp(buf, buf2) == 0, "%s: canonical %s re-parses as %s", spec, buf, buf2);

		size_t cap = 0, w = 0, pl = 0;
		OK(gc_max_encoded_len(h, n, &cap));
		gc_status st;
		uint8_t *p = compress_alloc(h, 3, 9, 0, g, n, &w, &st);
		CHECK(st == GC_OK && w > 56 && w <= cap, "%s: compress = %d, %zu of %zu bytes (%s)", spec, st, w, cap,
		      gc_last_error());
		OK(gc_payload_len(p, w, &pl));
		CHECK(pl == w, "%s: gc_payload_len = %zu, compress wrote %zu", spec, pl, w);
		OK(gc_decompress(h, p, w, d, n));
		OK(gc_decompress(h2, p, w, d2, n)); /* a second compressor of the same spec decodes it */
		OK(gc_decompress_add(h, p, w, d2, n));
		double num = 0, den = 0;
		int bad = 0;
		for (size_t i = 0; i < n; i++) {
			bad += d2[i] != 2 * d[i] || !isfinite(d[i]);
			num += (double)(d[i] - g[i]) * (d[i] - g[i]);
			den += (double)g[i] * g[i];
		}
		CHECK(bad == 0, "%s: decompress_add onto the decoded values is not 2·D(c) at %d elements", spec, bad);
		if (strcmp(spec, "none") == 0) CHECK(num == 0, "%s: not exact (error %g)", spec, sqrt(num / den));
		CHECK(sqrt(num / den) < 1.0 + 1e-6 || strcmp(spec, "int2") == 0 || strcmp(spec, "sign") == 0,
		      "%s: relative L2 error %g is larger than sending nothing", spec, sqrt(num / den));

		/* Error feedback, first call: the residual is exactly g − D(c). */
		uint8_t *q = compress_alloc(h, 4, 0, GC_FEEDBACK, g, n, &w, &st);
		CHECK(st == GC_OK, "%s: feedback compress = %d (%s)", spec, st, gc_last_error());
		OK(gc_decompress(h, q, w, d, n));
		size_t slen;
		uint8_t *sv = state(h, &slen);
		CHECK(residual(sv, slen, 4, e, n), "%s: bucket 4 missing from the saved state", spec);
		bad = 0;
		for (size_t i = 0; i < n; i++) bad += e[i] != g[i] - d[i];
		CHECK(bad == 0, "%s: residual != g − D(c) at %d elements", spec, bad);
		free(sv);
		free(q);
		free(p);
		OK(gc_compressor_destroy(h2));
		OK(gc_compressor_destroy(h));
	}
	free(g);
	free(d);
	free(d2);
	free(e);
}

/* Deferred error feedback: commit equals plain feedback, retain keeps the
 * whole sum, discard leaves the residual as it was, and a held bucket refuses
 * other feedback calls and state operations instead of waiting. */
static void test_deferred(void) {
	const size_t n = 4096;
	const uint64_t b = 7;
	float *g = malloc(4 * n), *e = malloc(4 * n);
	gc_compressor plain = create("topk:0.05"), def = create("topk:0.05");
	gc_status st;
	size_t w1, w2;
	for (uint64_t step = 0; step < 5; step++) {
		fill(g, n, 100 + step);
		uint8_t *p1 = compress_alloc(plain, b, step, GC_FEEDBACK, g, n, &w1, &st);
		uint8_t *p2 = compress_alloc(def, b, step, GC_FEEDBACK | GC_DEFER, g, n, &w2, &st);
		CHECK(st == GC_OK, "deferred compress = %d (%s)", st, gc_last_error());
		size_t w3, sl;
		uint8_t *p3 = compress_alloc(def, b, step, GC_FEEDBACK, g, n, &w3, &st);
		FAILS(st, GC_ERR_STATE, "not settled");
		CHECK(w3 == 0, "a refused compress wrote %zu", w3);
		free(p3);
		p3 = compress_alloc(def, b, step, GC_FEEDBACK | GC_DEFER, g, n, &w3, &st);
		FAILS(st, GC_ERR_STATE, "gc_settle");
		free(p3);
		FAILS(gc_state_size(def, &sl), GC_ERR_STATE, "not settled");
		OK(gc_settle(def, b, GC_COMMIT));
		FAILS(gc_settle(def, b, GC_COMMIT), GC_ERR_STATE, "no deferred compress");
		CHECK(w1 == w2 && memcmp(p1, p2, w1) == 0, "step %llu: deferred+commit payload differs from plain feedback",
		      (unsigned long long)step);
		free(p1);
		free(p2);
	}
	/* Another bucket proceeds while bucket b is held. */
	uint8_t *held = compress_alloc(def, b, 5, GC_FEEDBACK | GC_DEFER, g, n, &w1, &st);
	uint8_t *other = compress_alloc(def, b + 1, 5, GC_FEEDBACK, g, n, &w2, &st);
	CHECK(st == GC_OK, "bucket %llu blocked by held bucket %llu: %d", (unsigned long long)b + 1,
	      (unsigned long long)b, st);
	free(held);
	free(other);
	OK(gc_settle(def, b, GC_DISCARD));

	/* Discard: the residual is byte for byte what it was. */
	size_t l0, l1;
	uint8_t *s0 = state(def, &l0);
	fill(g, n, 999);
	uint8_t *p = compress_alloc(def, b, 6, GC_FEEDBACK | GC_DEFER, g, n, &w1, &st);
	OK(gc_settle(def, b, GC_DISCARD));
	uint8_t *s1 = state(def, &l1);
	CHECK(l0 == l1 && memcmp(s0, s1, l0) == 0, "discard changed the state");
	free(p);
	free(s1);

	/* Retain: e ← e + g exactly. */
	float *before = malloc(4 * n);
	CHECK(residual(s0, l0, b, before, n), "bucket 7 missing from the state");
	p = compress_alloc(def, b, 6, GC_FEEDBACK | GC_DEFER, g, n, &w1, &st);
	OK(gc_settle(def, b, GC_RETAIN));
	s1 = state(def, &l1);
	CHECK(residual(s1, l1, b, e, n), "bucket 7 missing from the state");
	int bad = 0;
	for (size_t i = 0; i < n; i++) bad += e[i] != before[i] + g[i];
	CHECK(bad == 0, "retain: residual != e + g at %d elements", bad);
	free(p);
	free(s0);
	free(s1);
	free(before);

	FAILS(gc_settle(def, b, (gc_settle_mode)3), GC_ERR_INVALID, "settle mode");
	p = compress_alloc(def, b, 7, GC_DEFER, g, n, &w1, &st);
	FAILS(st, GC_ERR_INVALID, "GC_DEFER needs GC_FEEDBACK");
	free(p);
	/* A destroyed compressor drops its held bucket. */
	p = compress_alloc(def, b, 7, GC_FEEDBACK | GC_DEFER, g, n, &w1, &st);
	OK(st);
	free(p);
	OK(gc_compressor_destroy(def));
	FAILS(gc_settle(def, b, GC_COMMIT), GC_ERR_HANDLE, "not a live compressor");
	OK(gc_compressor_destroy(plain));
	free(g);
	free(e);
}

/* State: a saved state loaded elsewhere continues identically; corrupted,
 * truncated, extended or short-buffer states fail and change nothing. */
static void test_state(void) {
	const size_t n = 3000;
	float *g = malloc(4 * n);
	gc_compressor a = create("int4"), b = create("int4");
	gc_status st;
	size_t w;
	for (uint64_t step = 0; step < 3; step++) {
		for (uint64_t k = 0; k < 3; k++) {
			fill(g, n - 100 * k, 10 * step + k);
			free(compress_alloc(a, k, step, GC_FEEDBACK, g, n - 100 * k, &w, &st));
			OK(st);
		}
	}
	/* b gets a state of its own first, to see that failed loads keep it. */
	fill(g, n, 77);
	free(compress_alloc(b, 42, 0, GC_FEEDBACK, g, n, &w, &st));
	size_t la, lb, l;
	uint8_t *sa = state(a, &la), *sb = state(b, &lb);
	CHECK(la == 9 + 3 * 16 + 4 * (3 * n - 300) + 4, "state of 3 buckets is %zu bytes", la);

	uint8_t *bad = malloc(la + 1);
	memcpy(bad, sa, la);
	bad[la / 2] ^= 1;
	FAILS(gc_state_load(b, bad, la), GC_ERR_CORRUPT, "checksum");
	memcpy(bad, sa, la);
	bad[4] = 2;
	FAILS(gc_state_load(b, bad, la), GC_ERR_CORRUPT, "version");
	FAILS(gc_state_load(b, sa, la - 1), GC_ERR_CORRUPT, "truncated");
	FAILS(gc_state_load(b, sa, 3), GC_ERR_CORRUPT, "truncated");
	memcpy(bad, sa, la);
	bad[la] = 0;
	FAILS(gc_state_load(b, bad, la + 1), GC_ERR_CORRUPT, "after the end");
	FAILS(gc_state_load(b, NULL, la), GC_ERR_INVALID, "null src");
	uint8_t *sb2 = state(b, &l);
	CHECK(l == lb && memcmp(sb, sb2, l) == 0, "a failed load changed the state");
	free(sb2);
	size_t need = 0;
	FAILS(gc_state_save(a, bad, la - 1, &need), GC_ERR_SIZE, "state needs");
	CHECK(need == la, "state_save on a short buffer reported %zu, want %zu", need, la);
	FAILS(gc_state_save(a, bad, la, NULL), GC_ERR_INVALID, "null written");
	FAILS(gc_state_size(a, NULL), GC_ERR_INVALID, "null len");

	OK(gc_state_load(b, sa, la));
	uint8_t *sb3 = state(b, &l);
	CHECK(l == la && memcmp(sa, sb3, l) == 0, "loaded state saves differently");
	free(sb3);
	for (uint64_t k = 0; k < 3; k++) {
		size_t wa, wb;
		gc_status sta, stb;
		fill(g, n - 100 * k, 1000 + k);
		uint8_t *pa = compress_alloc(a, k, 3, GC_FEEDBACK, g, n - 100 * k, &wa, &sta);
		uint8_t *pb = compress_alloc(b, k, 3, GC_FEEDBACK, g, n - 100 * k, &wb, &stb);
		CHECK(sta == GC_OK && stb == GC_OK && wa == wb && memcmp(pa, pb, wa) == 0,
		      "bucket %llu: payloads after load differ", (unsigned long long)k);
		free(pa);
		free(pb);
	}
	/* An empty state (a compressor that never used feedback) loads too. */
	gc_compressor c = create("int4");
	uint8_t *sc = state(c, &l);
	CHECK(l == 13, "empty state is %zu bytes", l);
	OK(gc_state_load(a, sc, l));
	OK(gc_state_size(a, &l));
	CHECK(l == 13, "after loading an empty state, the state is %zu bytes", l);
	free(sc);
	OK(gc_compressor_destroy(c));
	OK(gc_compressor_destroy(a));
	OK(gc_compressor_destroy(b));
	free(sa);
	free(sb);
	free(bad);
	free(g);
}

/* Bad inputs: each fails with its status and a message, never a crash. */
static void test_bad_inputs(void) {
	const size_t n = 1000;
	float g[1000], d[1000], keep[1000];
	fill(g, n, 5);
	gc_compressor h = 0;
	FAILS(gc_compressor_create(NULL, 1, &h), GC_ERR_INVALID, "null spec");
	FAILS(gc_compressor_create("int8", 1, NULL), GC_ERR_INVALID, "null out");
	FAILS(gc_compressor_create("zip", 1, &h), GC_ERR_SPEC, "unknown codec");
	FAILS(gc_compressor_create("topk:2", 1, &h), GC_ERR_SPEC, "topk:2");
	FAILS(gc_compressor_create("int8:bucket=0", 1, &h), GC_ERR_SPEC, "bucket");
	FAILS(gc_compressor_create("", 1, &h), GC_ERR_SPEC, "empty");
	CHECK(h == 0, "a failed create wrote handle %llu", (unsigned long long)h);
	OK(gc_compressor_create("int8", 0, &h)); /* workers ≤ 0: all CPUs */
	gc_compressor t = create("topk:0.1");

	char small[4];
	size_t len = 0;
	FAILS(gc_compressor_spec(h, small, sizeof small, &len), GC_ERR_SIZE, "needs 5");
	CHECK(len == 4, "spec length on GC_ERR_SIZE = %zu, want 4", len);
	FAILS(gc_compressor_spec(h, NULL, 0, &len), GC_ERR_SIZE, "needs");
	FAILS(gc_compressor_spec(h, NULL, 10, &len), GC_ERR_INVALID, "null buf");
	FAILS(gc_compressor_spec(h, small, sizeof small, NULL), GC_ERR_INVALID, "null len");
	{ /* gc_spec_canonical: any spec the engine takes, powersgd (no compressor's) included */
		char buf[64];
		OK(gc_spec_canonical("powersgd:2:warm=on:min_compression=2", buf, sizeof buf, &len));
		CHECK(strcmp(buf, "powersgd:2") == 0 && len == 10, "canonical powersgd:2:warm=on:min_compression=2 = %s (%zu)", buf, len);
		OK(gc_spec_canonical("int4:round=stochastic", buf, sizeof buf, &len));
		char want[64];
		gc_compressor c4 = create("int4:round=stochastic");
		OK(gc_compressor_spec(c4, want, sizeof want, &len));
		CHECK(strcmp(buf, want) == 0, "canonical int4:round=stochastic = %s, its compressor's %s", buf, want);
		OK(gc_compressor_destroy(c4));
		FAILS(gc_spec_canonical("powersgd:0", buf, sizeof buf, &len), GC_ERR_SPEC, "rank");
		FAILS(gc_spec_canonical("int8", small, sizeof small, &len), GC_ERR_SIZE, "needs 5");
		FAILS(gc_spec_canonical(NULL, buf, sizeof buf, &len), GC_ERR_INVALID, "null spec");
		FAILS(gc_spec_canonical("int8", buf, sizeof buf, NULL), GC_ERR_INVALID, "null len");
	}
	size_t cap = 0;
	FAILS(gc_max_encoded_len(h, n, NULL), GC_ERR_INVALID, "null out");
	FAILS(gc_max_encoded_len(h, SIZE_MAX, &cap), GC_ERR_INVALID, "exceeds");
	OK(gc_max_encoded_len(h, n, &cap));

	uint8_t *p = malloc(cap + 64), *q = malloc(cap + 64);
	size_t w = 99;
	FAILS(gc_compress(h, 0, 0, 0, NULL, n, p, cap, &w), GC_ERR_INVALID, "null grad");
	CHECK(w == 0, "a failed compress left *written = %zu", w);
	FAILS(gc_compress(h, 0, 0, 0, g, n, NULL, cap, &w), GC_ERR_INVALID, "null dst");
	FAILS(gc_compress(h, 0, 0, 0, g, n, p, cap, NULL), GC_ERR_INVALID, "null written");
	FAILS(gc_compress(h, 0, 0, 0, g, n, p, cap - 1, &w), GC_ERR_SIZE, "gc_max_encoded_len");
	FAILS(gc_compress(h, 0, 0, 0, g, SIZE_MAX, p, cap, &w), GC_ERR_INVALID, "exceeds");
	FAILS(gc_compress(h, 0, 0, 0, g, n, p, SIZE_MAX, &w), GC_ERR_INVALID, "plausible");
	FAILS(gc_compress(h, 0, 0, 8, g, n, p, cap, &w), GC_ERR_INVALID, "unknown flag");

	/* Error feedback: a bucket's length is fixed by its first call. */
	OK(gc_compress(h, 1, 0, GC_FEEDBACK, g, n, p, cap, &w));
	FAILS(gc_compress(h, 1, 1, GC_FEEDBACK, g, n - 1, p, cap, &w), GC_ERR_SIZE, "bucket 1");

	/* NaN and Inf: GC_ERR_NONFINITE naming the index; the residual is untouched. */
	size_t l0, l1;
	uint8_t *s0 = state(h, &l0);
	float nan_g[1000];
	memcpy(nan_g, g, sizeof nan_g);
	nan_g[321] = NAN;
	FAILS(gc_compress(h, 1, 1, GC_FEEDBACK, nan_g, n, p, cap, &w), GC_ERR_NONFINITE, "index 321");
	nan_g[321] = 1;
	nan_g[5] = -INFINITY;
	FAILS(gc_compress(h, 1, 1, GC_FEEDBACK | GC_DEFER, nan_g, n, p, cap, &w), GC_ERR_NONFINITE, "index 5");
	FAILS(gc_settle(h, 1, GC_COMMIT), GC_ERR_STATE, "no deferred");
	FAILS(gc_compress(h, 2, 1, 0, nan_g, n, p, cap, &w), GC_ERR_NONFINITE, "-Inf");
	uint8_t *s1 = state(h, &l1);
	CHECK(l0 == l1 && memcmp(s0, s1, l0) == 0, "a non-finite gradient changed the residual");
	free(s0);
	free(s1);

	/* Payloads: exact, padded, corrupted, truncated, of another codec or length. */
	OK(gc_compress(h, 3, 0, 0, g, n, p, cap, &w));
	for (size_t i = 0; i < n; i++) d[i] = keep[i] = (float)i;
	memcpy(q, p, w);
	memset(q + w, 0xAB, 64); /* a padded slot */
	size_t pl = 0;
	OK(gc_payload_len(q, w + 64, &pl));
	CHECK(pl == w, "gc_payload_len of a padded slot = %zu, want %zu", pl, w);
	FAILS(gc_decompress(h, q, w + 64, d, n), GC_ERR_CORRUPT, "gc_payload_len");
	FAILS(gc_payload_len(q, 55, &pl), GC_ERR_CORRUPT, "56-byte");
	FAILS(gc_payload_len(q, w - 1, &pl), GC_ERR_CORRUPT, "only");
	FAILS(gc_payload_len(NULL, 60, &pl), GC_ERR_INVALID, "null buf");
	FAILS(gc_payload_len(q, w, NULL), GC_ERR_INVALID, "null out");
	q[w / 2] ^= 0x10;
	FAILS(gc_decompress(h, q, w, d, n), GC_ERR_CORRUPT, "checksum");
	FAILS(gc_decompress_add(h, q, w, d, n), GC_ERR_CORRUPT, "checksum");
	q[w / 2] ^= 0x10;
	FAILS(gc_decompress(h, q, w - 1, d, n), GC_ERR_CORRUPT, "");
	FAILS(gc_decompress(h, q, 10, d, n), GC_ERR_CORRUPT, "shorter");
	memcpy(q, "JUNK", 4);
	FAILS(gc_payload_len(q, w, &pl), GC_ERR_CORRUPT, "magic");
	FAILS(gc_decompress(h, q, w, d, n), GC_ERR_CORRUPT, "magic");
	FAILS(gc_decompress(h, p, w, d, n - 1), GC_ERR_SIZE, "destination length");
	FAILS(gc_decompress(h, p, w, NULL, n), GC_ERR_INVALID, "null dst");
	FAILS(gc_decompress(h, NULL, w, d, n), GC_ERR_INVALID, "null payload");
	FAILS(gc_decompress_add(h, p, w, d, SIZE_MAX), GC_ERR_INVALID, "exceeds");
	FAILS(gc_decompress(t, p, w, d, n), GC_ERR_MISMATCH, "codec");
	gc_compressor h16 = create("int8:bucket=256");
	FAILS(gc_decompress(h16, p, w, d, n), GC_ERR_MISMATCH, "parameter A");
	OK(gc_compressor_destroy(h16));
	CHECK(memcmp(d, keep, sizeof d) == 0, "a failed decompress wrote to dst");
	OK(gc_decompress(h, p, w, d, n));

	/* Handles: 0, never created, destroyed. */
	gc_compressor dead = create("sign");
	OK(gc_compressor_destroy(dead));
	const gc_compressor badh[] = {0, 0xDEADBEEFull, dead};
	for (size_t i = 0; i < 3; i++) {
		gc_compressor x = badh[i];
		FAILS(gc_compressor_destroy(x), GC_ERR_HANDLE, "not a live compressor");
		FAILS(gc_compressor_spec(x, small, sizeof small, &len), GC_ERR_HANDLE, "not a live");
		FAILS(gc_max_encoded_len(x, n, &cap), GC_ERR_HANDLE, "not a live");
		FAILS(gc_compress(x, 0, 0, 0, g, n, p, cap, &w), GC_ERR_HANDLE, "not a live");
		FAILS(gc_settle(x, 0, GC_COMMIT), GC_ERR_HANDLE, "not a live");
		FAILS(gc_decompress(x, p, w, d, n), GC_ERR_HANDLE, "not a live");
		FAILS(gc_decompress_add(x, p, w, d, n), GC_ERR_HANDLE, "not a live");
		FAILS(gc_state_size(x, &len), GC_ERR_HANDLE, "not a live");
		FAILS(gc_state_save(x, p, cap, &w), GC_ERR_HANDLE, "not a live");
		FAILS(gc_state_load(x, p, cap), GC_ERR_HANDLE, "not a live");
	}
	FAILS(gc_live_handles(NULL), GC_ERR_INVALID, "null out");

	/* A long spec: the message is cut to the buffer, NUL-terminated. */
	char longspec[5000];
	memset(longspec, 'x', sizeof longspec - 1);
	longspec[sizeof longspec - 1] = '\0';
	FAILS(gc_compressor_create(longspec, 1, &h16), GC_ERR_SPEC, "bad spec");
	CHECK(strlen(gc_last_error()) <= 1023, "last error of %zu bytes", strlen(gc_last_error()));
	/* A success leaves the last error as it was. */
	OK(gc_max_encoded_len(h, n, &cap));
	CHECK(strstr(gc_last_error(), "bad spec \"xxx") != NULL, "a successful call changed the last error");

	OK(gc_compressor_destroy(h));
	OK(gc_compressor_destroy(t));
	free(p);
	free(q);
}

/* The cost model: on a 1 Gbit/s link top-k pays, on a link of negligible
 * transfer time it cannot, codec none never compresses, and bad arguments
 * fail. */
static void test_decide(void) {
	gc_compressor t = create("topk:0.01"), none = create("none");
	const size_t n = 1 << 20;
	int c = -1;
	double dense = -1, comp = -1;
	OK(gc_decide(t, "allgather", n, 4, 125e6, 50e-6, &c, &dense, &comp));
	printf("gc_decide(topk:0.01, allgather, n = 2^20, 4 ranks, 1 Gbit/s, 50 us): compress %d, dense %.3g s, "
	       "compressed %.3g s\n",
	       c, dense, comp);
	/* A dense all-reduce of 4 MiB among 4 ranks moves 6 MiB per rank: ≥ 50 ms at 125 MB/s. */
	CHECK(c == 1 && dense >= 0.75 * 4 * n * 2 / 125e6 && comp > 0 && comp < dense / 1.2,
	      "slow link: compress %d, dense %g s, compressed %g s", c, dense, comp);
	OK(gc_decide(t, "auto", n, 4, INFINITY, 0, &c, &dense, &comp));
	CHECK(c == 0 && comp > dense, "unlimited link: compress %d, dense %g s, compressed %g s", c, dense, comp);
	OK(gc_decide(t, "sparse-gather", n, 4, 125e6, 50e-6, &c, NULL, NULL));
	OK(gc_decide(none, "auto", n, 8, 1e6, 1e-3, &c, &dense, &comp));
	CHECK(c == 0 && dense == comp, "codec none: compress %d, dense %g s, compressed %g s", c, dense, comp);

	FAILS(gc_decide(t, NULL, n, 4, 1e9, 0, &c, NULL, NULL), GC_ERR_INVALID, "null strategy");
	FAILS(gc_decide(t, "auto", n, 4, 1e9, 0, NULL, NULL, NULL), GC_ERR_INVALID, "null compress");
	FAILS(gc_decide(t, "ring", n, 4, 1e9, 0, &c, NULL, NULL), GC_ERR_INVALID, "unknown strategy");
	FAILS(gc_decide(t, "shared-index", n, 4, 1e9, 0, &c, NULL, NULL), GC_ERR_INVALID, "randomk");
	FAILS(gc_decide(none, "sra", n, 4, 1e9, 0, &c, NULL, NULL), GC_ERR_INVALID, "none");
	FAILS(gc_decide(t, "auto", 0, 4, 1e9, 0, &c, NULL, NULL), GC_ERR_INVALID, "n = 0");
	FAILS(gc_decide(t, "auto", SIZE_MAX, 4, 1e9, 0, &c, NULL, NULL), GC_ERR_INVALID, "elements");
	FAILS(gc_decide(t, "auto", n, 0, 1e9, 0, &c, NULL, NULL), GC_ERR_INVALID, "world = 0");
	FAILS(gc_decide(t, "auto", n, 5000, 1e9, 0, &c, NULL, NULL), GC_ERR_INVALID, "world = 5000");
	FAILS(gc_decide(t, "auto", n, 4, 0, 0, &c, NULL, NULL), GC_ERR_INVALID, "bandwidth");
	FAILS(gc_decide(t, "auto", n, 4, NAN, 0, &c, NULL, NULL), GC_ERR_INVALID, "bandwidth");
	FAILS(gc_decide(t, "auto", n, 4, 1e9, -1e-6, &c, NULL, NULL), GC_ERR_INVALID, "latency");
	FAILS(gc_decide(t, "auto", n, 4, 1e9, NAN, &c, NULL, NULL), GC_ERR_INVALID, "latency");
	OK(gc_compressor_destroy(t));
	FAILS(gc_decide(t, "auto", n, 4, 1e9, 0, &c, NULL, NULL), GC_ERR_HANDLE, "not a live");
	OK(gc_compressor_destroy(none));
}

/* Threads: each compresses its own buckets on a shared handle and on its
 * own, checks the payloads against a single-threaded reference, and checks
 * that its last error is its own while the others fail too. */
enum { THREADS = 8, ITERS = 100, TN = 2000 };
/* libgradcomp.so has every device call of ABI 1.2: each checks its
 * arguments, then says GC_ERR_NOCUDA, naming the library to load. */
static void test_device_stubs(void) {
	gc_compressor h = create("int8");
	const gc_devptr p = 0x7f0000000000u; /* never dereferenced */
	size_t written = 1;
	char name[256];
	int major, minor;
	uint64_t mem;
	CHECK(gc_features() == 0, "gc_features() = %#x in libgradcomp.so, want 0", gc_features());
	FAILS(gc_device_info(0, name, sizeof name, &major, &minor, &mem), GC_ERR_NOCUDA, "libgradcomp_cuda.so");
	FAILS(gc_device_info(0, name, sizeof name, NULL, &minor, &mem), GC_ERR_INVALID, "null major");
	FAILS(gc_compress_device(h, 0, 0, 0, p, 1000, p, 4096, 0, &written), GC_ERR_NOCUDA, "libgradcomp_cuda.so");
	CHECK(written == 0, "written = %zu after a failed gc_compress_device", written);
	FAILS(gc_compress_device(h, 0, 0, 0, 0, 1000, p, 4096, 0, &written), GC_ERR_INVALID, "null grad");
	FAILS(gc_compress_device(h, 0, 0, 0, p, 1000, p, 100, 0, &written), GC_ERR_SIZE, "gc_max_encoded_len");
	FAILS(gc_compress_device(h, 0, 0, 0, p, 1000, p, 4096, 0, NULL), GC_ERR_INVALID, "null written");
	FAILS(gc_compress_device(0, 0, 0, 0, p, 1000, p, 4096, 0, &written), GC_ERR_HANDLE, "not a live compressor");
	FAILS(gc_decompress_device(h, p, 1100, p, 1000, 0), GC_ERR_NOCUDA, "libgradcomp_cuda.so");
	FAILS(gc_decompress_add_device(h, 0, 1100, p, 1000, 0), GC_ERR_INVALID, "null payload");
	FAILS(gc_decompress_slots_device(h, p, 1102, 4, p, 1000, 0, 0), GC_ERR_INVALID, "multiple of 4");
	FAILS(gc_decompress_slots_device(h, p, 1104, 4, p, 1000, 2, 0), GC_ERR_INVALID, "add = 2");
	FAILS(gc_decompress_slots_device(h, p, 1104, 4, p, 1000, 1, 0), GC_ERR_NOCUDA, "libgradcomp_cuda.so");
	OK(gc_compressor_destroy(h));
}

static gc_compressor shared;
static pthread_barrier_t start; /* so that the threads run at once */
static uint8_t ref[THREADS][5][4096];
static size_t reflen[THREADS][5];

static void *worker(void *arg) {
	int id = (int)(intptr_t)arg;
	float g[TN], d[TN];
	uint8_t p[4096];
	char want[64];
	gc_compressor own = create("int8");
	int c = -1;
	pthread_barrier_wait(&start);
	CHECK(gc_decide(shared, "allgather", 1 << 16, 4, 1e9, 1e-5, &c, NULL, NULL) == GC_OK && (c == 0 || c == 1),
	      "thread %d: gc_decide: %s", id, gc_last_error());
	for (int it = 0; it < ITERS; it++) {
		size_t w = 0;
		fill(g, TN, (uint64_t)(id * 1000 + it % 5));
		gc_status st = gc_compress(shared, (uint64_t)id, (uint64_t)(it % 5), 0, g, TN, p, sizeof p, &w);
		CHECK(st == GC_OK && w == reflen[id][it % 5] && memcmp(p, ref[id][it % 5], w) == 0,
		      "thread %d iter %d: shared-handle payload differs from the reference (%d)", id, it, st);
		CHECK(gc_decompress(shared, p, w, d, TN) == GC_OK, "thread %d: decompress: %s", id, gc_last_error());
		st = gc_compress(shared, 1000 + (uint64_t)id, (uint64_t)it, GC_FEEDBACK | GC_DEFER, g, TN, p, sizeof p, &w);
		CHECK(st == GC_OK, "thread %d: deferred: %s", id, gc_last_error());
		CHECK(gc_settle(shared, 1000 + (uint64_t)id, it % 2 ? GC_COMMIT : GC_RETAIN) == GC_OK, "thread %d: settle: %s",
		      id, gc_last_error());
		CHECK(gc_compress(own, 0, (uint64_t)it, GC_FEEDBACK, g, TN, p, sizeof p, &w) == GC_OK, "thread %d: own: %s", id,
		      gc_last_error());
		/* A failure of this thread's own, while the others fail with theirs. */
		snprintf(want, sizeof want, "bucket %d has no deferred", 5000 + id);
		gc_status bad = gc_settle(shared, 5000 + (uint64_t)id, GC_COMMIT);
		for (int k = 0; k < 20; k++) { /* successful calls, while the others fail */
			size_t m;
			gc_max_encoded_len(shared, TN, &m);
		}
		CHECK(bad == GC_ERR_STATE && strstr(gc_last_error(), want) != NULL,
		      "thread %d: last error \"%s\" is not this thread's (\"%s\")", id, gc_last_error(), want);
		gc_compressor tmp = create("sign");
		CHECK(gc_compressor_destroy(tmp) == GC_OK, "thread %d: destroy: %s", id, gc_last_error());
	}
	CHECK(gc_compressor_destroy(own) == GC_OK, "thread %d: destroy own: %s", id, gc_last_error());
	return NULL;
}

static void test_threads(void) {
	shared = create("topk:0.05:sampled");
	float g[TN];
	for (int id = 0; id < THREADS; id++) {
		for (int s = 0; s < 5; s++) {
			fill(g, TN, (uint64_t)(id * 1000 + s));
			OK(gc_compress(shared, (uint64_t)id, (uint64_t)s, 0, g, TN, ref[id][s], sizeof ref[id][s],
			               &reflen[id][s]));
		}
	}
	pthread_t th[THREADS];
	pthread_barrier_init(&start, NULL, THREADS);
	for (int i = 0; i < THREADS; i++) {
		CHECK(pthread_create(&th[i], NULL, worker, (void *)(intptr_t)i) == 0, "pthread_create %d", i);
	}
	for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
	pthread_barrier_destroy(&start);
	size_t l;
	OK(gc_state_size(shared, &l));
	CHECK(l == 9 + THREADS * (16 + 4 * TN) + 4, "shared state after the threads is %zu bytes", l);
	OK(gc_compressor_destroy(shared));
}

static long rss_kib(void) {
	FILE *f = fopen("/proc/self/statm", "r");
	long size = 0, resident = 0;
	if (f == NULL) return -1;
	if (fscanf(f, "%ld %ld", &size, &resident) != 2) resident = -1;
	fclose(f);
	return resident < 0 ? -1 : resident * (sysconf(_SC_PAGESIZE) / 1024);
}

/* 10,000 compress + decompress calls: RSS stays flat. It is read after a
 * warm-up (the Go heap and the runtime's threads reach their working size),
 * halfway and at the end; a leak of one payload per call (5 KiB) would add
 * 25 MiB per half. */
static void test_leak(void) {
	enum { N = 1 << 16, CALLS = 10000, WARMUP = 500 };
	const long bound_kib = 16 * 1024, half_bound_kib = 8 * 1024;
	float *g = malloc(4 * N), *d = malloc(4 * N);
	gc_compressor h = create("topk:0.01");
	size_t cap = 0, w = 0, live = 0;
	OK(gc_max_encoded_len(h, N, &cap));
	uint8_t *p = malloc(cap);
	fill(g, N, 3);
	memset(d, 0, 4 * N);
	long before = 0, mid = 0;
	int bad = 0;
	for (int i = 0; i < WARMUP + CALLS; i++) {
		if (i == WARMUP) before = rss_kib();
		if (i == WARMUP + CALLS / 2) mid = rss_kib();
		bad += gc_compress(h, (uint64_t)(i % 4), (uint64_t)i, GC_FEEDBACK, g, N, p, cap, &w) != GC_OK;
		bad += gc_decompress_add(h, p, w, d, N) != GC_OK;
	}
	long after = rss_kib();
	CHECK(bad == 0, "%d of %d calls failed (%s)", bad, 2 * CALLS, gc_last_error());
	CHECK(before > 0 && mid > 0 && after > 0, "cannot read /proc/self/statm");
	printf("leak check: %d compress + %d decompress_add calls (topk:0.01, n = %d, feedback on 4 buckets): "
	       "RSS %ld KiB before, %ld KiB halfway, %ld KiB after (%+ld KiB in all, bound %ld; %+ld KiB in the "
	       "second half, bound %ld)\n",
	       CALLS, CALLS, N, before, mid, after, after - before, bound_kib, after - mid, half_bound_kib);
	CHECK(after - before <= bound_kib, "RSS grew by %ld KiB over %d calls", after - before, CALLS);
	CHECK(after - mid <= half_bound_kib, "RSS grew by %ld KiB over the last %d calls", after - mid, CALLS / 2);
	OK(gc_live_handles(&live));
	CHECK(live == 1, "%zu live handles during the leak check, want 1", live);
	OK(gc_compressor_destroy(h));
	free(p);
	free(g);
	free(d);
}

int main(void) {
	size_t live = 1;
	OK(gc_live_handles(&live));
	CHECK(live == 0, "%zu live handles at start", live);
	test_version();
	test_roundtrip();
	test_deferred();
	test_state();
	test_bad_inputs();
	test_decide();
	test_device_stubs();
	test_threads();
	test_leak();
	OK(gc_live_handles(&live));
	CHECK(live == 0, "%zu handles still live at the end", live);
	printf("capi_test: %d checks, %d failed (libgradcomp %s, ABI %#x)\n", checks, failures, gc_version(),
	       gc_abi_version());
	return failures != 0;
}
