/*
 * world.c — the MOCK libnccl.so.2's worlds in POSIX shared memory (a test
 * fixture; see mocknccl.c for the protocol): creating, joining and leaving
 * them, their process-shared lock, and the barrier.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mock.h"

pthread_mutex_t maps_mu = PTHREAD_MUTEX_INITIALIZER;

/* mock_hash continues the FNV-1a 64 hash h over the n bytes at p. */
uint64_t mock_hash(const void* p, size_t n, uint64_t h) {
	const unsigned char* b = p;
	for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
	return h;
}

/* world_name writes the segment name of the world hash, "/gcmock-<16 hex>". */
static void world_name(uint64_t hash, char name[32]) { snprintf(name, 32, "/gcmock-%016llx", (unsigned long long)hash); }

#define ALIGN64(n) (((n) + 63) & ~(size_t)63)

static size_t boxes_offset(void) { return ALIGN64(sizeof(struct world)); }
static size_t stages_offset(int n) { return boxes_offset() + ALIGN64((size_t)n * n * sizeof(struct box)); }
static size_t world_size(int n) { return stages_offset(n) + (size_t)n * 2 * MOCK_STAGE_BYTES; }

struct box* world_box(struct world* w, int from, int to) {
	return (struct box*)((char*)w + boxes_offset()) + (size_t)from * w->nranks + to;
}

/* world_stage is rank's staging area for collectives, MOCK_STAGE_BYTES. */
char* world_stage(struct world* w, int rank) { return (char*)w + stages_offset(w->nranks) + (size_t)rank * 2 * MOCK_STAGE_BYTES; }

/* world_p2p is the p2p_chunk bytes where from stages its sends to to. */
char* world_p2p(struct world* w, int from, int to) {
	return world_stage(w, from) + MOCK_STAGE_BYTES + (size_t)to * p2p_chunk(w->nranks);
}

size_t p2p_chunk(int nranks) { return (MOCK_STAGE_BYTES / nranks) & ~(size_t)63; }

/* ---- the lock: a robust mutex, so that a process that died holding it
 * breaks the world instead of wedging it ---- */

void world_lock(struct world* w) {
	if (pthread_mutex_lock(&w->mu) == EOWNERDEAD) {
		w->broken = 1;
		pthread_mutex_consistent(&w->mu);
	}
}

void world_wait(struct world* w) {
	if (pthread_cond_wait(&w->cv, &w->mu) == EOWNERDEAD) {
		w->broken = 1;
		pthread_mutex_consistent(&w->mu);
	}
}

void world_unlock(struct world* w) { pthread_mutex_unlock(&w->mu); }

static int aborted(struct mock_comm* c) { return __atomic_load_n(&c->aborted, __ATOMIC_ACQUIRE); }

/* barrier waits for every rank of the world; nonzero when the world broke
 * or c was aborted first. */
int barrier(struct mock_comm* c, struct world* w) {
	world_lock(w);
	unsigned long gen = w->bgen;
	if (++w->bcount == w->nranks) {
		w->bcount = 0;
		w->bgen++;
		pthread_cond_broadcast(&w->cv);
	} else {
		while (gen == w->bgen && !w->broken && !aborted(c)) world_wait(w);
	}
	int broken = gen == w->bgen;
	world_unlock(w);
	return broken;
}

/* ---- segments ---- */

/* world_init initialises a fresh (zeroed) segment and marks it ready. */
static void world_init(struct world* w, uint64_t hash, int nranks, enum mode mode, size_t size) {
	w->nranks = nranks;
	w->mode = mode;
	w->hash = hash;
	w->size = size;
	w->linked = 1;
	pthread_mutexattr_t ma;
	pthread_mutexattr_init(&ma);
	pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
	pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST);
	pthread_mutex_init(&w->mu, &ma);
	pthread_mutexattr_destroy(&ma);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setpshared(&ca, PTHREAD_PROCESS_SHARED);
	pthread_cond_init(&w->cv, &ca);
	pthread_condattr_destroy(&ca);
	__atomic_store_n(&w->ready, WORLD_READY, __ATOMIC_RELEASE);
}

/* create makes the segment name of size bytes exclusively and maps it: 0,
 * EEXIST when it exists, or another errno (*what says which call failed). */
static int create(const char* name, size_t size, struct world** out, const char** what) {
	*what = "shm_open";
	int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
	if (fd < 0) return errno;
	int err = 0;
	void* p = MAP_FAILED;
	if (ftruncate(fd, (off_t)size) != 0) {
		err = errno;
		*what = "ftruncate";
	} else if ((p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
		err = errno;
		*what = "mmap";
	}
	close(fd);
	if (err != 0) {
		shm_unlink(name);
		return err;
	}
	*out = p;
	return 0;
}

/* open_ready maps the existing segment name once its creator has made it
 * ready, waiting for that (checking every millisecond whether c was
 * aborted): 0, ENOENT when there is no such segment, or another errno. */
static int open_ready(struct mock_comm* c, const char* name, struct world** out, const char** what) {
	*what = "shm_open";
	int fd = shm_open(name, O_RDWR, 0);
	if (fd < 0) return errno;
	size_t size = 0;
	while (size == 0) {
		struct stat st;
		if (fstat(fd, &st) != 0) {
			*what = "fstat";
			break;
		}
		if ((size_t)st.st_size >= sizeof(struct world)) {
			struct world* h = mmap(NULL, sizeof *h, PROT_READ, MAP_SHARED, fd, 0);
			if (h == MAP_FAILED) {
				*what = "mmap";
				break;
			}
			if (__atomic_load_n(&h->ready, __ATOMIC_ACQUIRE) == WORLD_READY) size = h->size;
			munmap(h, sizeof *h);
		}
		if (size == 0 && aborted(c)) {
			close(fd);
			*what = "waiting for its creator (aborted)";
			return ECANCELED;
		}
		if (size == 0) usleep(1000);
	}
	int err = size == 0 ? errno : 0;
	void* p = MAP_FAILED;
	if (size != 0 && (p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
		err = errno;
		*what = "mmap";
	}
	close(fd);
	if (err == 0) *out = p;
	return err;
}

/* alive reports whether process pid exists. */
static int alive(pid_t pid) { return kill(pid, 0) == 0 || errno == EPERM; }

/* stale reports whether a world found under its name is left over from a
 * crashed run: complete already (the last rank to join unlinks the name),
 * or every process that joined it is gone. Call it with w locked. */
static int stale(struct world* w) {
	if (w->joined >= w->nranks) return 1;
	for (int r = 0; r < w->nranks; r++)
		if (w->pid[r] != 0 && alive(w->pid[r])) return 0;
	return w->joined > 0;
}

/* unlink_locked removes w's name unless it is gone already. Call it with
 * w locked: a name is removed once, by whoever clears linked. */
static void unlink_locked(struct world* w) {
	if (!w->linked) return;
	w->linked = 0;
	char name[32];
	world_name(w->hash, name);
	shm_unlink(name);
}

/* detach takes one communicator out of w (breaking w when abort is set)
 * and removes w's name when it was the last one there. */
static void detach(struct world* w, int abort) {
	world_lock(w);
	if (abort) w->broken = 1;
	if (--w->live == 0) unlink_locked(w);
	pthread_cond_broadcast(&w->cv);
	world_unlock(w);
}

static void unmap(struct world* w) { munmap(w, w->size); }

struct mapping* map_get(struct mock_comm* c) {
	pthread_mutex_lock(&maps_mu);
	struct mapping* m = c->m;
	if (m != NULL) m->refs++;
	pthread_mutex_unlock(&maps_mu);
	return m;
}

void map_put(struct mapping* m) {
	pthread_mutex_lock(&maps_mu);
	int refs = --m->refs;
	pthread_mutex_unlock(&maps_mu);
	if (refs == 0) {
		unmap(m->w);
		free(m);
	}
}

/* attach maps c's world, creating it when flags has JOIN_CREATE and nobody
 * has; NULL and ncclSuccess when the caller should try again (the name
 * went away in between). */
static ncclResult_t attach(struct mock_comm* c, const char* fn, int flags, struct world** out) {
	char name[32];
	world_name(c->hash, name);
	size_t size = world_size(c->nranks);
	const char* what = "";
	*out = NULL;
	int err = EEXIST;
	if (flags & JOIN_CREATE) {
		if ((err = create(name, size, out, &what)) == 0) {
			world_init(*out, c->hash, c->nranks, c->mode, size);
			return ncclSuccess;
		}
		if (err != EEXIST)
			return mock_fail(c, ncclSystemError, "mock: %s: rank %d: creating world %s (%zu bytes): %s: %s", fn, c->rank,
					 name, size, what, strerror(err));
	}
	err = open_ready(c, name, out, &what);
	if (err == ENOENT && (flags & JOIN_CREATE)) return ncclSuccess;
	if (err != 0)
		return mock_fail(c, ncclSystemError, "mock: %s: rank %d: opening world %s: %s: %s", fn, c->rank, name, what,
				 strerror(err));
	return ncclSuccess;
}

/* enter registers c as its rank in w, unless w is stale (then it removes
 * w's name, and *retry is set) or does not fit c. */
static ncclResult_t enter(struct mock_comm* c, struct world* w, const char* fn, int* retry) {
	ncclResult_t r = ncclSuccess;
	*retry = 0;
	world_lock(w);
	if (!w->linked || stale(w)) {
		unlink_locked(w);
		*retry = 1;
	} else if (w->nranks != c->nranks) {
		r = mock_fail(c, ncclInvalidArgument, "mock: %s: nranks %d differs from the first rank's %d", fn, c->nranks,
			      w->nranks);
	} else if (w->pid[c->rank] != 0) {
		r = mock_fail(c, ncclInvalidUsage, "mock: %s: rank %d joined the world twice (processes %d and %d)", fn, c->rank,
			      (int)w->pid[c->rank], (int)getpid());
	} else {
		w->pid[c->rank] = getpid();
		w->joined++;
		w->live++;
		if (w->joined == w->nranks) unlink_locked(w); /* every rank has it mapped */
		pthread_cond_broadcast(&w->cv);
	}
	world_unlock(w);
	return r;
}

ncclResult_t world_join(struct mock_comm* c, const char* fn, int flags) {
	struct world* w = NULL;
	for (int retry = 1; retry;) {
		ncclResult_t r = attach(c, fn, flags, &w);
		if (r != ncclSuccess) return r;
		if (w == NULL) continue;
		if ((r = enter(c, w, fn, &retry)) != ncclSuccess || retry) unmap(w);
		if (r != ncclSuccess) return r;
	}
	pthread_mutex_lock(&maps_mu);
	struct mapping* m = NULL;
	if (!aborted(c) && (m = malloc(sizeof *m)) != NULL) {
		*m = (struct mapping){.w = w, .refs = 2}; /* the communicator's, and this call's */
		c->m = m;
	}
	pthread_mutex_unlock(&maps_mu);
	if (m == NULL) {
		detach(w, 1);
		unmap(w);
		return mock_fail(c, ncclSystemError, "mock: %s: rank %d: aborted while joining its world", fn, c->rank);
	}
	int missing = 0;
	if (flags & JOIN_WAIT) {
		/* As NCCL's bootstrap, wait for the missing ranks until this rank is
		 * aborted: a peer's abort or death does not end the wait. */
		world_lock(w);
		while (w->joined < w->nranks && !aborted(c)) world_wait(w);
		missing = w->nranks - w->joined;
		world_unlock(w);
	}
	map_put(m);
	if (missing > 0)
		return mock_fail(c, ncclSystemError, "mock: %s: aborted while waiting for %d of %d ranks", fn, missing, c->nranks);
	return ncclSuccess;
}

ncclResult_t world_make(uint64_t hash, int nranks, enum mode mode, const char* fn, struct mock_comm* blame) {
	char name[32];
	world_name(hash, name);
	size_t size = world_size(nranks);
	struct world* w = NULL;
	const char* what = "";
	int err = create(name, size, &w, &what);
	if (err == EEXIST) { /* left over from a crashed run: names hash their parent's, which hash a pid */
		shm_unlink(name);
		err = create(name, size, &w, &what);
	}
	if (err != 0)
		return mock_fail(blame, ncclSystemError, "mock: %s: creating world %s (%zu bytes): %s: %s", fn, name, size, what,
				 strerror(err));
	world_init(w, hash, nranks, mode, size);
	unmap(w);
	return ncclSuccess;
}

void world_unlink(uint64_t hash) {
	char name[32];
	world_name(hash, name);
	shm_unlink(name);
}

void world_leave(struct mock_comm* c, int abort) {
	pthread_mutex_lock(&maps_mu);
	if (abort) __atomic_store_n(&c->aborted, 1, __ATOMIC_RELEASE);
	struct mapping* m = c->m;
	c->m = NULL;
	pthread_mutex_unlock(&maps_mu);
	if (m == NULL) return; /* not joined yet (the join sees the abort), or gone already */
	detach(m->w, abort);
	map_put(m);
}
