/*
 * capi_host.h — the host's communicator of the C ABI tests that drive
 * engines and outer loops over hosted transports (capi_engine_test.c,
 * capi_outer_test.c): each rank has a host that takes its transport's
 * posts (a thread in gc_hosted_take or gc_hosted_take_group, or a
 * launcher) and carries them out with the other ranks' hosts through
 * shared memory, a rendezvous per collective with a timeout, as gloo or
 * NCCL would time out; a host can inject a fault into the next op it
 * takes, or hang. Include once, after gradcomp.h and capi_check.h, in a
 * program defining _POSIX_C_SOURCE 200809L.
 */
#ifndef GRADCOMP_CAPI_HOST_H
#define GRADCOMP_CAPI_HOST_H

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The most ranks a group of hosts serves. */
#define CAPI_MAX_RANKS 4

static double now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* ---- The host's communicator: a group of host threads in one process ---- */

/* group is a barrier with a timeout: a rank that does not arrive in time
 * breaks it for good, and every later collective fails at once. */
struct group {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int n, count;
	unsigned gen;
	int broken;
	double timeout;
	gc_op ops[CAPI_MAX_RANKS];
};

static void group_init(struct group *g, int n, double timeout) {
	memset(g, 0, sizeof *g);
	pthread_mutex_init(&g->mu, NULL);
	pthread_cond_init(&g->cv, NULL);
	g->n = n;
	g->timeout = timeout;
}

static void group_free(struct group *g) {
	pthread_mutex_destroy(&g->mu);
	pthread_cond_destroy(&g->cv);
}

/* arrive waits for every rank; 0, or -1 once the group is broken. */
static int arrive(struct group *g) {
	pthread_mutex_lock(&g->mu);
	unsigned gen = g->gen;
	if (!g->broken && ++g->count == g->n) {
		g->count = 0;
		g->gen++;
		pthread_cond_broadcast(&g->cv);
	}
	struct timespec dl;
	clock_gettime(CLOCK_REALTIME, &dl);
	double t = dl.tv_sec + dl.tv_nsec / 1e9 + g->timeout;
	dl.tv_sec = (time_t)t;
	dl.tv_nsec = (long)((t - (double)dl.tv_sec) * 1e9);
	while (gen == g->gen && !g->broken) {
		if (pthread_cond_timedwait(&g->cv, &g->mu, &dl) == ETIMEDOUT) {
			g->broken = 1;
			pthread_cond_broadcast(&g->cv);
		}
	}
	int ok = gen != g->gen;
	pthread_mutex_unlock(&g->mu);
	return ok ? 0 : -1;
}

/* Faults a host thread can inject into the first op it takes once armed. */
enum fault { FAULT_NONE, FAULT_ERROR, FAULT_WRONG_LENGTH, FAULT_HUGE_LENGTH, FAULT_UNKNOWN_ID, FAULT_TWICE };

struct host {
	gc_hosted t;
	struct group *g;
	int rank;
	int armed;         /* atomic: apply fault to the next op */
	int paused;        /* atomic: take nothing (a host that hangs) */
	enum fault fault;
	gc_status fault_status; /* what gc_hosted_complete returned for the fault */
	int ops;           /* ops carried out */
	int faulted_at;    /* ops when the fault was applied */
	int split;         /* 1: take gid's posts alone (gc_hosted_take_group) */
	int gid;           /* with split: the GC_GROUP_* this host serves */
	int launched;      /* 1: a launcher (gc_hosted_set_launcher), no thread */
	pthread_t thread;
};

/* carry_out computes rank h->rank's output of op from every rank's op,
 * into tmp (recv_bytes long). The ranks' ops must agree. */
static const char *carry_out(struct host *h, const gc_op *op, uint8_t *tmp) {
	struct group *g = h->g;
	int n = g->n, r = h->rank;
	for (int q = 0; q < n; q++) {
		const gc_op *o = &g->ops[q];
		if (o->kind != op->kind || o->count != op->count || o->root != op->root) return "ranks posted different collectives";
	}
	size_t c = (size_t)op->count;
	switch (op->kind) {
	case GC_OP_ALLREDUCE:
	case GC_OP_REDUCESCATTER: {
		size_t off = op->kind == GC_OP_REDUCESCATTER ? (size_t)r * c : 0;
		float *out = (float *)tmp;
		for (size_t i = 0; i < c; i++) {
			float s = 0;
			for (int q = 0; q < n; q++) s += ((const float *)g->ops[q].send)[off + i];
			out[i] = s;
		}
		return NULL;
	}
	case GC_OP_ALLGATHER:
		for (int q = 0; q < n; q++) memcpy(tmp + (size_t)q * c, (const void *)g->ops[q].send, c);
		return NULL;
	case GC_OP_ALLTOALL: {
		size_t k = c / (size_t)n;
		for (int q = 0; q < n; q++) memcpy(tmp + (size_t)q * k, (const uint8_t *)g->ops[q].send + (size_t)r * k, k);
		return NULL;
	}
	case GC_OP_BROADCAST:
		memcpy(tmp, (const void *)g->ops[op->root].send, c);
		return NULL;
	case GC_OP_BARRIER:
		return NULL;
	}
	return "unknown op kind";
}

/* carry carries out op, taken by host h, and completes it, applying h's
 * armed fault. */
static void carry(struct host *h, gc_op op) {
	CHECK(op.device == 0 && op.group == (h->split ? h->gid : GC_GROUP_WORLD), "rank %d op %llu: device %d, group %d",
	      h->rank, (unsigned long long)op.id, op.device, op.group);
	if (__atomic_exchange_n(&h->armed, 0, __ATOMIC_ACQ_REL)) {
		h->faulted_at = h->ops;
		switch (h->fault) {
		case FAULT_ERROR:
			h->fault_status = gc_hosted_complete(h->t, op.id, GC_ERR_COMM, "injected host failure", 0);
			return;
		case FAULT_WRONG_LENGTH:
			h->fault_status = gc_hosted_complete(h->t, op.id, GC_OK, NULL, op.recv_bytes + 4);
			return;
		case FAULT_HUGE_LENGTH: /* no plausible length: refused, and the op fails at once */
			h->fault_status = gc_hosted_complete(h->t, op.id, GC_OK, NULL, 1ull << 63);
			return;
		case FAULT_UNKNOWN_ID:
			h->fault_status = gc_hosted_complete(h->t, op.id + 1000, GC_OK, NULL, op.recv_bytes);
			return;
		case FAULT_TWICE: /* carried out below, then completed again */
		case FAULT_NONE:
			break;
		}
	}
	uint8_t *tmp = malloc(op.recv_bytes + 1);
	const char *err = NULL;
	h->g->ops[h->rank] = op;
	if (arrive(h->g) != 0) {
		err = "a peer did not post the collective in time";
	} else {
		err = carry_out(h, &op, tmp);
		if (arrive(h->g) != 0 && err == NULL) err = "a peer did not finish the collective in time";
	}
	if (err == NULL) {
		if (op.kind != GC_OP_BARRIER) memcpy((void *)op.recv, tmp, op.recv_bytes);
		OK(gc_hosted_complete(h->t, op.id, GC_OK, NULL, op.kind == GC_OP_BARRIER ? 0 : op.recv_bytes));
		if (h->fault == FAULT_TWICE && h->ops == h->faulted_at)
			h->fault_status = gc_hosted_complete(h->t, op.id, GC_OK, NULL, op.recv_bytes);
	} else {
		/* Unchecked: the engine may have given up on the op
		 * (GC_ERR_STATE), or the transport be destroyed. */
		gc_hosted_complete(h->t, op.id, GC_ERR_COMM, err, 0);
	}
	free(tmp);
	h->ops++;
}

/* host_main takes and carries out h->t's posts until the transport is
 * destroyed. */
static void *host_main(void *arg) {
	struct host *h = arg;
	for (;;) {
		gc_op op;
		if (__atomic_load_n(&h->paused, __ATOMIC_ACQUIRE)) {
			struct timespec ts = {0, 10 * 1000 * 1000};
			nanosleep(&ts, NULL);
			continue;
		}
		gc_status st = h->split ? gc_hosted_take_group(h->t, h->gid, 0.05, &op) : gc_hosted_take(h->t, 0.05, &op);
		if (st == GC_ERR_TIMEOUT) continue;
		if (st != GC_OK) break; /* GC_ERR_CLOSED: destroyed */
		carry(h, op);
	}
	return NULL;
}

/* launch is a gc_launch_fn: it carries out op on the engine's thread that
 * posts it, before returning (a host of this test's kind, whose
 * collectives are synchronous; a real one starts it and returns). */
static void launch(void *ctx, const gc_op *op) { carry(ctx, *op); }

/* hosts_start starts n hosts of group g: threads taking the posts, or,
 * with launched, launchers (gc_hosted_set_launcher) carrying them out. */
static void hosts_start(struct host *hs, struct group *g, int n, int launched) {
	for (int r = 0; r < n; r++) {
		memset(&hs[r], 0, sizeof hs[r]);
		hs[r].g = g;
		hs[r].rank = r;
		hs[r].launched = launched;
		OK(gc_hosted_create(r, n, &hs[r].t));
		if (launched)
			OK(gc_hosted_set_launcher(hs[r].t, GC_GROUP_WORLD, launch, &hs[r]));
		else
			pthread_create(&hs[r].thread, NULL, host_main, &hs[r]);
	}
}

static void hosts_stop(struct host *hs, int n) {
	for (int r = 0; r < n; r++) {
		OK(gc_hosted_destroy(hs[r].t));
		__atomic_store_n(&hs[r].paused, 0, __ATOMIC_RELEASE); /* a paused host takes, and sees the end */
	}
	for (int r = 0; r < n; r++)
		if (!hs[r].launched) pthread_join(hs[r].thread, NULL);
}

#endif
