/*
 * capi_cuda_test.c — drives the device calls of gradcomp.h (ABI 1.2)
 * through libgradcomp_cuda.so, allocating device memory with the CUDA
 * driver API. Without a usable GPU it checks what it can (the library
 * loaded, the device calls refuse bad arguments and report
 * GC_ERR_NODEVICE, host calls work) and says the device tests were
 * SKIPPED, with the driver's reason. With a GPU: payloads byte-identical to
 * the host path's (gc_compress, the code of libgradcomp.so) for int8, int4,
 * sign and top-k, error feedback with every settle mode compared through
 * the saved states, decompress (single, add, slots) bit-identical to the
 * host's, a NaN leaving the residual untouched, host memory and lengths
 * past an allocation refused, a corrupt payload leaving dst untouched, and
 * four threads compressing at once. Exits 1 if any check failed.
 *
 * Built by `make capi` when build/libgradcomp_cuda.so exists:
 *   cc -std=c11 -Iplugin/include tests/capi/capi_cuda_test.c -Lbuild -lgradcomp_cuda -lcuda -pthread
 */
#define _POSIX_C_SOURCE 200809L
#include <cuda.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gradcomp.h"
#include "capi_check.h"

#define N 100003 /* elements: odd, so buckets and bytes end part-way */

static CUstream stream;

/* CU(call): a driver call that must succeed. */
#define CU(call)                                                                       \
	do {                                                                           \
		CUresult r_ = (call);                                                  \
		CHECK(r_ == CUDA_SUCCESS, "%s = %d", #call, (int)r_);                  \
		if (r_ != CUDA_SUCCESS) exit(1);                                       \
	} while (0)

static CUdeviceptr dalloc(size_t bytes) {
	CUdeviceptr p;
	CU(cuMemAlloc(&p, bytes));
	return p;
}

static void upload(CUdeviceptr dst, const void *src, size_t bytes) { CU(cuMemcpyHtoD(dst, src, bytes)); }

static void download(void *dst, CUdeviceptr src, size_t bytes) {
	CU(cuStreamSynchronize(stream));
	CU(cuMemcpyDtoH(dst, src, bytes));
}

static gc_compressor create(const char *spec) {
	gc_compressor h = 0;
	OK(gc_compressor_create(spec, 1, &h));
	return h;
}

/* state returns h's error-feedback state (malloc'd) and its length. */
static uint8_t *state(gc_compressor h, size_t *len) {
	size_t n = 0, w = 0;
	OK(gc_state_size(h, &n));
	uint8_t *s = malloc(n);
	OK(gc_state_save(h, s, n, &w));
	*len = w;
	return s;
}

/* same_state checks that two handles hold the same error-feedback memory. */
static void same_state(gc_compressor a, gc_compressor b, const char *when) {
	size_t la, lb;
	uint8_t *sa = state(a, &la), *sb = state(b, &lb);
	CHECK(la == lb && memcmp(sa, sb, la) == 0, "%s: device state (%zu bytes) differs from the host's (%zu)", when, lb, la);
	free(sa);
	free(sb);
}

/* Without a device: arguments are checked, the driver's refusal reported. */
static void test_no_device(const char *why) {
	gc_compressor h = create("int8");
	const gc_devptr p = 0x7f0000000000u;
	size_t w = 1;
	FAILS(gc_compress_device(h, 0, 0, 0, p, 1000, p, 4096, 0, &w), GC_ERR_NODEVICE, "no CUDA device");
	FAILS(gc_decompress_device(h, p, 1100, p, 1000, 0), GC_ERR_NODEVICE, "no CUDA device");
	FAILS(gc_compress_device(h, 0, 0, 0, 0, 1000, p, 4096, 0, &w), GC_ERR_INVALID, "null grad");
	FAILS(gc_decompress_slots_device(h, p, 1102, 2, p, 1000, 0, 0), GC_ERR_INVALID, "multiple of 4");
	/* The host calls of the same library work. */
	float g[64];
	uint8_t buf[512];
	fill(g, 64, 1);
	OK(gc_compress(h, 0, 0, GC_FEEDBACK, g, 64, buf, sizeof buf, &w));
	OK(gc_decompress(h, buf, w, g, 64));
	OK(gc_compressor_destroy(h));
	printf("capi_cuda_test: device tests SKIPPED: %s\n", why);
}

/* Device payloads equal the host's, with error feedback through every
 * settle mode; decoding equals the host's. */
static void test_matches_host(const char *spec) {
	gc_compressor host = create(spec), dev = create(spec);
	size_t need = 0, wh = 0, wd = 0;
	OK(gc_max_encoded_len(host, N, &need));
	float *g = malloc(N * sizeof *g), *out = malloc(N * sizeof *out), *want = malloc(N * sizeof *want);
	uint8_t *hp = malloc(need), *dp = malloc(need);
	CUdeviceptr dg = dalloc(N * sizeof *g), dd = dalloc(need), dout = dalloc(N * sizeof *g);
	/* -1: feedback, committed at once; modes: deferred then settled; -2: no feedback. */
	const int modes[] = {-1, GC_COMMIT, GC_RETAIN, GC_DISCARD, -1, -2};
	for (int step = 0; step < 6; step++) {
		fill(g, N, 100 + step);
		upload(dg, g, N * sizeof *g);
		uint32_t flags = modes[step] == -2 ? 0 : modes[step] == -1 ? GC_FEEDBACK : GC_FEEDBACK | GC_DEFER;
		OK(gc_compress(host, 3, step, flags, g, N, hp, need, &wh));
		OK(gc_compress_device(dev, 3, step, flags, dg, N, dd, need, (gc_stream)stream, &wd));
		download(dp, dd, wd);
		CHECK(wh == wd && memcmp(hp, dp, wh) == 0, "%s step %d: device payload (%zu bytes) differs from the host's (%zu)",
		      spec, step, wd, wh);
		if (modes[step] >= 0) {
			OK(gc_settle(host, 3, (gc_settle_mode)modes[step]));
			OK(gc_settle(dev, 3, (gc_settle_mode)modes[step]));
		}
		char when[64];
		snprintf(when, sizeof when, "%s step %d", spec, step);
		same_state(host, dev, when);
	}
	/* hp/dd hold the last payload: decompress, then decompress_add. */
	fill(want, N, 7);
	memcpy(out, want, N * sizeof *out);
	OK(gc_decompress_add(host, hp, wh, want, N));
	upload(dout, out, N * sizeof *out);
	OK(gc_decompress_add_device(dev, dd, wd, dout, N, (gc_stream)stream));
	download(out, dout, N * sizeof *out);
	CHECK(memcmp(out, want, N * sizeof *out) == 0, "%s: gc_decompress_add_device differs from gc_decompress_add", spec);
	OK(gc_decompress(host, hp, wh, want, N));
	OK(gc_decompress_device(dev, dd, wd, dout, N, (gc_stream)stream));
	download(out, dout, N * sizeof *out);
	CHECK(memcmp(out, want, N * sizeof *out) == 0, "%s: gc_decompress_device differs from gc_decompress", spec);
	/* Four padded slots, summed. */
	size_t slot = (need + 100) & ~(size_t)3;
	CUdeviceptr slots = dalloc(4 * slot);
	uint8_t *pad = calloc(1, slot);
	for (int i = 0; i < 4; i++) {
		fill(g, N, 200 + i);
		OK(gc_compress(host, 9, 1, 0, g, N, pad, slot, &wh));
		upload(slots + i * slot, pad, slot);
		OK(i == 0 ? gc_decompress(host, pad, wh, want, N) : gc_decompress_add(host, pad, wh, want, N));
	}
	OK(gc_decompress_slots_device(dev, slots, slot, 4, dout, N, 0, (gc_stream)stream));
	download(out, dout, N * sizeof *out);
	CHECK(memcmp(out, want, N * sizeof *out) == 0, "%s: gc_decompress_slots_device differs from the host's sum", spec);
	CU(cuMemFree(slots));
	CU(cuMemFree(dg));
	CU(cuMemFree(dd));
	CU(cuMemFree(dout));
	free(pad);
	free(g);
	free(out);
	free(want);
	free(hp);
	free(dp);
	OK(gc_compressor_destroy(host));
	OK(gc_compressor_destroy(dev));
}

static void test_bad_inputs(void) {
	gc_compressor h = create("int8");
	size_t need = 0, w = 0, l0, l1;
	OK(gc_max_encoded_len(h, N, &need));
	float *g = malloc(N * sizeof *g), *before = malloc(N * sizeof *g), *after = malloc(N * sizeof *g);
	CUdeviceptr dg = dalloc(N * sizeof *g), dd = dalloc(need), dout = dalloc(N * sizeof *g);
	fill(g, N, 1);
	upload(dg, g, N * sizeof *g);
	OK(gc_compress_device(h, 1, 0, GC_FEEDBACK, dg, N, dd, need, (gc_stream)stream, &w));
	uint8_t *s0 = state(h, &l0);
	g[4242] = NAN;
	upload(dg, g, N * sizeof *g);
	FAILS(gc_compress_device(h, 1, 1, GC_FEEDBACK | GC_DEFER, dg, N, dd, need, (gc_stream)stream, &w), GC_ERR_NONFINITE,
	      "index 4242");
	CHECK(w == 0, "written = %zu after a NaN", w);
	uint8_t *s1 = state(h, &l1);
	CHECK(l0 == l1 && memcmp(s0, s1, l0) == 0, "a NaN changed the device residual");
	FAILS(gc_settle(h, 1, GC_COMMIT), GC_ERR_STATE, "no deferred compress");
	FAILS(gc_compress(h, 1, 2, GC_FEEDBACK, g, N, s0, l0, &w), GC_ERR_STATE, "device memory");
	FAILS(gc_compress_device(h, 2, 0, 0, (gc_devptr)g, N, dd, need, (gc_stream)stream, &w), GC_ERR_INVALID,
	      "not CUDA device memory");
	FAILS(gc_compress_device(h, 2, 0, 0, dg, N + 1, dd, need + 8, (gc_stream)stream, &w), GC_ERR_SIZE,
	      "past the end of its allocation");
	FAILS(gc_compress_device(h, 2, 0, 0, dg + 2, 10, dd, need, (gc_stream)stream, &w), GC_ERR_INVALID, "aligned");
	FAILS(gc_compress_device(h, 1, 2, GC_FEEDBACK, dg, N - 4, dd, need, (gc_stream)stream, &w), GC_ERR_SIZE,
	      "gradient length for bucket 1");
	/* A corrupt payload leaves dst as it was. */
	fill(g, N, 2);
	upload(dg, g, N * sizeof *g);
	OK(gc_compress_device(h, 5, 0, 0, dg, N, dd, need, (gc_stream)stream, &w));
	uint8_t bad = 0xA5;
	upload(dd + 1000, &bad, 1);
	fill(before, N, 3);
	upload(dout, before, N * sizeof *g);
	FAILS(gc_decompress_add_device(h, dd, w, dout, N, (gc_stream)stream), GC_ERR_CORRUPT, "checksum");
	FAILS(gc_decompress_add_device(h, dd, w - 4, dout, N, (gc_stream)stream), GC_ERR_CORRUPT, "gc_payload_len");
	download(after, dout, N * sizeof *g);
	CHECK(memcmp(before, after, N * sizeof *g) == 0, "a refused decompress wrote dst");
	CU(cuMemFree(dg));
	CU(cuMemFree(dd));
	CU(cuMemFree(dout));
	free(s0);
	free(s1);
	free(g);
	free(before);
	free(after);
	OK(gc_compressor_destroy(h));
}

/* Four threads compress their own buckets at once through one handle. */
#define THREADS 4
static gc_compressor shared;
static CUdeviceptr tgrad[THREADS], tdst[THREADS];
static size_t tneed, twritten[THREADS];
static CUcontext primary;

static void *worker(void *arg) {
	int i = (int)(intptr_t)arg;
	cuCtxSetCurrent(primary);
	for (int step = 0; step < 5; step++) {
		OK(gc_compress_device(shared, (uint64_t)i, (uint64_t)step, GC_FEEDBACK, tgrad[i], N, tdst[i], tneed, 0,
		                      &twritten[i]));
	}
	return NULL;
}

static void test_threads(void) {
	shared = create("topk:0.01");
	gc_compressor host = create("topk:0.01");
	OK(gc_max_encoded_len(shared, N, &tneed));
	float *g = malloc(N * sizeof *g);
	uint8_t *hp = malloc(tneed), *dp = malloc(tneed);
	for (int i = 0; i < THREADS; i++) {
		tgrad[i] = dalloc(N * sizeof *g);
		tdst[i] = dalloc(tneed);
		fill(g, N, 300 + i);
		upload(tgrad[i], g, N * sizeof *g);
	}
	pthread_t t[THREADS];
	for (int i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, worker, (void *)(intptr_t)i);
	for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
	for (int i = 0; i < THREADS; i++) {
		size_t w = 0;
		fill(g, N, 300 + i);
		for (int step = 0; step < 5; step++) OK(gc_compress(host, (uint64_t)i, (uint64_t)step, GC_FEEDBACK, g, N, hp, tneed, &w));
		download(dp, tdst[i], tneed);
		CHECK(w == twritten[i] && memcmp(hp, dp, w) == 0, "thread %d: last device payload differs from the host's", i);
		CU(cuMemFree(tgrad[i]));
		CU(cuMemFree(tdst[i]));
	}
	same_state(host, shared, "after the threads");
	free(g);
	free(hp);
	free(dp);
	OK(gc_compressor_destroy(shared));
	OK(gc_compressor_destroy(host));
}

int main(void) {
	CHECK(gc_abi_version() == GRADCOMP_ABI_VERSION, "ABI %#x, header %#x", gc_abi_version(), GRADCOMP_ABI_VERSION);
	CHECK(gc_features() & GC_FEATURE_CUDA, "gc_features() = %#x: GC_FEATURE_CUDA missing", gc_features());
	char name[256];
	int major = 0, minor = 0;
	uint64_t mem = 0;
	FAILS(gc_device_info(-1, name, sizeof name, &major, &minor, &mem), GC_ERR_INVALID, "ordinals start at 0");
	FAILS(gc_device_info(0, name, sizeof name, &major, NULL, &mem), GC_ERR_INVALID, "null minor");
	gc_status st = gc_device_info(0, name, sizeof name, &major, &minor, &mem);
	CHECK(st == GC_OK || st == GC_ERR_NODEVICE, "gc_device_info(0) = %d (%s): want GC_OK or GC_ERR_NODEVICE (GC_ERR_NOCUDA: this is not the CUDA library)",
	      st, gc_last_error());
	if (st != GC_OK) {
		char why[1024];
		snprintf(why, sizeof why, "%s", gc_last_error());
		test_no_device(why);
	} else {
		printf("capi_cuda_test: device 0: %s, compute capability %d.%d, %.1f GiB\n", name, major, minor,
		       mem / 1073741824.0);
		FAILS(gc_device_info(0, name, 2, &major, &minor, &mem), GC_ERR_SIZE, "needs");
		CUdevice d;
		CU(cuInit(0));
		CU(cuDeviceGet(&d, 0));
		CU(cuDevicePrimaryCtxRetain(&primary, d));
		CU(cuCtxSetCurrent(primary));
		CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
		const char *specs[] = {"int8", "int4", "sign", "topk:0.01", "topk:0.01:sampled", "int2:bucket=100"};
		for (size_t i = 0; i < sizeof specs / sizeof *specs; i++) test_matches_host(specs[i]);
		test_bad_inputs();
		test_threads();
		CU(cuStreamDestroy(stream));
	}
	size_t live = 1;
	OK(gc_live_handles(&live));
	CHECK(live == 0, "%zu handles still live at the end", live);
	printf("capi_cuda_test: %d checks, %d failed (libgradcomp_cuda %s, ABI %#x)\n", checks, failures, gc_version(),
	       gc_abi_version());
	return failures != 0;
}
