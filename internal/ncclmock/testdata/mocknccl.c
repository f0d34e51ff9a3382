/*
 * MOCK libnccl.so.2 — A TEST FIXTURE OF package nccl, NEVER SHIPPED OR INSTALLED.
 *
 * The tests compile this file into a temporary libnccl.so.2 so that the
 * binding's real dlopen / dlsym / call paths run on machines without a GPU.
 * It implements NCCL's C ABI (nccl.h 2.x types: int enums, pointer handles,
 * a 128-byte ncclUniqueId passed by value) on HOST memory: a "device pointer"
 * is a host address, streams are ignored, and every operation completes
 * before it returns. Ranks are threads of one process that share a unique id.
 * It is NOT a model of NCCL's performance, algorithms or sum order (the mock
 * adds in rank order), and it checks things real NCCL does not (matched calls
 * that disagree are an ncclInvalidUsage here, a hang or garbage in NCCL).
 *
 * The bytes of a unique id select a behaviour for its whole world:
 *   "mock:ok:…"     (what ncclGetUniqueId returns) everything works;
 *   "mock:hang:…"   collectives and send/recv block until the communicator is
 *                   aborted, then return ncclSystemError;
 *   "mock:stuck:…"  the same, but they return only 500 ms after the abort
 *                   (a call that outlives the abort grace);
 *   "mock:async:…"  operations succeed, then ncclCommGetAsyncError reports
 *                   ncclRemoteError;
 *   "mock:fail:…"   operations return ncclInvalidUsage with a last error.
 * ncclCommSplit makes each new communicator a world of its own, of the
 * parent's mode (see ncclCommSplit below).
 * Build with -DMOCK_NO_SEND to leave out ncclSend (a library that lacks a
 * function the binding needs), with -DMOCK_NO_SPLIT to leave out
 * ncclCommSplit (as NCCL before 2.18), and with -DMOCK_VERSION=<code> to
 * make ncclGetVersion report another version (30000: an NCCL 3.0.0).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef enum { ncclSuccess = 0, ncclUnhandledCudaError = 1, ncclSystemError = 2, ncclInternalError = 3,
	       ncclInvalidArgument = 4, ncclInvalidUsage = 5, ncclRemoteError = 6, ncclInProgress = 7 } ncclResult_t;
typedef enum { ncclInt8 = 0, ncclUint8 = 1, ncclInt32 = 2, ncclUint32 = 3, ncclInt64 = 4, ncclUint64 = 5,
	       ncclFloat16 = 6, ncclFloat32 = 7, ncclFloat64 = 8, ncclBfloat16 = 9 } ncclDataType_t;
typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 } ncclRedOp_t;
typedef struct { char internal[128]; } ncclUniqueId;
typedef struct mock_comm* ncclComm_t;
typedef void* cudaStream_t;

enum mode { MODE_OK, MODE_HANG, MODE_STUCK, MODE_ASYNC, MODE_FAIL };
enum kind { K_ALLREDUCE = 1, K_ALLGATHER, K_REDUCESCATTER, K_BROADCAST, K_SPLIT };
static const char* kind_names[] = {"", "AllReduce", "AllGather", "ReduceScatter", "Broadcast", "CommSplit"};

#define NCCL_SPLIT_NOCOLOR -1

#define MAXRANKS 64

struct slot { int kind; const void* send; void* recv; size_t count; int dtype; int op; int root; };

struct world {
	ncclUniqueId id;
	enum mode mode;
	int nranks, joined, broken;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	unsigned long bgen; /* barrier generation */
	int bcount;
	struct slot slots[MAXRANKS];
	/* point-to-point mailbox: one pending send per (from, to) pair */
	struct { const void* buf; size_t bytes; int full; } box[MAXRANKS][MAXRANKS];
	/* ncclCommSplit: each rank's color and key, and the new world each
	 * group's first rank made, at that rank's index */
	struct { int color, key; } split[MAXRANKS];
	struct world* split_world[MAXRANKS];
	struct world* next;
};

struct mock_comm {
	struct world* w;
	int rank, aborted, async;
	char last[256];
};

static pthread_mutex_t worlds_mu = PTHREAD_MUTEX_INITIALIZER;
static struct world* worlds;
static unsigned long id_counter;

/* Group state is per thread, as in NCCL: between ncclGroupStart and
 * ncclGroupEnd, operations are queued on the calling thread and run at
 * ncclGroupEnd (each communicator's collectives in order on a thread of
 * their own, so one thread can drive several ranks; sends and receives on
 * the calling thread). */
struct p2p { int send; struct mock_comm* c; void* buf; size_t bytes; int peer; };
struct queued { int coll; struct mock_comm* c; struct slot s; struct p2p p; };
static __thread int group_depth;
static __thread struct queued* group_ops;
static __thread int group_n, group_cap;
static __thread char thread_last[256];

static size_t dtype_size(int t) {
	switch (t) {
	case ncclInt8: case ncclUint8: return 1;
	case ncclFloat16: case ncclBfloat16: return 2;
	case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
	case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
	}
	return 0;
}

/* fail records a last-error message (per communicator, and per thread) and returns r. */
static ncclResult_t fail(struct mock_comm* c, ncclResult_t r, const char* fmt, ...) {
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(thread_last, sizeof thread_last, fmt, ap);
	va_end(ap);
	if (c != NULL) memcpy(c->last, thread_last, sizeof c->last);
	return r;
}

/* ---- version, ids, errors ---- */

#ifndef MOCK_VERSION
#define MOCK_VERSION 21903 /* 2.19.3 */
#endif

ncclResult_t ncclGetVersion(int* version) {
	if (version == NULL) return ncclInvalidArgument;
	*version = MOCK_VERSION;
	return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
	if (id == NULL) return ncclInvalidArgument;
	pthread_mutex_lock(&worlds_mu);
	unsigned long n = ++id_counter;
	pthread_mutex_unlock(&worlds_mu);
	memset(id, 0, sizeof *id);
	snprintf(id->internal, sizeof id->internal, "mock:ok:%d:%lu", (int)getpid(), n);
	return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t r) {
	switch (r) {
	case ncclSuccess: return "no error";
	case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
	case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
	case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
	case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
	case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
	case ncclRemoteError: return "remote process exited or there was a network error";
	case ncclInProgress: return "NCCL operation in progress";
	default: return "unknown result code";
	}
}

const char* ncclGetLastError(ncclComm_t comm) { return comm != NULL ? comm->last : thread_last; }

/* ---- communicators ---- */

static enum mode mode_of(const ncclUniqueId* id) {
	if (strncmp(id->internal, "mock:hang:", 10) == 0) return MODE_HANG;
	if (strncmp(id->internal, "mock:stuck:", 11) == 0) return MODE_STUCK;
	if (strncmp(id->internal, "mock:async:", 11) == 0) return MODE_ASYNC;
	if (strncmp(id->internal, "mock:fail:", 10) == 0) return MODE_FAIL;
	return MODE_OK;
}

ncclResult_t ncclCommInitRank(ncclComm_t* newcomm, int nranks, ncclUniqueId id, int rank) {
	if (newcomm == NULL || nranks < 1 || nranks > MAXRANKS || rank < 0 || rank >= nranks)
		return fail(NULL, ncclInvalidArgument, "mock: ncclCommInitRank: bad nranks %d or rank %d", nranks, rank);
	pthread_mutex_lock(&worlds_mu);
	struct world* w = worlds;
	while (w != NULL && memcmp(&w->id, &id, sizeof id) != 0) w = w->next;
	if (w == NULL) {
		w = calloc(1, sizeof *w);
		w->id = id;
		w->mode = mode_of(&id);
		w->nranks = nranks;
		pthread_mutex_init(&w->mu, NULL);
		pthread_cond_init(&w->cv, NULL);
		w->next = worlds;
		worlds = w;
	}
	pthread_mutex_unlock(&worlds_mu);

	struct mock_comm* c = calloc(1, sizeof *c);
	c->w = w;
	c->rank = rank;
	/* Like NCCL, hand out the handle before waiting for the other ranks, so
	 * that another thread can abort a blocked init. */
	__atomic_store_n(newcomm, c, __ATOMIC_RELEASE);

	pthread_mutex_lock(&w->mu);
	if (w->nranks != nranks) {
		pthread_mutex_unlock(&w->mu);
		return fail(c, ncclInvalidArgument, "mock: ncclCommInitRank: nranks %d differs from the first rank's %d",
			    nranks, w->nranks);
	}
	w->joined++;
	pthread_cond_broadcast(&w->cv);
	while (w->joined < w->nranks && !c->aborted && !w->broken) pthread_cond_wait(&w->cv, &w->mu);
	int aborted = c->aborted || w->broken, missing = w->nranks - w->joined;
	pthread_mutex_unlock(&w->mu);
	if (aborted)
		return fail(c, ncclSystemError, "mock: ncclCommInitRank: aborted while waiting for %d of %d ranks", missing, nranks);
	return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t c) {
	if (c == NULL) return ncclInvalidArgument;
	struct world* w = c->w;
	pthread_mutex_lock(&w->mu);
	c->aborted = 1;
	w->broken = 1; /* the peers see a remote error, as NCCL's would */
	pthread_cond_broadcast(&w->cv);
	pthread_mutex_unlock(&w->mu);
	/* The mock never frees a communicator: a blocked call may still hold it. */
	return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t c) {
	if (c == NULL) return ncclInvalidArgument;
	return ncclSuccess; /* see ncclCommAbort */
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t* r) {
	if (c == NULL || r == NULL) return ncclInvalidArgument;
	*r = __atomic_load_n(&c->async, __ATOMIC_ACQUIRE);
	return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t c, int* count) {
	if (c == NULL || count == NULL) return ncclInvalidArgument;
	*count = c->w->nranks;
	return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t c, int* rank) {
	if (c == NULL || rank == NULL) return ncclInvalidArgument;
	*rank = c->rank;
	return ncclSuccess;
}

/* ---- behaviour modes ---- */

/* hold blocks a hang/stuck world's call until the communicator is aborted. */
static ncclResult_t hold(struct mock_comm* c) {
	struct world* w = c->w;
	pthread_mutex_lock(&w->mu);
	while (!c->aborted) pthread_cond_wait(&w->cv, &w->mu);
	pthread_mutex_unlock(&w->mu);
	if (w->mode == MODE_STUCK) usleep(500 * 1000);
	return fail(c, ncclSystemError, "mock: the call was held until the communicator was aborted");
}

/* enter applies the world's mode to one operation: ncclSuccess to go on. */
static ncclResult_t enter(struct mock_comm* c, const char* fn) {
	if (c == NULL) return fail(NULL, ncclInvalidArgument, "mock: %s: NULL communicator", fn);
	if (c->aborted) return fail(c, ncclInvalidUsage, "mock: %s: communicator was aborted", fn);
	switch (c->w->mode) {
	case MODE_HANG:
	case MODE_STUCK: return hold(c);
	case MODE_FAIL: return fail(c, ncclInvalidUsage, "mock: %s: told to fail by the unique id", fn);
	default: return ncclSuccess;
	}
}

static void leave(struct mock_comm* c) {
	if (c->w->mode == MODE_ASYNC) {
		snprintf(c->last, sizeof c->last, "mock: peer connection lost (told by the unique id)");
		__atomic_store_n(&c->async, ncclRemoteError, __ATOMIC_RELEASE);
	}
}

/* barrier waits for every rank of the world; non-zero when the world broke. */
static int barrier(struct mock_comm* c) {
	struct world* w = c->w;
	pthread_mutex_lock(&w->mu);
	unsigned long gen = w->bgen;
	if (++w->bcount == w->nranks) {
		w->bcount = 0;
		w->bgen++;
		pthread_cond_broadcast(&w->cv);
	} else {
		while (gen == w->bgen && !w->broken && !c->aborted) pthread_cond_wait(&w->cv, &w->mu);
	}
	int broken = gen == w->bgen;
	pthread_mutex_unlock(&w->mu);
	return broken;
}

/* ---- collectives ---- */

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

/* reduce writes dst[i] = op over r of srcs[r][off + i], i < n, in rank order. */
static int reduce(void* dst, const void* const* srcs, int nsrc, size_t off, size_t n, int dtype, int op) {
	switch (dtype) {
	case ncclInt8: REDUCE(int8_t); break;
	case ncclUint8: REDUCE(uint8_t); break;
	case ncclInt32: REDUCE(int32_t); break;
	case ncclUint32: REDUCE(uint32_t); break;
	case ncclInt64: REDUCE(int64_t); break;
	case ncclUint64: REDUCE(uint64_t); break;
	case ncclFloat32: REDUCE(float); break;
	case ncclFloat64: REDUCE(double); break;
	default: return -1; /* 16-bit floats: not in the mock */
	}
	return 0;
}

static void queue(struct queued q) {
	if (group_n == group_cap) {
		group_cap = group_cap ? 2 * group_cap : 8;
		group_ops = realloc(group_ops, group_cap * sizeof *group_ops);
	}
	group_ops[group_n++] = q;
}

static ncclResult_t run_collective(struct mock_comm* c, struct slot s);

static ncclResult_t collective(struct mock_comm* c, struct slot s) {
	if (group_depth > 0) {
		queue((struct queued){.coll = 1, .c = c, .s = s});
		return ncclSuccess;
	}
	return run_collective(c, s);
}

static ncclResult_t run_collective(struct mock_comm* c, struct slot s) {
	const char* fn = kind_names[s.kind];
	ncclResult_t r = enter(c, fn);
	if (r != ncclSuccess) return r;
	struct world* w = c->w;
	size_t es = dtype_size(s.dtype);
	if (es == 0) return fail(c, ncclInvalidArgument, "mock: %s: unknown data type %d", fn, s.dtype);
	w->slots[c->rank] = s;
	if (barrier(c)) return fail(c, ncclRemoteError, "mock: %s: a peer aborted", fn);
	for (int q = 0; q < w->nranks; q++) {
		struct slot* o = &w->slots[q];
		if (o->kind != s.kind || o->count != s.count || o->dtype != s.dtype || o->op != s.op || o->root != s.root) {
			barrier(c);
			return fail(c, ncclInvalidUsage, "mock: ranks disagree: rank 0 called %s(count %zu), rank %d called %s(count %zu)",
				    kind_names[w->slots[0].kind], w->slots[0].count, q, kind_names[o->kind], o->count);
		}
	}
	const void* srcs[MAXRANKS];
	for (int q = 0; q < w->nranks; q++) srcs[q] = w->slots[q].send;
	size_t n = s.count, bytes = n * es;
	void* tmp = NULL;
	int bad = 0;
	switch (s.kind) {
	case K_ALLREDUCE:
		tmp = malloc(bytes > 0 ? bytes : 1);
		bad = reduce(tmp, srcs, w->nranks, 0, n, s.dtype, s.op);
		break;
	case K_REDUCESCATTER:
		tmp = malloc(bytes > 0 ? bytes : 1);
		bad = reduce(tmp, srcs, w->nranks, (size_t)c->rank * n, n, s.dtype, s.op);
		break;
	case K_ALLGATHER:
		tmp = malloc(bytes * w->nranks + 1);
		for (int q = 0; q < w->nranks; q++) memcpy((char*)tmp + q * bytes, srcs[q], bytes);
		bytes *= w->nranks;
		break;
	case K_BROADCAST:
		tmp = malloc(bytes + 1);
		memcpy(tmp, srcs[s.root], bytes);
		break;
	}
	/* Nobody writes a recv buffer before every rank has read the sends. */
	int broken = barrier(c);
	if (!broken && !bad) memcpy(s.recv, tmp, bytes);
	free(tmp);
	if (broken) return fail(c, ncclRemoteError, "mock: %s: a peer aborted", fn);
	if (bad) return fail(c, ncclInvalidArgument, "mock: %s: data type %d is not supported by the mock", fn, s.dtype);
	leave(c);
	return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
			   cudaStream_t s) {
	(void)s;
	return collective(c, (struct slot){K_ALLREDUCE, send, recv, count, t, op, 0});
}

ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t t, ncclComm_t c, cudaStream_t s) {
	(void)s;
	return collective(c, (struct slot){K_ALLGATHER, send, recv, count, t, 0, 0});
}

ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
			       cudaStream_t s) {
	(void)s;
	return collective(c, (struct slot){K_REDUCESCATTER, send, recv, count, t, op, 0});
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t t, int root, ncclComm_t c,
			   cudaStream_t s) {
	(void)s;
	return collective(c, (struct slot){K_BROADCAST, send, recv, count, t, 0, root});
}

/* ---- point to point ---- */

/* post puts a send into the (from, to) mailbox, waiting until it is free. */
static ncclResult_t post(struct p2p* p) {
	struct world* w = p->c->w;
	pthread_mutex_lock(&w->mu);
	while (w->box[p->c->rank][p->peer].full && !w->broken) pthread_cond_wait(&w->cv, &w->mu);
	w->box[p->c->rank][p->peer].buf = p->buf;
	w->box[p->c->rank][p->peer].bytes = p->bytes;
	w->box[p->c->rank][p->peer].full = 1;
	pthread_cond_broadcast(&w->cv);
	int broken = w->broken;
	pthread_mutex_unlock(&w->mu);
	return broken ? fail(p->c, ncclRemoteError, "mock: ncclSend: a peer aborted") : ncclSuccess;
}

/* take copies the (peer, me) mailbox into a receive and empties it. */
static ncclResult_t take(struct p2p* p) {
	struct world* w = p->c->w;
	pthread_mutex_lock(&w->mu);
	while (!w->box[p->peer][p->c->rank].full && !w->broken) pthread_cond_wait(&w->cv, &w->mu);
	ncclResult_t r = ncclSuccess;
	if (w->broken) {
		r = fail(p->c, ncclRemoteError, "mock: ncclRecv: a peer aborted");
	} else if (w->box[p->peer][p->c->rank].bytes != p->bytes) {
		r = fail(p->c, ncclInvalidUsage, "mock: ncclRecv: expected %zu bytes, the send has %zu", p->bytes,
			 w->box[p->peer][p->c->rank].bytes);
	} else {
		memcpy(p->buf, w->box[p->peer][p->c->rank].buf, p->bytes);
	}
	w->box[p->peer][p->c->rank].full = 0;
	pthread_cond_broadcast(&w->cv);
	pthread_mutex_unlock(&w->mu);
	return r;
}

/* drained waits until a posted send has been taken. */
static ncclResult_t drained(struct p2p* p) {
	struct world* w = p->c->w;
	pthread_mutex_lock(&w->mu);
	while (w->box[p->c->rank][p->peer].full && !w->broken) pthread_cond_wait(&w->cv, &w->mu);
	int broken = w->broken;
	pthread_mutex_unlock(&w->mu);
	return broken ? fail(p->c, ncclRemoteError, "mock: ncclSend: a peer aborted") : ncclSuccess;
}

static ncclResult_t run_p2p(struct p2p* ops, int n) {
	ncclResult_t r = ncclSuccess;
	for (int i = 0; i < n && r == ncclSuccess; i++)
		if (ops[i].send) r = post(&ops[i]);
	for (int i = 0; i < n && r == ncclSuccess; i++)
		if (!ops[i].send) r = take(&ops[i]);
	for (int i = 0; i < n && r == ncclSuccess; i++)
		if (ops[i].send) r = drained(&ops[i]);
	for (int i = 0; i < n && r == ncclSuccess; i++) leave(ops[i].c);
	return r;
}

static ncclResult_t p2p(int send, void* buf, size_t count, ncclDataType_t t, int peer, ncclComm_t c) {
	const char* fn = send ? "ncclSend" : "ncclRecv";
	ncclResult_t r = enter(c, fn);
	if (r != ncclSuccess) return r;
	if (dtype_size(t) == 0 || peer < 0 || peer >= c->w->nranks)
		return fail(c, ncclInvalidArgument, "mock: %s: bad data type %d or peer %d", fn, t, peer);
	struct p2p op = {send, c, buf, count * dtype_size(t), peer};
	if (group_depth == 0) return run_p2p(&op, 1);
	queue((struct queued){.coll = 0, .c = c, .p = op});
	return ncclSuccess;
}

#ifndef MOCK_NO_SEND
ncclResult_t ncclSend(const void* buf, size_t count, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t s) {
	(void)s;
	return p2p(1, (void*)buf, count, t, peer, c);
}
#endif

ncclResult_t ncclRecv(void* buf, size_t count, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t s) {
	(void)s;
	return p2p(0, buf, count, t, peer, c);
}

/* ---- split ---- */

/* split_before reports whether old rank q comes before old rank p in their
 * new communicator: by key, then by old rank. */
static int split_before(struct world* w, int q, int p) {
	return w->split[q].key < w->split[p].key || (w->split[q].key == w->split[p].key && q < p);
}

#ifndef MOCK_NO_SPLIT
/* ncclCommSplit is a collective of the parent's world: every rank posts its
 * color and key, then the ranks of one color form a new world, ordered by
 * key, then by their rank in the parent. The group's first rank makes the
 * world (of the parent's mode, every rank joined). As in NCCL, *newcomm is
 * NULL until the split is complete, and stays NULL for NCCL_SPLIT_NOCOLOR;
 * an abort of the parent ends a split that waits for its peers. config is
 * ignored (the binding passes NULL). */
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, void* config) {
	(void)config;
	if (newcomm == NULL) return fail(comm, ncclInvalidArgument, "mock: ncclCommSplit: NULL newcomm");
	*newcomm = NULL;
	ncclResult_t r = enter(comm, "ncclCommSplit");
	if (r != ncclSuccess) return r;
	if (color < NCCL_SPLIT_NOCOLOR) return fail(comm, ncclInvalidArgument, "mock: ncclCommSplit: color %d", color);
	struct world* w = comm->w;
	int me = comm->rank;
	w->slots[me] = (struct slot){.kind = K_SPLIT};
	w->split[me].color = color;
	w->split[me].key = key;
	if (barrier(comm)) return fail(comm, ncclRemoteError, "mock: ncclCommSplit: a peer aborted");
	for (int q = 0; q < w->nranks; q++) {
		if (w->slots[q].kind != K_SPLIT) {
			barrier(comm);
			return fail(comm, ncclInvalidUsage, "mock: ranks disagree: rank %d called CommSplit, rank %d called %s", me, q,
				    kind_names[w->slots[q].kind]);
		}
	}
	int n = 0, pos = 0, first = -1;
	if (color != NCCL_SPLIT_NOCOLOR) {
		for (int q = 0; q < w->nranks; q++) {
			if (w->split[q].color != color) continue;
			n++;
			if (q != me && split_before(w, q, me)) pos++;
			if (first < 0 || split_before(w, q, first)) first = q;
		}
	}
	if (first == me) {
		struct world* nw = calloc(1, sizeof *nw);
		pthread_mutex_lock(&worlds_mu);
		unsigned long k = ++id_counter;
		pthread_mutex_unlock(&worlds_mu);
		snprintf(nw->id.internal, sizeof nw->id.internal, "mock:split:%d:%lu", (int)getpid(), k);
		nw->mode = w->mode;
		nw->nranks = nw->joined = n;
		pthread_mutex_init(&nw->mu, NULL);
		pthread_cond_init(&nw->cv, NULL);
		w->split_world[me] = nw;
	}
	/* Nobody reads split_world before the group's first rank has written it. */
	if (barrier(comm)) return fail(comm, ncclRemoteError, "mock: ncclCommSplit: a peer aborted");
	leave(comm);
	if (color == NCCL_SPLIT_NOCOLOR) return ncclSuccess;
	struct mock_comm* c = calloc(1, sizeof *c);
	c->w = w->split_world[first];
	c->rank = pos;
	__atomic_store_n(newcomm, c, __ATOMIC_RELEASE);
	return ncclSuccess;
}
#endif

/* group_run runs one communicator's queued collectives, in order, on a thread. */
struct group_run {
	struct mock_comm* c;
	struct queued* ops;
	int n;
	ncclResult_t r;
	pthread_t thread;
};

static void* group_thread(void* arg) {
	struct group_run* g = arg;
	g->r = ncclSuccess;
	for (int i = 0; i < g->n && g->r == ncclSuccess; i++)
		if (g->ops[i].coll && g->ops[i].c == g->c) g->r = run_collective(g->c, g->ops[i].s);
	return NULL;
}

ncclResult_t ncclGroupStart(void) {
	group_depth++;
	return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
	if (group_depth == 0) return fail(NULL, ncclInvalidUsage, "mock: ncclGroupEnd without ncclGroupStart");
	if (--group_depth > 0) return ncclSuccess;
	int n = group_n;
	group_n = 0;
	struct group_run runs[MAXRANKS];
	int nruns = 0;
	struct p2p* ps = malloc((n + 1) * sizeof *ps);
	int np = 0;
	for (int i = 0; i < n; i++) {
		struct queued* q = &group_ops[i];
		if (!q->coll) {
			ps[np++] = q->p;
			continue;
		}
		int k = 0;
		while (k < nruns && runs[k].c != q->c) k++;
		if (k == nruns) {
			if (nruns == MAXRANKS) {
				free(ps);
				return fail(q->c, ncclInvalidUsage, "mock: ncclGroupEnd: more than %d communicators", MAXRANKS);
			}
			runs[nruns++] = (struct group_run){.c = q->c, .ops = group_ops, .n = n};
		}
	}
	for (int k = 0; k < nruns; k++) pthread_create(&runs[k].thread, NULL, group_thread, &runs[k]);
	ncclResult_t r = run_p2p(ps, np);
	for (int k = 0; k < nruns; k++) {
		pthread_join(runs[k].thread, NULL);
		if (r == ncclSuccess && runs[k].r != ncclSuccess) {
			r = runs[k].r;
			memcpy(thread_last, runs[k].c->last, sizeof thread_last);
		}
	}
	free(ps);
	return r;
}
