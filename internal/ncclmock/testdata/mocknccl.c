/*
 * MOCK libnccl.so.2 — A TEST FIXTURE OF package nccl, NEVER SHIPPED OR INSTALLED.
 *
 * The tests compile this file, with world.c and transfer.c, into a
 * temporary libnccl.so.2 (`make mocknccl` builds build/mocknccl/libnccl.so.2
 * for the Python tests) so that the binding's real dlopen / dlsym / call
 * paths run on machines without a GPU. It implements NCCL's C ABI (nccl.h
 * 2.x types: int enums, pointer handles, a 128-byte ncclUniqueId passed by
 * value) on HOST memory: a "device pointer" is a host address. It is NOT a
 * model of NCCL's performance, algorithms or sum order (the mock adds in
 * rank order), and it checks things real NCCL does not (matched calls that
 * disagree are an ncclInvalidUsage here, a hang or garbage in NCCL).
 *
 * WORLDS. The ranks of a world are threads of one process or of several
 * processes (each loading the mock as its libnccl.so.2) that pass the same
 * unique id. A world lives in POSIX shared memory, "/gcmock-<FNV-1a 64 of
 * the 128-byte id, 16 hex digits>", created (O_CREAT|O_EXCL) by the first
 * rank to arrive, sized for its nranks: a header with a process-shared,
 * robust mutex and condition variable, a mailbox per (sender, receiver)
 * pair, and per rank MOCK_STAGE_BYTES (1 MiB) of staging for collectives
 * and as much again for sends. Each communicator maps the segment (threads
 * of one process map it once each). Data crosses through the staging
 * areas, in chunks of at most their size, so any buffer size works;
 * reductions add in rank order. ncclInitRank waits, as NCCL's bootstrap,
 * for every rank until this rank is aborted (a peer's abort or death does
 * not end the wait). A peer that dies, or aborts, inside a collective
 * leaves the others blocked until they are aborted (a rank that died
 * holding the lock breaks the world: its mutex is robust); ncclCommAbort,
 * from any thread or process, wakes them at once.
 * The segment's name is removed (shm_unlink) once every rank has joined,
 * or, for a world that never completed, when its last communicator is
 * destroyed or aborted; the memory goes with the last mapping. A segment
 * found under a world's name that is complete already, or whose joined
 * processes are all gone, is left over from a crashed run: it is unlinked
 * and made afresh. ncclCommSplit makes each new communicator a world of
 * its own in shared memory, of the parent's mode (see ncclCommSplit).
 *
 * MODES. The bytes of a unique id select a behaviour for its whole world:
 *   "mock:ok:…"        (what ncclGetUniqueId returns) everything works;
 *   "mock:hang:…"      collectives and send/recv block until the
 *                      communicator is aborted, then fail with ncclSystemError;
 *   "mock:stuck:…"     the same, but they return only 500 ms after the abort
 *                      (a call that outlives the abort grace);
 *   "mock:async:…"     operations succeed, then ncclCommGetAsyncError reports
 *                      ncclRemoteError;
 *   "mock:fail:…"      operations return ncclInvalidUsage with a last error;
 *   "mock:failinit=R:…" rank R's ncclCommInitRank fails with
 *                      ncclUnhandledCudaError and a last error; the other
 *                      ranks wait for it until they are aborted; otherwise
 *                      as "ok".
 *
 * STREAMS: THE DEVICE HOOKS. Without hooks streams are ignored and every
 * operation completes before its call returns. A fake GPU (a host program
 * that runs "device" work in stream order) sets them once, before any
 * communicator is made:
 *
 *   typedef int (*gcmock_current_device_fn)(void);
 *   typedef int (*gcmock_launch_fn)(void* stream, int device, void (*fn)(void*), void* arg,
 *                                   char* err, size_t errcap);
 *   void gcmock_set_device_hooks(gcmock_current_device_fn current_device, gcmock_launch_fn launch);
 *
 * With hooks: ncclCommInitRank takes the communicator's device from
 * current_device() on the calling thread (a result < 0 fails the init with
 * ncclUnhandledCudaError, "no current CUDA device on the calling thread");
 * a communicator made by ncclCommSplit is on its parent's device. Every
 * collective, send and receive (and at ncclGroupEnd, each communicator's
 * queued operations, as one unit on the stream of its first one) is
 * checked (arguments, an aborted communicator, "fail" mode: those fail the
 * call itself), then handed to launch(stream, device, fn, arg, err, errcap)
 * and the call returns ncclSuccess: the launcher must call fn(arg) exactly
 * once, later, in the stream's order, on a thread of its own. A nonzero
 * return refuses the work: the call fails with ncclInvalidUsage and a last
 * error that includes the launcher's message in err (NUL-terminated, at
 * most errcap bytes; e.g. "stream 0x… is not on device 1"). A failure
 * while fn runs (an abort, "hang" mode, ranks that disagree, a peer's
 * abort) becomes the communicator's asynchronous error, which
 * ncclCommGetAsyncError reports (the first one wins), with its message as
 * the communicator's last error. One unit of a communicator runs at a
 * time. ncclCommDestroy waits for the communicator's launched units;
 * ncclCommAbort does not (a unit that runs after it fails at once).
 * ncclCommSplit runs on the calling thread: finish the parent's launched
 * work first.
 *
 * Build with -DMOCK_NO_SEND to leave out ncclSend (a library that lacks a
 * function the binding needs), with -DMOCK_NO_SPLIT to leave out
 * ncclCommSplit (as NCCL before 2.18), with -DMOCK_VERSION=<code> to make
 * ncclGetVersion report another version (30000: an NCCL 3.0.0), and with
 * -DMOCK_STAGE_BYTES=<n> for staging areas of n bytes (≥ 4096).
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mock.h"

typedef int (*gcmock_current_device_fn)(void);
typedef int (*gcmock_launch_fn)(void* stream, int device, void (*fn)(void*), void* arg, char* err, size_t errcap);

#define NCCL_SPLIT_NOCOLOR -1

const char* const kind_names[] = {"", "AllReduce", "AllGather", "ReduceScatter", "Broadcast", "CommSplit", "ncclSend", "ncclRecv"};

__thread char thread_last[256];

ncclResult_t mock_fail(struct mock_comm* c, ncclResult_t r, const char* fmt, ...) {
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(thread_last, sizeof thread_last, fmt, ap);
	va_end(ap);
	if (c != NULL) memcpy(c->last, thread_last, sizeof c->last);
	return r;
}

static gcmock_current_device_fn hook_device;
static gcmock_launch_fn hook_launch;

/* gcmock_set_device_hooks installs (or, with NULLs, removes) the device
 * hooks; see STREAMS above. */
void gcmock_set_device_hooks(gcmock_current_device_fn current_device, gcmock_launch_fn launch) {
	__atomic_store_n(&hook_device, current_device, __ATOMIC_RELEASE);
	__atomic_store_n(&hook_launch, launch, __ATOMIC_RELEASE);
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
	static unsigned long counter;
	if (id == NULL) return ncclInvalidArgument;
	memset(id, 0, sizeof *id);
	snprintf(id->internal, sizeof id->internal, "mock:ok:%d:%lu", (int)getpid(), __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED));
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

/* mode_of reads the mode an id selects and, for "failinit=R", R. */
static enum mode mode_of(const ncclUniqueId* id, int* failrank) {
	static const struct { const char* prefix; enum mode mode; } modes[] = {
		{"mock:hang:", MODE_HANG}, {"mock:stuck:", MODE_STUCK}, {"mock:async:", MODE_ASYNC}, {"mock:fail:", MODE_FAIL}};
	*failrank = -1;
	for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++)
		if (strncmp(id->internal, modes[i].prefix, strlen(modes[i].prefix)) == 0) return modes[i].mode;
	char colon = 0;
	if (sscanf(id->internal, "mock:failinit=%d%c", failrank, &colon) != 2 || colon != ':') *failrank = -1;
	return MODE_OK;
}

static int is_aborted(struct mock_comm* c) { return __atomic_load_n(&c->aborted, __ATOMIC_ACQUIRE); }

static struct mock_comm* comm_new(int rank, int nranks, enum mode mode, int device, uint64_t hash) {
	struct mock_comm* c = calloc(1, sizeof *c);
	if (c == NULL) return NULL;
	*c = (struct mock_comm){.rank = rank, .nranks = nranks, .mode = mode, .device = device, .hash = hash};
	pthread_mutex_init(&c->run_mu, NULL);
	pthread_mutex_init(&c->pend_mu, NULL);
	pthread_cond_init(&c->pend_cv, NULL);
	return c;
}

/* comm_free frees a communicator that was never handed out. */
static void comm_free(struct mock_comm* c) {
	pthread_mutex_destroy(&c->run_mu);
	pthread_mutex_destroy(&c->pend_mu);
	pthread_cond_destroy(&c->pend_cv);
	free(c);
}

ncclResult_t ncclCommInitRank(ncclComm_t* newcomm, int nranks, ncclUniqueId id, int rank) {
	const char* fn = "ncclCommInitRank";
	if (newcomm == NULL || nranks < 1 || nranks > MAXRANKS || rank < 0 || rank >= nranks)
		return mock_fail(NULL, ncclInvalidArgument, "mock: %s: bad nranks %d or rank %d", fn, nranks, rank);
	int device = -1;
	gcmock_current_device_fn current = __atomic_load_n(&hook_device, __ATOMIC_ACQUIRE);
	if (current != NULL && (device = current()) < 0)
		return mock_fail(NULL, ncclUnhandledCudaError, "mock: %s: rank %d: no current CUDA device on the calling thread", fn, rank);
	int failrank;
	enum mode mode = mode_of(&id, &failrank);
	if (rank == failrank)
		return mock_fail(NULL, ncclUnhandledCudaError, "mock: %s: rank %d told to fail by the unique id (failinit=%d)", fn, rank,
				 failrank);
	struct mock_comm* c = comm_new(rank, nranks, mode, device, mock_hash(&id, sizeof id, MOCK_HASH_SEED));
	if (c == NULL) return mock_fail(NULL, ncclSystemError, "mock: %s: rank %d: out of memory", fn, rank);
	/* Like NCCL, hand out the handle before waiting for the other ranks, so
	 * that another thread can abort a blocked init. */
	__atomic_store_n(newcomm, c, __ATOMIC_RELEASE);
	return world_join(c, fn, JOIN_CREATE | JOIN_WAIT);
}

ncclResult_t ncclCommAbort(ncclComm_t c) {
	if (c == NULL) return ncclInvalidArgument;
	world_leave(c, 1); /* the peers see a remote error, as NCCL's would */
	return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t c) {
	if (c == NULL) return ncclInvalidArgument;
	pthread_mutex_lock(&c->pend_mu);
	while (c->pending > 0) pthread_cond_wait(&c->pend_cv, &c->pend_mu);
	pthread_mutex_unlock(&c->pend_mu);
	world_leave(c, 0);
	return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t* r) {
	if (c == NULL || r == NULL) return ncclInvalidArgument;
	*r = __atomic_load_n(&c->async, __ATOMIC_ACQUIRE);
	return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t c, int* count) {
	if (c == NULL || count == NULL) return ncclInvalidArgument;
	*count = c->nranks;
	return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t c, int* rank) {
	if (c == NULL || rank == NULL) return ncclInvalidArgument;
	*rank = c->rank;
	return ncclSuccess;
}

/* ---- behaviour modes ---- */

/* check applies what fails a call on c at once: a NULL or aborted
 * communicator, "fail" mode. */
static ncclResult_t check(struct mock_comm* c, const char* fn) {
	if (c == NULL) return mock_fail(NULL, ncclInvalidArgument, "mock: %s: NULL communicator", fn);
	if (is_aborted(c)) return mock_fail(c, ncclInvalidUsage, "mock: %s: communicator was aborted", fn);
	if (c->mode == MODE_FAIL) return mock_fail(c, ncclInvalidUsage, "mock: %s: told to fail by the unique id", fn);
	return ncclSuccess;
}

/* hold blocks a hang/stuck world's call until the communicator is aborted. */
static ncclResult_t hold(struct mock_comm* c, struct world* w) {
	world_lock(w);
	while (!is_aborted(c)) world_wait(w);
	world_unlock(w);
	if (c->mode == MODE_STUCK) usleep(500 * 1000);
	return mock_fail(c, ncclSystemError, "mock: the call was held until the communicator was aborted");
}

/* report_async gives an "async" world's communicator its error after an
 * operation that succeeded. */
static void report_async(struct mock_comm* c) {
	if (c->mode == MODE_ASYNC) {
		snprintf(c->last, sizeof c->last, "mock: peer connection lost (told by the unique id)");
		__atomic_store_n(&c->async, ncclRemoteError, __ATOMIC_RELEASE);
	}
}

/* ---- units: one communicator's operations, run now or launched ---- */

struct unit {
	struct mock_comm* c;
	struct mapping* m; /* held until the unit is done */
	int n;
	struct op ops[];
};

/* run_unit runs a unit's collectives in order, then its sends and receives together. */
static ncclResult_t run_unit(struct unit* u) {
	struct mock_comm* c = u->c;
	struct world* w = u->m->w;
	const struct op* p2p[u->n];
	int np = 0;
	ncclResult_t r = ncclSuccess;
	pthread_mutex_lock(&c->run_mu);
	if (is_aborted(c))
		r = mock_fail(c, ncclInvalidUsage, "mock: %s: communicator was aborted", kind_names[u->ops[0].kind]);
	else if (c->mode == MODE_HANG || c->mode == MODE_STUCK)
		r = hold(c, w);
	for (int i = 0; i < u->n && r == ncclSuccess; i++) {
		if (u->ops[i].kind == K_SEND || u->ops[i].kind == K_RECV)
			p2p[np++] = &u->ops[i];
		else
			r = run_collective(c, w, &u->ops[i]);
	}
	if (r == ncclSuccess && np > 0) r = run_p2p(c, w, p2p, np);
	pthread_mutex_unlock(&c->run_mu);
	if (r == ncclSuccess) report_async(c);
	return r;
}

static void unit_free(struct unit* u) {
	map_put(u->m);
	free(u);
}

/* unit_finish frees a launched unit and counts it done. */
static void unit_finish(struct unit* u) {
	struct mock_comm* c = u->c;
	unit_free(u);
	pthread_mutex_lock(&c->pend_mu);
	if (--c->pending == 0) pthread_cond_broadcast(&c->pend_cv);
	pthread_mutex_unlock(&c->pend_mu);
}

/* unit_main is what the launcher runs: a failure is the communicator's
 * asynchronous error. */
static void unit_main(void* arg) {
	struct unit* u = arg;
	ncclResult_t r = run_unit(u);
	ncclResult_t none = ncclSuccess;
	if (r != ncclSuccess) __atomic_compare_exchange_n(&u->c->async, &none, r, 0, __ATOMIC_RELEASE, __ATOMIC_RELAXED);
	unit_finish(u);
}

/* dispatch runs the n ops of c now, or launches them as one unit. */
static ncclResult_t dispatch(struct mock_comm* c, const struct op* ops, int n) {
	const char* fn = kind_names[ops[0].kind];
	struct mapping* m = map_get(c);
	if (m == NULL) return mock_fail(c, ncclInvalidUsage, "mock: %s: rank %d: the communicator was destroyed", fn, c->rank);
	struct unit* u = malloc(sizeof *u + (size_t)n * sizeof *ops);
	if (u == NULL) {
		map_put(m);
		return mock_fail(c, ncclSystemError, "mock: %s: rank %d: out of memory", fn, c->rank);
	}
	u->c = c;
	u->m = m;
	u->n = n;
	memcpy(u->ops, ops, (size_t)n * sizeof *ops);
	gcmock_launch_fn launch = __atomic_load_n(&hook_launch, __ATOMIC_ACQUIRE);
	if (launch == NULL) {
		ncclResult_t r = run_unit(u);
		unit_free(u);
		return r;
	}
	pthread_mutex_lock(&c->pend_mu);
	c->pending++;
	pthread_mutex_unlock(&c->pend_mu);
	char err[256] = "";
	if (launch(ops[0].stream, c->device, unit_main, u, err, sizeof err) != 0) {
		err[sizeof err - 1] = 0;
		unit_finish(u);
		return mock_fail(c, ncclInvalidUsage, "mock: %s: rank %d: launching on device %d failed: %s", fn, c->rank, c->device,
				 err[0] ? err : "the launcher gave no reason");
	}
	return ncclSuccess;
}

/* Group state is per thread, as in NCCL: between ncclGroupStart and
 * ncclGroupEnd, operations are queued on the calling thread; ncclGroupEnd
 * dispatches each communicator's as one unit. */
struct queued {
	struct mock_comm* c;
	struct op o;
};
static __thread int group_depth;
static __thread struct queued* group_ops;
static __thread int group_n, group_cap;

static ncclResult_t queue(struct mock_comm* c, const struct op* o, const char* fn) {
	if (group_n == group_cap) {
		int cap = group_cap ? 2 * group_cap : 8;
		struct queued* q = realloc(group_ops, (size_t)cap * sizeof *q);
		if (q == NULL) return mock_fail(c, ncclSystemError, "mock: %s: queueing %d group operations: out of memory", fn, cap);
		group_ops = q;
		group_cap = cap;
	}
	group_ops[group_n++] = (struct queued){c, *o};
	return ncclSuccess;
}

/* submit checks one operation, then queues it in the thread's group or dispatches it. */
static ncclResult_t submit(struct mock_comm* c, struct op o) {
	const char* fn = kind_names[o.kind];
	ncclResult_t r = check(c, fn);
	if (r != ncclSuccess) return r;
	int p2p = o.kind == K_SEND || o.kind == K_RECV;
	if (dtype_size(o.dtype) == 0) return mock_fail(c, ncclInvalidArgument, "mock: %s: unknown data type %d", fn, o.dtype);
	if ((o.kind == K_ALLREDUCE || o.kind == K_REDUCESCATTER) && !reducible(o.dtype))
		return mock_fail(c, ncclInvalidArgument, "mock: %s: data type %d is not supported by the mock", fn, o.dtype);
	if ((p2p || o.kind == K_BROADCAST) && (o.root < 0 || o.root >= c->nranks))
		return mock_fail(c, ncclInvalidArgument, "mock: %s: %s %d out of range [0, %d)", fn, p2p ? "peer" : "root", o.root,
				 c->nranks);
	if (group_depth > 0) return queue(c, &o, fn);
	return dispatch(c, &o, 1);
}

/* ---- collectives and point to point ---- */

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
			   cudaStream_t s) {
	return submit(c, (struct op){K_ALLREDUCE, send, recv, count, t, op, 0, s});
}

ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t t, ncclComm_t c, cudaStream_t s) {
	return submit(c, (struct op){K_ALLGATHER, send, recv, count, t, 0, 0, s});
}

ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
			       cudaStream_t s) {
	return submit(c, (struct op){K_REDUCESCATTER, send, recv, count, t, op, 0, s});
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t t, int root, ncclComm_t c,
			   cudaStream_t s) {
	return submit(c, (struct op){K_BROADCAST, send, recv, count, t, 0, root, s});
}

#ifndef MOCK_NO_SEND
ncclResult_t ncclSend(const void* buf, size_t count, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t s) {
	return submit(c, (struct op){K_SEND, buf, NULL, count, t, 0, peer, s});
}
#endif

ncclResult_t ncclRecv(void* buf, size_t count, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t s) {
	return submit(c, (struct op){K_RECV, NULL, buf, count, t, 0, peer, s});
}

/* ---- split ---- */

#ifndef MOCK_NO_SPLIT
/* split_before reports whether old rank q comes before old rank p in their
 * new communicator: by key, then by old rank. */
static int split_before(struct world* w, int q, int p) {
	return w->split[q].key < w->split[p].key || (w->split[q].key == w->split[p].key && q < p);
}

/* split exchanges colors and keys over comm's world, then joins this
 * rank's new world, which the group's first rank made (*out stays NULL for
 * NCCL_SPLIT_NOCOLOR). */
static ncclResult_t split(struct mock_comm* comm, struct world* w, int color, int key, struct mock_comm** out) {
	const char* fn = "ncclCommSplit";
	int me = comm->rank;
	w->slots[me] = (struct slot){.kind = K_SPLIT};
	w->split[me].color = color;
	w->split[me].key = key;
	if (barrier(comm, w)) return aborted_error(comm, fn);
	for (int q = 0; q < w->nranks; q++) {
		if (w->slots[q].kind != K_SPLIT) {
			barrier(comm, w);
			return mock_fail(comm, ncclInvalidUsage, "mock: ranks disagree: rank %d called CommSplit, rank %d called %s", me, q,
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
	/* The new world's name: its parent's, the how-manieth split, and the
	 * group's first rank, which every member computes alike. */
	unsigned long seq = ++comm->splits;
	uint64_t h = mock_hash(&comm->hash, sizeof comm->hash, MOCK_HASH_SEED);
	h = mock_hash(&seq, sizeof seq, h);
	h = mock_hash(&first, sizeof first, h);
	ncclResult_t made = first == me ? world_make(h, n, comm->mode, fn, comm) : ncclSuccess;
	/* Nobody opens the new world before the group's first rank has made it. */
	if (barrier(comm, w)) {
		if (first == me && made == ncclSuccess) world_unlink(h);
		return aborted_error(comm, fn);
	}
	if (made != ncclSuccess || color == NCCL_SPLIT_NOCOLOR) return made;
	struct mock_comm* c = comm_new(pos, n, comm->mode, comm->device, h);
	if (c == NULL) return mock_fail(comm, ncclSystemError, "mock: %s: rank %d: out of memory", fn, me);
	ncclResult_t r = world_join(c, fn, 0);
	if (r != ncclSuccess) {
		memcpy(comm->last, c->last, sizeof comm->last);
		comm_free(c);
		return r;
	}
	*out = c;
	return ncclSuccess;
}

/* ncclCommSplit is a collective of the parent's world: every rank posts its
 * color and key, then the ranks of one color form a new world, ordered by
 * key, then by their rank in the parent. The group's first rank makes the
 * world (of the parent's mode) in shared memory; the others join it
 * without waiting for each other. As in NCCL, *newcomm is NULL until the
 * split is complete, and stays NULL for NCCL_SPLIT_NOCOLOR; an abort of
 * the parent ends a split that waits for its peers. config is ignored (the
 * binding passes NULL). It runs on the calling thread, after any of the
 * parent's launched units that is running. */
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, void* config) {
	(void)config;
	const char* fn = "ncclCommSplit";
	if (newcomm == NULL) return mock_fail(comm, ncclInvalidArgument, "mock: %s: NULL newcomm", fn);
	*newcomm = NULL;
	ncclResult_t r = check(comm, fn);
	if (r != ncclSuccess) return r;
	if (color < NCCL_SPLIT_NOCOLOR) return mock_fail(comm, ncclInvalidArgument, "mock: %s: color %d", fn, color);
	struct mapping* m = map_get(comm);
	if (m == NULL) return mock_fail(comm, ncclInvalidUsage, "mock: %s: rank %d: the communicator was destroyed", fn, comm->rank);
	struct mock_comm* c = NULL;
	pthread_mutex_lock(&comm->run_mu);
	if (comm->mode == MODE_HANG || comm->mode == MODE_STUCK)
		r = hold(comm, m->w);
	else
		r = split(comm, m->w, color, key, &c);
	pthread_mutex_unlock(&comm->run_mu);
	map_put(m);
	if (r != ncclSuccess) return r;
	report_async(comm);
	if (c != NULL) __atomic_store_n(newcomm, c, __ATOMIC_RELEASE);
	return ncclSuccess;
}
#endif

/* ---- groups ---- */

ncclResult_t ncclGroupStart(void) {
	group_depth++;
	return ncclSuccess;
}

/* group_run is one communicator's unit of a group run on a thread of its own. */
struct group_run {
	struct mock_comm* c;
	const struct op* ops;
	int n;
	ncclResult_t r;
	pthread_t thread;
};

static void* group_thread(void* arg) {
	struct group_run* g = arg;
	g->r = dispatch(g->c, g->ops, g->n);
	return NULL;
}

/* ncclGroupEnd dispatches each communicator's queued operations as one
 * unit: launched, with the hooks; else run at once, each communicator's on
 * a thread of its own (so that one thread can drive several ranks). */
ncclResult_t ncclGroupEnd(void) {
	if (group_depth == 0) return mock_fail(NULL, ncclInvalidUsage, "mock: ncclGroupEnd without ncclGroupStart");
	if (--group_depth > 0) return ncclSuccess;
	int n = group_n;
	group_n = 0;
	if (n == 0) return ncclSuccess;
	/* Sort the ops by communicator (in order of first appearance), keeping
	 * each communicator's in their order. */
	struct op* ops = malloc((size_t)n * sizeof *ops);
	struct group_run* runs = calloc((size_t)n, sizeof *runs);
	if (ops == NULL || runs == NULL) {
		free(ops);
		free(runs);
		return mock_fail(NULL, ncclSystemError, "mock: ncclGroupEnd: %d operations: out of memory", n);
	}
	int nruns = 0, k = 0;
	for (int i = 0; i < n; i++) {
		struct mock_comm* c = group_ops[i].c;
		int seen = 0;
		for (int j = 0; j < nruns; j++) seen |= runs[j].c == c;
		if (seen) continue;
		runs[nruns] = (struct group_run){.c = c, .ops = &ops[k]};
		for (int j = i; j < n; j++)
			if (group_ops[j].c == c) ops[k++] = group_ops[j].o, runs[nruns].n++;
		nruns++;
	}
	int threads = nruns > 1 && __atomic_load_n(&hook_launch, __ATOMIC_ACQUIRE) == NULL;
	for (int j = 0; j < nruns; j++) {
		if (!threads || pthread_create(&runs[j].thread, NULL, group_thread, &runs[j]) != 0) {
			runs[j].thread = 0;
			group_thread(&runs[j]);
		}
	}
	ncclResult_t r = ncclSuccess;
	for (int j = 0; j < nruns; j++) {
		if (runs[j].thread != 0) pthread_join(runs[j].thread, NULL);
		if (r == ncclSuccess && runs[j].r != ncclSuccess) {
			r = runs[j].r;
			memcpy(thread_last, runs[j].c->last, sizeof thread_last);
		}
	}
	free(ops);
	free(runs);
	return r;
}
