/*
 * transfer.c — how the MOCK libnccl.so.2 (a test fixture; see mocknccl.c)
 * moves data: collectives and sends/receives through the staging areas of
 * the world's shared memory, in chunks of at most MOCK_STAGE_BYTES, so
 * that buffers of any size cross between processes. Reductions add in
 * rank order, chunk by chunk: the result is exactly the rank-order one.
 */
#define _GNU_SOURCE
#include <string.h>

#include "mock.h"

size_t dtype_size(int t) {
	switch (t) {
	case ncclInt8: case ncclUint8: return 1;
	case ncclFloat16: case ncclBfloat16: return 2;
	case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
	case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
	}
	return 0;
}

/* reducible reports whether the mock can reduce t (16-bit floats: no). */
int reducible(int t) { return dtype_size(t) != 0 && t != ncclFloat16 && t != ncclBfloat16; }

ncclResult_t aborted_error(struct mock_comm* c, const char* fn) {
	if (__atomic_load_n(&c->aborted, __ATOMIC_ACQUIRE))
		return mock_fail(c, ncclSystemError, "mock: %s: rank %d: the communicator was aborted", fn, c->rank);
	return mock_fail(c, ncclRemoteError, "mock: %s: rank %d: a peer aborted", fn, c->rank);
}

#define REDUCE(T)                                                                                          \
	do {                                                                                               \
		T* d = (T*)dst;                                                                            \
		for (size_t i = 0; i < n; i++) {                                                           \
			T acc = ((const T*)srcs[0])[off + i];                                              \
			for (int r = 1; r < nsrc; r++) {                                                   \
				T x = ((const T*)srcs[r])[off + i];                                        \
				switch (op) {                                                              \
				case ncclSum: case ncclAvg: acc = acc + x; break;                          \
				case ncclProd: acc = acc * x; break;                                       \
				case ncclMax: acc = x > acc ? x : acc; break;                              \
				case ncclMin: acc = x < acc ? x : acc; break;                              \
				}                                                                          \
			}                                                                                  \
			if (op == ncclAvg) acc = acc / (T)nsrc;                                            \
			d[i] = acc;                                                                        \
		}                                                                                          \
	} while (0)

/* reduce writes dst[i] = op over r of srcs[r][off + i], i < n, in rank
 * order; dtype is reducible. */
static void reduce(void* dst, const void* const* srcs, int nsrc, size_t off, size_t n, int dtype, int op) {
	switch (dtype) {
	case ncclInt8: REDUCE(int8_t); break;
	case ncclUint8: REDUCE(uint8_t); break;
	case ncclInt32: REDUCE(int32_t); break;
	case ncclUint32: REDUCE(uint32_t); break;
	case ncclInt64: REDUCE(int64_t); break;
	case ncclUint64: REDUCE(uint64_t); break;
	case ncclFloat32: REDUCE(float); break;
	case ncclFloat64: REDUCE(double); break;
	}
}

/* agree checks that every rank posted the same call as rank 0. */
static ncclResult_t agree(struct mock_comm* c, struct world* w) {
	const struct slot* s0 = &w->slots[0];
	for (int q = 1; q < w->nranks; q++) {
		const struct slot* o = &w->slots[q];
		if (o->kind != s0->kind || o->count != s0->count || o->dtype != s0->dtype || o->op != s0->op || o->root != s0->root)
			return mock_fail(c, ncclInvalidUsage,
					 "mock: ranks disagree: rank 0 called %s(count %zu), rank %d called %s(count %zu)",
					 kind_names[s0->kind], s0->count, q, kind_names[o->kind], o->count);
	}
	return ncclSuccess;
}

/* stage_in copies this rank's part of chunk [off, off+len) of o into its
 * staging area. */
static void stage_in(struct world* w, int me, const struct op* o, size_t off, size_t len, size_t es) {
	char* stage = world_stage(w, me);
	const char* send = o->send;
	switch (o->kind) {
	case K_ALLREDUCE: case K_ALLGATHER: memcpy(stage, send + off * es, len * es); break;
	case K_BROADCAST:
		if (me == o->root) memcpy(stage, send + off * es, len * es);
		break;
	case K_REDUCESCATTER: /* every destination rank's piece of the chunk */
		for (int r = 0; r < w->nranks; r++) memcpy(stage + r * len * es, send + (r * o->count + off) * es, len * es);
		break;
	}
}

/* stage_out computes this rank's result for chunk [off, off+len) of o from
 * every rank's staging area. */
static void stage_out(struct world* w, int me, const struct op* o, size_t off, size_t len, size_t es) {
	const void* srcs[MAXRANKS];
	for (int q = 0; q < w->nranks; q++) srcs[q] = world_stage(w, q);
	char* recv = o->recv;
	switch (o->kind) {
	case K_ALLREDUCE: reduce(recv + off * es, srcs, w->nranks, 0, len, o->dtype, o->redop); break;
	case K_REDUCESCATTER: reduce(recv + off * es, srcs, w->nranks, me * len, len, o->dtype, o->redop); break;
	case K_ALLGATHER:
		for (int q = 0; q < w->nranks; q++) memcpy(recv + (q * o->count + off) * es, srcs[q], len * es);
		break;
	case K_BROADCAST: memcpy(recv + off * es, srcs[o->root], len * es); break;
	}
}

ncclResult_t run_collective(struct mock_comm* c, struct world* w, const struct op* o) {
	const char* fn = kind_names[o->kind];
	int me = c->rank;
	w->slots[me] = (struct slot){o->kind, o->count, o->dtype, o->redop, o->root};
	if (barrier(c, w)) return aborted_error(c, fn);
	ncclResult_t r = agree(c, w);
	if (r != ncclSuccess) {
		barrier(c, w); /* every rank saw the disagreement: nobody reads the slots after this */
		return r;
	}
	size_t es = dtype_size(o->dtype);
	size_t per = MOCK_STAGE_BYTES / es;
	if (o->kind == K_REDUCESCATTER) per /= w->nranks;
	/* Each chunk: stage in, barrier, compute from the stages, barrier (so
	 * nobody overwrites a stage that a peer still reads). An empty call
	 * still waits once, so that nobody posts its next slot too early. */
	if (o->count == 0 && barrier(c, w)) return aborted_error(c, fn);
	for (size_t off = 0; off < o->count; off += per) {
		size_t len = o->count - off < per ? o->count - off : per;
		stage_in(w, me, o, off, len, es);
		if (barrier(c, w)) return aborted_error(c, fn);
		stage_out(w, me, o, off, len, es);
		if (barrier(c, w)) return aborted_error(c, fn);
	}
	return ncclSuccess;
}

/* progress is how far one send or receive of a run_p2p batch has come. */
struct progress {
	size_t bytes, off;
	int started, done;
};

/* blocked reports whether op i waits for an earlier op of the batch with
 * the same direction and peer (NCCL matches those in order). */
static int blocked(const struct op* const* ops, const struct progress* p, int i) {
	for (int j = 0; j < i; j++)
		if (!p[j].done && ops[j]->kind == ops[i]->kind && ops[j]->root == ops[i]->root) return 1;
	return 0;
}

/* step moves op i of a batch on by at most one chunk (w locked): 1 when it
 * moved, 0 when it must wait, or -1 with *r set when it failed. */
static int step(struct mock_comm* c, struct world* w, const struct op* o, struct progress* p, ncclResult_t* r) {
	int me = c->rank, peer = o->root;
	size_t chunk = p2p_chunk(w->nranks);
	if (o->kind == K_SEND) {
		struct box* b = world_box(w, me, peer);
		if (b->full) return 0;
		if (b->rejected) {
			size_t want = b->rejected - 1;
			b->rejected = 0;
			*r = mock_fail(c, ncclInvalidUsage, "mock: ncclSend: rank %d: rank %d's ncclRecv expected %zu bytes, the send has %zu",
				       me, peer, want, p->bytes);
			return -1;
		}
		if (p->started && p->off == p->bytes) { /* the receiver took the last chunk */
			p->done = 1;
			return 1;
		}
		size_t len = p->bytes - p->off < chunk ? p->bytes - p->off : chunk;
		memcpy(world_p2p(w, me, peer), (const char*)o->send + p->off, len);
		*b = (struct box){.total = p->bytes, .len = len, .full = 1};
		p->off += len;
		p->started = 1;
		return 1;
	}
	struct box* b = world_box(w, peer, me);
	if (!b->full) return 0;
	if (b->total != p->bytes) {
		size_t total = b->total;
		*b = (struct box){.rejected = p->bytes + 1};
		*r = mock_fail(c, ncclInvalidUsage, "mock: ncclRecv: rank %d: expected %zu bytes, the send has %zu", me, p->bytes, total);
		return -1;
	}
	memcpy((char*)o->recv + p->off, world_p2p(w, peer, me), b->len);
	p->off += b->len;
	b->full = 0;
	p->done = p->off == p->bytes;
	return 1;
}

ncclResult_t run_p2p(struct mock_comm* c, struct world* w, const struct op* const* ops, int n) {
	struct progress p[n > 0 ? n : 1];
	for (int i = 0; i < n; i++) p[i] = (struct progress){.bytes = ops[i]->count * dtype_size(ops[i]->dtype)};
	ncclResult_t r = ncclSuccess;
	world_lock(w);
	for (int left = n; left > 0 && r == ncclSuccess;) {
		if (w->broken || __atomic_load_n(&c->aborted, __ATOMIC_ACQUIRE)) {
			world_unlock(w);
			return aborted_error(c, kind_names[ops[0]->kind]);
		}
		int moved = 0;
		for (int i = 0; i < n && r == ncclSuccess; i++) {
			if (p[i].done || blocked(ops, p, i)) continue;
			int s = step(c, w, ops[i], &p[i], &r);
			moved |= s > 0;
			left -= p[i].done;
		}
		if (moved || r != ncclSuccess)
			pthread_cond_broadcast(&w->cv);
		else if (left > 0)
			world_wait(w);
	}
	world_unlock(w);
	return r;
}
