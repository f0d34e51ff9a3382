/*
 * hooks.c — checks the mock libnccl.so.2's device hooks (see mocknccl.c,
 * STREAMS) with a launcher that queues work per stream and runs it later:
 * the device a communicator takes, the launch refusal, stream order, one
 * unit per communicator at ncclGroupEnd, a split's device, and failures
 * while launched work runs becoming asynchronous errors. Two ranks are two
 * threads. Built and run by TestDeviceHooks; prints PASS or what failed.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

typedef int ncclResult_t;
typedef struct { char internal[128]; } ncclUniqueId;
typedef void* ncclComm_t;
ncclResult_t ncclCommInitRank(ncclComm_t*, int, ncclUniqueId, int);
ncclResult_t ncclCommSplit(ncclComm_t, int, int, ncclComm_t*, void*);
ncclResult_t ncclCommAbort(ncclComm_t);
ncclResult_t ncclCommDestroy(ncclComm_t);
ncclResult_t ncclCommGetAsyncError(ncclComm_t, ncclResult_t*);
ncclResult_t ncclAllReduce(const void*, void*, size_t, int, int, ncclComm_t, void*);
ncclResult_t ncclSend(const void*, size_t, int, int, ncclComm_t, void*);
ncclResult_t ncclRecv(void*, size_t, int, int, ncclComm_t, void*);
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);
const char* ncclGetLastError(ncclComm_t);
void gcmock_set_device_hooks(int (*)(void), int (*)(void*, int, void (*)(void*), void*, char*, size_t));

enum { FLOAT32 = 7, SUM = 0, N = 3000 };

/* stream is a fake GPU's stream: work queued in order, run by drain. */
struct stream {
	int device, n;
	struct { void (*fn)(void*); void* arg; } q[8];
};

static __thread int current_device = -1;
static int failures;

#define CHECK(cond, ...)                                                      \
	do {                                                                  \
		if (!(cond)) {                                                \
			printf("line %d: ", __LINE__);                        \
			printf(__VA_ARGS__);                                  \
			printf("\n");                                         \
			failures++;                                           \
		}                                                             \
	} while (0)

static int device_hook(void) { return current_device; }

static int launch_hook(void* stream, int device, void (*fn)(void*), void* arg, char* err, size_t errcap) {
	struct stream* s = stream;
	if (s->device != device) {
		snprintf(err, errcap, "stream %p is not on device %d", stream, device);
		return 1;
	}
	s->q[s->n].fn = fn;
	s->q[s->n].arg = arg;
	s->n++;
	return 0;
}

static void* drain(void* arg) {
	struct stream* s = arg;
	for (int i = 0; i < s->n; i++) s->q[i].fn(s->q[i].arg);
	s->n = 0;
	return NULL;
}

/* drain_both runs both streams' queues at once, as two devices would. */
static void drain_both(struct stream* s) {
	pthread_t t;
	pthread_create(&t, NULL, drain, &s[1]);
	drain(&s[0]);
	pthread_join(t, NULL);
}

static ncclUniqueId id;
static ncclComm_t comm[2], child[2];
static ncclResult_t init_rc[2], split_rc[2];

static void* init_rank(void* arg) {
	int r = (int)(long)arg;
	current_device = r;
	init_rc[r] = ncclCommInitRank(&comm[r], 2, id, r);
	return NULL;
}

static void* split_rank(void* arg) {
	int r = (int)(long)arg;
	split_rc[r] = ncclCommSplit(comm[r], 0, r, &child[r], NULL);
	return NULL;
}

static void on_both_ranks(void* (*f)(void*)) {
	pthread_t t;
	pthread_create(&t, NULL, f, (void*)1L);
	f((void*)0L);
	pthread_join(t, NULL);
}

static float a[2][N], b[2][N], c[2][N], d[2][N];

int main(void) {
	gcmock_set_device_hooks(device_hook, launch_hook);
	snprintf(id.internal, sizeof id.internal, "mock:ok:hooktest:%d", (int)getpid());
	struct stream s[2] = {{.device = 0}, {.device = 1}};

	ncclComm_t none = NULL;
	ncclResult_t rc = ncclCommInitRank(&none, 1, id, 0);
	CHECK(rc == 1 && strstr(ncclGetLastError(NULL), "no current CUDA device on the calling thread"),
	      "init without a device: %d %s", rc, ncclGetLastError(NULL));

	on_both_ranks(init_rank);
	CHECK(init_rc[0] == 0 && init_rc[1] == 0, "init: %d %d", init_rc[0], init_rc[1]);
	if (failures) return 1;

	/* Stream order: the second all-reduce reads what the first writes. */
	for (int r = 0; r < 2; r++)
		for (int i = 0; i < N; i++) a[r][i] = (float)((r + 1) * 1000 + i % 997);
	for (int r = 0; r < 2; r++) {
		rc = ncclAllReduce(a[r], b[r], N, FLOAT32, SUM, comm[r], &s[r]);
		CHECK(rc == 0, "first AllReduce on rank %d: %d %s", r, rc, ncclGetLastError(comm[r]));
		rc = ncclAllReduce(b[r], c[r], N, FLOAT32, SUM, comm[r], &s[r]);
		CHECK(rc == 0, "second AllReduce on rank %d: %d %s", r, rc, ncclGetLastError(comm[r]));
		CHECK(s[r].n == 2 && b[r][0] == 0 && c[r][0] == 0, "rank %d: %d queued, b[0] %g c[0] %g before the stream ran", r,
		      s[r].n, b[r][0], c[r][0]);
	}
	rc = ncclAllReduce(a[0], b[0], N, FLOAT32, SUM, comm[0], &s[1]);
	CHECK(rc == 5 && strstr(ncclGetLastError(comm[0]), "is not on device 0"), "launch refused: %d %s", rc,
	      ncclGetLastError(comm[0]));
	drain_both(s);
	for (int r = 0; r < 2; r++)
		for (int i = 0; i < N; i++) {
			float want = 2 * (a[0][i] + a[1][i]);
			if (c[r][i] != want) {
				CHECK(0, "rank %d: c[%d] = %g, want %g", r, i, c[r][i], want);
				break;
			}
		}

	/* A group: one unit per communicator. */
	ncclGroupStart();
	for (int r = 0; r < 2; r++) {
		ncclSend(a[r], N, FLOAT32, 1 - r, comm[r], &s[r]);
		ncclRecv(d[r], N, FLOAT32, 1 - r, comm[r], &s[r]);
	}
	rc = ncclGroupEnd();
	CHECK(rc == 0 && s[0].n == 1 && s[1].n == 1, "group: %d, %d and %d queued", rc, s[0].n, s[1].n);
	drain_both(s);
	CHECK(memcmp(d[0], a[1], sizeof a[1]) == 0 && memcmp(d[1], a[0], sizeof a[0]) == 0, "send/recv: wrong data");

	/* A split's communicator is on its parent's device. */
	on_both_ranks(split_rank);
	CHECK(split_rc[0] == 0 && split_rc[1] == 0 && child[0] && child[1], "split: %d %d", split_rc[0], split_rc[1]);
	rc = ncclAllReduce(a[1], b[1], N, FLOAT32, SUM, child[1], &s[0]);
	CHECK(rc == 5 && strstr(ncclGetLastError(child[1]), "is not on device 1"), "split's device: %d %s", rc,
	      ncclGetLastError(child[1]));

	/* Calls that disagree fail while they run: an asynchronous error. */
	ncclAllReduce(a[0], b[0], 4, FLOAT32, SUM, comm[0], &s[0]);
	ncclAllReduce(a[1], b[1], 5, FLOAT32, SUM, comm[1], &s[1]);
	drain_both(s);
	for (int r = 0; r < 2; r++) {
		ncclResult_t async = 0;
		ncclCommGetAsyncError(comm[r], &async);
		CHECK(async == 5 && strstr(ncclGetLastError(comm[r]), "ranks disagree"), "rank %d: async %d %s", r, async,
		      ncclGetLastError(comm[r]));
	}

	/* Work that runs after its communicator's abort fails at once. */
	rc = ncclAllReduce(a[0], b[0], N, FLOAT32, SUM, child[0], &s[0]);
	ncclCommAbort(child[0]);
	drain(&s[0]);
	ncclResult_t async = 0;
	ncclCommGetAsyncError(child[0], &async);
	CHECK(rc == 0 && async != 0 && strstr(ncclGetLastError(child[0]), "aborted"), "abort: %d, async %d %s", rc, async,
	      ncclGetLastError(child[0]));

	ncclCommDestroy(child[1]);
	ncclCommDestroy(comm[0]);
	ncclCommDestroy(comm[1]);
	if (failures) return 1;
	printf("PASS\n");
	return 0;
}
