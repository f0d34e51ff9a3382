/*
 * mock.h — the declarations the files of the MOCK libnccl.so.2 share (a test
 * fixture; see mocknccl.c for what it is and its protocol). Everything here
 * is hidden: the library exports only NCCL's functions and the gcmock_ hooks.
 */
#ifndef GCMOCK_H
#define GCMOCK_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef enum { ncclSuccess = 0, ncclUnhandledCudaError = 1, ncclSystemError = 2, ncclInternalError = 3,
	       ncclInvalidArgument = 4, ncclInvalidUsage = 5, ncclRemoteError = 6, ncclInProgress = 7 } ncclResult_t;
typedef enum { ncclInt8 = 0, ncclUint8 = 1, ncclInt32 = 2, ncclUint32 = 3, ncclInt64 = 4, ncclUint64 = 5,
	       ncclFloat16 = 6, ncclFloat32 = 7, ncclFloat64 = 8, ncclBfloat16 = 9 } ncclDataType_t;
typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 } ncclRedOp_t;
typedef struct { char internal[128]; } ncclUniqueId;
typedef struct mock_comm* ncclComm_t;
typedef void* cudaStream_t;

#pragma GCC visibility push(hidden)

enum mode { MODE_OK, MODE_HANG, MODE_STUCK, MODE_ASYNC, MODE_FAIL };
enum kind { K_ALLREDUCE = 1, K_ALLGATHER, K_REDUCESCATTER, K_BROADCAST, K_SPLIT, K_SEND, K_RECV };
extern const char* const kind_names[];

#define MAXRANKS 64

/* MOCK_STAGE_BYTES is the size of each rank's staging area for collectives,
 * and again for sends (split evenly among its peers): larger buffers cross
 * the world in chunks of it. Tests build with a small one to exercise the
 * chunking on small buffers. */
#ifndef MOCK_STAGE_BYTES
#define MOCK_STAGE_BYTES (1 << 20)
#endif
_Static_assert(MOCK_STAGE_BYTES >= 64 * MAXRANKS, "MOCK_STAGE_BYTES must hold 64 bytes per peer");

/* slot is what one rank called, as its peers see it. */
struct slot { int kind; size_t count; int dtype, op, root; };

/* box is the mailbox of one (sender, receiver) pair: one chunk at a time,
 * in the sender's staging area for that peer. */
struct box {
	size_t total, len; /* the send's bytes in all, and in this chunk */
	int full;          /* a chunk waits for the receiver */
	size_t rejected;   /* nonzero: the receiver expected rejected-1 bytes instead */
};

#define WORLD_READY 0x6763776du /* "gcwm": the creator has initialised the world */

/* world is the start of a world's shared-memory segment; nranks² boxes and
 * then each rank's two staging areas follow it (world_box, world_stage,
 * world_p2p). */
struct world {
	uint32_t ready; /* WORLD_READY once everything below is initialised */
	int nranks;
	enum mode mode;
	uint64_t hash;       /* of the unique id: names the segment */
	size_t size;         /* bytes of the whole segment */
	pthread_mutex_t mu;  /* process-shared and robust; guards everything below */
	pthread_cond_t cv;   /* process-shared; broadcast on every change */
	int joined;          /* ranks that have joined, ever */
	int live;            /* joined communicators not yet destroyed or aborted */
	int linked;          /* the segment's name still exists */
	int broken;          /* a rank aborted, or died holding mu */
	pid_t pid[MAXRANKS]; /* each joined rank's process */
	unsigned long bgen;  /* barrier generation */
	int bcount;          /* ranks in the current barrier */
	struct slot slots[MAXRANKS];
	struct { int color, key; } split[MAXRANKS];
};

/* mapping is one communicator's mapping of its world's segment, unmapped
 * when the last reference goes (the communicator's own, and one per call
 * that uses it). refs is guarded by maps_mu. */
struct mapping {
	struct world* w;
	int refs;
};

/* mock_comm is one rank's communicator. It is never freed: a blocked or
 * launched call may hold it after ncclCommDestroy or ncclCommAbort. */
struct mock_comm {
	struct mapping* m; /* NULL before it joins and once it leaves; guarded by maps_mu */
	int rank, nranks, device;
	enum mode mode;
	uint64_t hash;         /* its world's */
	unsigned long splits;  /* ncclCommSplit calls so far: names the children */
	int aborted;           /* atomic; set under maps_mu */
	int async;             /* atomic: the first error of a launched operation */
	pthread_mutex_t run_mu; /* one operation at a time on the world */
	pthread_mutex_t pend_mu;
	pthread_cond_t pend_cv;
	int pending; /* launched units not yet finished; guarded by pend_mu */
	char last[256];
};

extern pthread_mutex_t maps_mu;
extern __thread char thread_last[256];

/* mock_fail records a last-error message (per communicator, and per thread) and returns r. */
ncclResult_t mock_fail(struct mock_comm* c, ncclResult_t r, const char* fmt, ...) __attribute__((format(printf, 3, 4)));

/* ---- world.c: worlds in shared memory ---- */

uint64_t mock_hash(const void* p, size_t n, uint64_t h);
#define MOCK_HASH_SEED 0xcbf29ce484222325ull /* FNV-1a 64's offset basis */

enum { JOIN_CREATE = 1, JOIN_WAIT = 2 };
ncclResult_t world_join(struct mock_comm* c, const char* fn, int flags);
ncclResult_t world_make(uint64_t hash, int nranks, enum mode mode, const char* fn, struct mock_comm* blame);
void world_unlink(uint64_t hash);
void world_leave(struct mock_comm* c, int abort);
struct mapping* map_get(struct mock_comm* c);
void map_put(struct mapping* m);
void world_lock(struct world* w);
void world_wait(struct world* w);
void world_unlock(struct world* w);
int barrier(struct mock_comm* c, struct world* w);
struct box* world_box(struct world* w, int from, int to);
char* world_stage(struct world* w, int rank);
char* world_p2p(struct world* w, int from, int to);
size_t p2p_chunk(int nranks);

/* ---- transfer.c: data through the staging areas ---- */

/* op is one queued collective or point-to-point call. */
struct op {
	int kind;
	const void* send;
	void* recv;
	size_t count;
	int dtype, redop, root; /* root: the peer of a send or receive */
	void* stream;
};

size_t dtype_size(int dtype);
int reducible(int dtype);
/* aborted_error is the failure of fn on c when c was aborted, or a peer broke the world. */
ncclResult_t aborted_error(struct mock_comm* c, const char* fn);
ncclResult_t run_collective(struct mock_comm* c, struct world* w, const struct op* o);
ncclResult_t run_p2p(struct mock_comm* c, struct world* w, const struct op* const* ops, int n);

#pragma GCC visibility pop

#endif
