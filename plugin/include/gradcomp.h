/*
 * gradcomp.h — the C ABI of libgradcomp.so (CPU) and libgradcomp_cuda.so.
 *
 * A thin, versioned interface over gradcomp's compressors (compress/) and
 * its cost model (overlap/). Every function returns a gc_status; on anything
 * but GC_OK, gc_last_error() gives a message saying what failed and where.
 * Handles are opaque 64-bit values; 0 is never a valid handle. Every
 * function may be called from several threads at once; calls on one handle
 * for different buckets run concurrently, calls for the same bucket are
 * serialized (but see GC_DEFER). A Go panic never crosses into C: it becomes
 * GC_ERR_INTERNAL.
 *
 * Lengths are element counts (float32) or byte counts (payloads, state), as
 * each parameter says. Pointers are host memory, except the gc_devptr
 * arguments of the *_device calls (since ABI 1.2), which are CUDA device
 * addresses. A pointer may be NULL only where its length is 0; output
 * pointers never. The library keeps no pointer it was given after the call
 * returns.
 *
 * Both libraries export every function. In libgradcomp.so (no CUDA) the
 * device calls check their arguments and then return GC_ERR_NOCUDA;
 * libgradcomp_cuda.so links libcuda.so.1 and runs them on the GPU.
 */
#ifndef GRADCOMP_H
#define GRADCOMP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The ABI this header describes. A library whose gc_abi_version() differs
 * in GRADCOMP_ABI_MAJOR is not compatible with this header. */
#define GRADCOMP_ABI_MAJOR 2
#define GRADCOMP_ABI_MINOR 11
#define GRADCOMP_ABI_VERSION ((GRADCOMP_ABI_MAJOR << 16) | GRADCOMP_ABI_MINOR)

typedef enum gc_status {
	GC_OK = 0,
	GC_ERR_INVALID = 1,    /* a null pointer, a negative or absurd size, a bad flag */
	GC_ERR_SPEC = 2,       /* the compressor spec string is not accepted */
	GC_ERR_HANDLE = 3,     /* an unknown or already destroyed handle */
	GC_ERR_SIZE = 4,       /* a buffer too small, or lengths that do not match */
	GC_ERR_CORRUPT = 5,    /* a payload or state that fails validation */
	GC_ERR_NONFINITE = 6,  /* NaN or Inf in a gradient: nothing was written */
	GC_ERR_MISMATCH = 7,   /* a payload from another codec, spec or length */
	GC_ERR_STATE = 8,      /* a call out of order (e.g. commit with nothing pending) */
	GC_ERR_INTERNAL = 9,   /* a bug in gradcomp: please report the message */
	GC_ERR_NOCUDA = 10,    /* since 1.2: a device call to libgradcomp.so: load libgradcomp_cuda.so */
	GC_ERR_NODEVICE = 11,  /* since 1.2: the CUDA driver cannot initialize or sees no such device */
	GC_ERR_CUDA = 12,      /* since 1.2: a CUDA driver call failed (the message names it) */
	GC_ERR_TIMEOUT = 13,   /* since 2.0: gc_hosted_take found nothing posted in time (not a failure) */
	GC_ERR_CLOSED = 14,    /* since 2.0: the hosted transport or engine is closed */
	GC_ERR_COMM = 15,      /* since 2.0: a collective failed or did not finish in time (host error, dead peer): the engine is broken */
	GC_ERR_CONFIG = 16,    /* since 2.0: the ranks' engine configurations differ, or one rank's is invalid (the message names both sides) */
	GC_ERR_BROKEN = 17,    /* since 2.0: an earlier step failed; destroy the engine and its transport */
	GC_ERR_NOMEM = 18,     /* since 2.3: the host memory an engine would need is more than the machine can give
	                        * (the message says how much of what); nothing was allocated */
	GC_ERR_NCCL = 19       /* since 2.9: libnccl.so.2 did not load, or an NCCL call failed (the message names it) */
} gc_status;

typedef uint64_t gc_compressor;

/* GRADCOMP_ABI_VERSION of the loaded library. */
uint32_t gc_abi_version(void);

/* The library's version string (static storage, e.g. "0.1.0"). */
const char *gc_version(void);

/* The message of the calling thread's last failed call, or "" if it has
 * had none (static per-thread storage, at most 1023 bytes plus the NUL,
 * valid until that thread's next failed call; a successful call leaves it
 * as it was). */
const char *gc_last_error(void);

/* Creates a compressor from a spec such as "topk:0.01" or "int8" (see the
 * README's codec table); workers ≤ 0 means all CPUs. The compressor owns
 * error-feedback memory, one residual per bucket id. The library's threads
 * are capped at the largest workers > 0 that a compressor or engine was
 * created with, until one is created with workers ≤ 0 (GOMAXPROCS in the
 * environment overrides both). */
gc_status gc_compressor_create(const char *spec, int workers, gc_compressor *out);

/* Destroys h and its error-feedback memory (deferred compresses not settled
 * are dropped). A second destroy is GC_ERR_HANDLE; handle values are never
 * reused. */
gc_status gc_compressor_destroy(gc_compressor h);

/* How many compressors are live (created and not destroyed), for leak
 * checks. Since ABI 1.1. */
gc_status gc_live_handles(size_t *out);

/* Copies h's canonical spec, NUL-terminated, into buf; *len gets its length
 * without the NUL (also when cap is too small, which is GC_ERR_SIZE). */
gc_status gc_compressor_spec(gc_compressor h, char *buf, size_t cap, size_t *len);

/* Since 2.8: copies the canonical form of spec (any spec the engine takes,
 * "powersgd:R" included, which no compressor takes), NUL-terminated, into
 * buf, as gc_compressor_spec does; a spec that does not parse is
 * GC_ERR_SPEC. Equivalent specs have the same canonical form. */
gc_status gc_spec_canonical(const char *spec, char *buf, size_t cap, size_t *len);

/* The largest payload, in bytes, that compressing n elements can produce. */
gc_status gc_max_encoded_len(gc_compressor h, size_t n, size_t *out);

/* Flags of gc_compress. */
#define GC_FEEDBACK 1u /* fold the bucket's residual in (e ← e + g; c ← C(e); e ← e − D(c)) */
#define GC_DEFER 2u    /* with GC_FEEDBACK: stage the new residual until gc_settle */

/* Compresses grad[0..n) for (bucket, step) into dst (cap bytes, at least
 * gc_max_encoded_len(n), else GC_ERR_SIZE); *written gets the payload's
 * length. With GC_FEEDBACK the bucket's residual is used and updated (a
 * bucket's first call fixes its length; another n is GC_ERR_SIZE); with
 * GC_DEFER as well, the update waits for gc_settle and the bucket is held
 * until then: a GC_FEEDBACK call that finds the bucket held is GC_ERR_STATE
 * rather than a wait. On any error *written is 0, the residual is untouched and
 * dst's bytes are unspecified (a NaN or Inf is GC_ERR_NONFINITE). */
gc_status gc_compress(gc_compressor h, uint64_t bucket, uint64_t step, uint32_t flags,
                      const float *grad, size_t n, uint8_t *dst, size_t cap, size_t *written);

/* How a deferred compress of a bucket is settled. */
typedef enum gc_settle_mode {
	GC_COMMIT = 0,  /* the payload was delivered: e ← s − D(c) */
	GC_RETAIN = 1,  /* nothing was delivered: e ← s (the whole sum waits for the next step) */
	GC_DISCARD = 2  /* the gradient was sent another way (dense): e unchanged */
} gc_settle_mode;

/* Settles the deferred compress of bucket; GC_ERR_STATE if it has none. */
gc_status gc_settle(gc_compressor h, uint64_t bucket, gc_settle_mode mode);

/* The length in bytes of the payload at the start of buf (len readable
 * bytes, at least the 56-byte header), so payloads can travel in padded,
 * fixed-size slots. Only the header's magic and version are checked;
 * a payload that would extend past len is GC_ERR_CORRUPT. */
gc_status gc_payload_len(const uint8_t *buf, size_t len, size_t *out);

/* Decodes payload[0..len) into dst[0..n) (dst = D(c)), or adds it (dst += D(c)).
 * The payload must come from a compressor with h's spec and n elements, and
 * len must be its exact length (from a padded slot, pass gc_payload_len's).
 * Everything is validated before dst is written: on error dst is untouched. */
gc_status gc_decompress(gc_compressor h, const uint8_t *payload, size_t len, float *dst, size_t n);
gc_status gc_decompress_add(gc_compressor h, const uint8_t *payload, size_t len, float *dst, size_t n);

/* Error-feedback memory as bytes (versioned, checksummed): *len gets the size
 * gc_state_save needs; save writes it (if cap is too small: GC_ERR_SIZE,
 * with *written set to the size needed, which may have grown since
 * gc_state_size if other threads compressed new buckets); load replaces h's
 * memory with a saved one, src[0..len) exactly, validated whole first (on
 * error h's memory is unchanged). All three are GC_ERR_STATE while a
 * deferred compress of h is not settled. */
gc_status gc_state_size(gc_compressor h, size_t *len);
gc_status gc_state_save(gc_compressor h, uint8_t *dst, size_t cap, size_t *written);
gc_status gc_state_load(gc_compressor h, const uint8_t *src, size_t len);

/* The cost model's decision for one bucket of n elements exchanged among
 * world ranks with strategy ("auto", "sparse-gather", "allgather", "sra",
 * "shared-index", "dense": overlap.ParseStrategy's names; "allgather" is an
 * all-gather of whole payloads, what the Python hook does) over a link of
 * the given bandwidth (bytes/s, > 0; INFINITY for a link whose transfer
 * time is negligible) and latency (seconds per collective, 0 to 3600):
 * *compress is 1 when the compressed exchange is predicted at least 20%
 * faster than a dense fp32 all-reduce, 0 otherwise; the two predictions
 * (seconds, what overlap with neighbouring buckets does not hide) are
 * returned when the pointers are not null (overlap.Predict). The
 * compressed path's compute (encode, decode, with error feedback) is timed
 * on this host on first use of each (spec, strategy, world) and kept for
 * the process's life: that first call takes up to a few hundred
 * milliseconds, later ones microseconds. n outside 1 to 2^32−1, world
 * outside 1 to 1024, and a strategy that cannot carry h's codec are
 * GC_ERR_INVALID. */
gc_status gc_decide(gc_compressor h, const char *strategy, size_t n, int world,
                    double bandwidth, double latency,
                    int *compress, double *dense_seconds, double *compressed_seconds);

/* ---- Device calls (ABI 1.2) ----
 *
 * A gc_devptr is a CUDA device address (a CUdeviceptr, e.g. a tensor's
 * data_ptr()) and a gc_stream a CUstream (e.g. torch.cuda.current_stream()
 * .cuda_stream; 0 is the legacy default stream). Every device buffer must
 * be device (or managed) memory of one device, 4-byte aligned, and lie
 * within its allocation (checked with cuPointerGetAttributes: a host
 * pointer is GC_ERR_INVALID, a length past the allocation's end
 * GC_ERR_SIZE). The work runs in that device's primary context (the one
 * the CUDA runtime and PyTorch use) and is ordered on the given stream,
 * which must belong to it. Specs with a lossless stage are GC_ERR_INVALID.
 * Payloads are byte-identical to gc_compress's on the same data, so host
 * and device ranks can exchange them. */
typedef uintptr_t gc_devptr;
typedef uintptr_t gc_stream;

/* What this library can do, as GC_FEATURE_* bits; it touches no device.
 * Since ABI 1.2. */
#define GC_FEATURE_CUDA 1u /* the device calls run: libgradcomp_cuda.so */
#define GC_FEATURE_FAKE_DEVICE 2u /* since 2.9: a TEST build (libgradcomp_fake.so): the engine's
                                   * "devices" are host memory and its kernels the CPU codecs (see docs/TESTING.md) */
uint32_t gc_features(void);

/* Device ordinal device: its name (NUL-terminated into name, name_cap
 * bytes, at most 256 needed; GC_ERR_SIZE if short), compute capability and
 * total memory in bytes. Opens the device's primary context and loads the
 * kernels on first use. GC_ERR_NODEVICE when the driver sees no such
 * device (no GPU, no kernel driver), GC_ERR_NOCUDA in libgradcomp.so. */
gc_status gc_device_info(int device, char *name, size_t name_cap, int *major, int *minor, uint64_t *memory_bytes);

/* gc_compress on the device: compresses grad[0..n) (device float32) for
 * (bucket, step) into dst (device, cap bytes, at least gc_max_encoded_len
 * (n)); *written gets the payload's length. Flags, error feedback and
 * GC_DEFER/gc_settle as gc_compress, with the bucket's residual in device
 * memory (a bucket is either a host or a device bucket; a host residual,
 * e.g. from gc_state_load, moves to the device on its first call here, and
 * a later gc_compress with GC_FEEDBACK on it is GC_ERR_STATE). It WAITS for
 * the stream: the kernels are enqueued on it, then the host waits for them
 * to read the NaN/Inf status and to checksum the body, and the header and
 * checksum are copied into dst (ordered on the stream, done when the call
 * returns but for their host-to-device copy). On any error *written is 0
 * and the residual is untouched; a NaN or Inf is GC_ERR_NONFINITE. */
gc_status gc_compress_device(gc_compressor h, uint64_t bucket, uint64_t step, uint32_t flags,
                             gc_devptr grad, size_t n, gc_devptr dst, size_t cap, gc_stream stream,
                             size_t *written);

/* gc_decompress / gc_decompress_add on the device: payload[0..len) (device;
 * len its exact length) into dst[0..n) (device float32). The payload is
 * copied to the host and validated whole (waiting for the stream) before
 * the decode is enqueued on the stream; the call returns without waiting
 * for the decode. On a validation error dst is untouched. */
gc_status gc_decompress_device(gc_compressor h, gc_devptr payload, size_t len, gc_devptr dst, size_t n,
                               gc_stream stream);
gc_status gc_decompress_add_device(gc_compressor h, gc_devptr payload, size_t len, gc_devptr dst, size_t n,
                                   gc_stream stream);

/* Decodes count payloads, one at the start of each slot of slot_len bytes
 * (a multiple of 4) from slots (device; e.g. an all-gather's output of
 * padded payloads, each's length read from its header), and sets dst (add =
 * 0) or adds to it (add = 1) their sum in slot order: the result equals
 * gc_decompress of slot 0 followed by gc_decompress_add of the others, bit
 * for bit; quantized codes are summed 8 payloads per pass over dst. Waits
 * for the stream to validate every payload on the host first (an error
 * names the slot; dst is then untouched), enqueues the decode and returns
 * without waiting for it. count is 1 to 65536. */
gc_status gc_decompress_slots_device(gc_compressor h, gc_devptr slots, size_t slot_len, size_t count,
                                     gc_devptr dst, size_t n, int add, gc_stream stream);

/* ---- Engines (ABI 2.0) ----
 *
 * A gc_engine is gradcomp's engine (overlap.Engine, or overlap.DeviceEngine
 * in libgradcomp_cuda.so): per step, gc_engine_step, then gc_engine_ready
 * for each bucket as backward produces it (any order), then
 * gc_engine_wait, after which every bucket holds the rank average. The
 * engine compresses each bucket with error feedback, exchanges it with its
 * strategy (dense all-reduce, shared-index, sparse-gather, SRA), decides
 * per bucket with its cost model and verifies the decision online, exactly
 * as for Go callers: every front end drives this one engine.
 *
 * Its collectives travel over a hosted transport (gc_hosted): the engine
 * POSTS each collective, in the same order on every rank, and the host
 * program carries it out with its own communicator (torch.distributed,
 * MPI, NCCL, ...) and completes it. The host takes posts from a thread of
 * its own (gc_hosted_take blocks, with a timeout, holding nothing the
 * caller needs); gc_engine_create and gc_engine_wait block until the posts
 * they depend on are completed. Up to 4 posts per group may be outstanding
 * (posted, not completed) at once: the host may take the next post before
 * it completes the previous one, as long as it launches them on its
 * communicator in take order, and may complete them in any order as they
 * finish (e.g. torch's async_op=True Works); carrying out one post at a
 * time is correct too, only not concurrent. A post nobody takes, a
 * completion with an error, a wrong length or an unknown id ends the step
 * with GC_ERR_COMM on that rank within the engine's timeout (the group's
 * other outstanding posts fail with it); nothing waits forever.
 */
typedef uint64_t gc_hosted;
typedef uint64_t gc_engine;

/* Collectives a hosted transport posts (gc_op.kind). With N ranks, n =
 * gc_op.count and r this rank:
 *   GC_OP_ALLREDUCE      buf: n float32, in place; every rank gets the
 *                        element-wise sum over ranks (send == recv).
 *   GC_OP_ALLGATHER      send: n bytes; recv: N·n bytes, rank q's send at
 *                        [q·n, (q+1)·n).
 *   GC_OP_REDUCESCATTER  send: N·n float32; recv: n float32, chunk r of
 *                        the sum.
 *   GC_OP_ALLTOALL       send and recv: n bytes (a multiple of N); chunk j
 *                        of send goes to rank j, chunk q of recv comes
 *                        from rank q.
 *   GC_OP_BROADCAST      buf: n bytes in place (send == recv); root's
 *                        bytes on every rank.
 *   GC_OP_BARRIER        no buffers.
 * Buffers are host memory, or, when device is 1, device memory: then the
 * collective is to be enqueued on stream (a CUstream; NCCL on
 * torch.cuda.ExternalStream) and completed once enqueued. Buffers stay
 * valid until the op is completed or the transport destroyed; the host
 * must not touch them after completing. */
typedef enum gc_op_kind {
	GC_OP_ALLREDUCE = 1,
	GC_OP_ALLGATHER = 2,
	GC_OP_REDUCESCATTER = 3,
	GC_OP_ALLTOALL = 4,
	GC_OP_BROADCAST = 5,
	GC_OP_BARRIER = 6
} gc_op_kind;

/* Groups of a hosted transport (gc_op.group; since 2.4). An engine with
 * strategy "hier" (gc_engine_config's topology set) splits its ranks by
 * node: besides the transport's own ranks (GC_GROUP_WORLD), it posts
 * collectives on this rank's node group (GC_GROUP_NODE: the local_size
 * ranks of its node, ranked by local_rank) and on its cross-node group
 * (GC_GROUP_CROSS: the nodes ranks with its local_rank, one per node,
 * ranked by node). N, r and root in gc_op_kind's table are then the
 * group's size, this rank's rank in it and a rank of the group. Each group
 * has its own order and its own collectives in flight, and the engine runs
 * the node and cross-node collectives AT ONCE: the host must carry out
 * each group's posts in their order, on a communicator of that group's
 * ranks, independently of the other groups' (a thread per group taking
 * with gc_hosted_take_group; one thread carrying out gc_hosted_take's
 * posts one after another would deadlock). Without a topology every post
 * is GC_GROUP_WORLD's. */
#define GC_GROUP_WORLD 0
#define GC_GROUP_NODE 1
#define GC_GROUP_CROSS 2

typedef struct gc_op {
	uint64_t id;         /* the post's number on this transport, from 1 (unique across its groups) */
	int32_t kind;        /* gc_op_kind */
	int32_t root;        /* GC_OP_BROADCAST's root rank (in the op's group) */
	int32_t device;      /* 1: send, recv are device pointers on stream */
	union {
		int32_t group;    /* since 2.4: GC_GROUP_*, the group whose ranks carry the op out */
		int32_t reserved; /* before 2.4: 0 (the same field; GC_GROUP_WORLD) */
	};
	uint64_t count;      /* n above: elements (float32 ops) or bytes */
	uintptr_t send;      /* address of the input (== recv for in-place ops) */
	uintptr_t recv;      /* address of the output */
	uint64_t send_bytes; /* the input's length in bytes */
	uint64_t recv_bytes; /* the output's length in bytes */
	uintptr_t stream;    /* device ops: the CUstream to enqueue on */
} gc_op;

/* Creates rank `rank`'s end of a hosted transport of `size` ranks (1 to
 * 65535). */
gc_status gc_hosted_create(int rank, int size, gc_hosted *out);

/* Destroys h: posts not yet taken fail (their engine's step ends with
 * GC_ERR_COMM), takes waiting or later return GC_ERR_CLOSED, and ops taken
 * but not completed are abandoned (their buffers become invalid). Destroy
 * the engines using h first, or after. A second destroy is GC_ERR_HANDLE. */
gc_status gc_hosted_destroy(gc_hosted h);

/* Waits up to timeout_seconds (0: no wait) for the next post and fills
 * *op: GC_OK, or GC_ERR_TIMEOUT when nothing was posted in time (call
 * again), or GC_ERR_CLOSED once h is destroyed. Posts come out in the
 * order the engine made them, which is the same on every rank: carry them
 * out in that order. With a "hier" engine it returns every group's posts
 * (op->group says which; see GC_GROUP_WORLD): hand each to that group's
 * own thread, or use gc_hosted_take_group. */
gc_status gc_hosted_take(gc_hosted h, double timeout_seconds, gc_op *op);

/* gc_hosted_take of group's posts alone (GC_GROUP_WORLD, GC_GROUP_NODE,
 * GC_GROUP_CROSS; since 2.4): the host of a "hier" engine runs one thread
 * per group, each taking that group's posts and carrying them out, in
 * order, on its communicator of the group. A group that does not exist
 * yet (no "hier" engine, or between two) has no posts: GC_ERR_TIMEOUT.
 * Another group is GC_ERR_INVALID; GC_ERR_CLOSED once h is destroyed. */
gc_status gc_hosted_take_group(gc_hosted h, int group, double timeout_seconds, gc_op *op);

/* Since 2.7: the host's alternative to a thread in gc_hosted_take.
 * gc_hosted_set_launcher(h, group, fn, ctx) has every later post of group
 * (GC_GROUP_WORLD, GC_GROUP_NODE, GC_GROUP_CROSS) handed to fn(ctx, op)
 * as the engine makes it, instead of queued for gc_hosted_take: on the
 * engine's thread that posts it (not one of the host's), one post at a
 * time, in the group's post order (the order gc_hosted_take would give).
 * The op is taken when fn gets it; *op is valid during the call only (its
 * buffers until the op's completion). fn must start the collective on
 * the host's communicator and return without waiting for it to finish
 * (torch's async_op=True, an NCCL call on a stream): the engine's next
 * post waits for fn to return. Complete the op with gc_hosted_complete as
 * usual, from any thread, fn itself included (a launch that failed). fn
 * must call no other gradcomp function. It spares the host a thread
 * waiting in gc_hosted_take and the wake-up of that thread at every post.
 * fn NULL goes back to gc_hosted_take for later posts; posts already
 * queued stay for it. A group that does not exist yet may be given one
 * (a "hier" engine's node and cross groups). Another group is
 * GC_ERR_INVALID. */
typedef void (*gc_launch_fn)(void *ctx, const gc_op *op);
gc_status gc_hosted_set_launcher(gc_hosted h, int group, gc_launch_fn fn, void *ctx);

/* Completes the taken op id: status GC_OK with recv_bytes the bytes the
 * host wrote to its output (op.recv_bytes; 0 for a barrier), or any other
 * status with message (may be NULL) saying what failed in the host's
 * communicator; the engine's step then fails with GC_ERR_COMM and that
 * message. An id not taken, already completed, or a wrong recv_bytes is
 * GC_ERR_STATE here and fails the transport (the engine's step ends with
 * GC_ERR_COMM); a recv_bytes above 2^47, which no op has, is
 * GC_ERR_INVALID and fails the op at once just the same. */
gc_status gc_hosted_complete(gc_hosted h, uint64_t id, int status, const char *message, uint64_t recv_bytes);

/* An engine's configuration. Set size to sizeof(gc_engine_config) (later
 * versions append fields). Every field but timeout_seconds, workers,
 * device and this rank's place (node, local_rank) must be equal on every
 * rank (the handshake checks them and the bucket layout). */
typedef struct gc_engine_config {
	uint32_t size;             /* sizeof(gc_engine_config) of the caller's header: 136 since 2.11; an older
	                            * ABI's size (56, 72, 88, 104, 112, 128) means the fields after it are 0. Any
	                            * other size (a newer header's, whose fields this library cannot read, or
	                            * garbage) is refused, naming both sizes, before a byte past the first
	                            * four is read (since 2.10; GC_ERR_CONFIG from gc_engine_create,
	                            * gc_engine_create_nccl and gc_engine_state_check). */
	int32_t error_feedback;    /* 1: error-feedback memory on the compressed path */
	const char *spec;          /* compressor spec, e.g. "topk:0.01"; no lossless stage */
	const char *strategy;      /* "auto" (or NULL), "dense", "shared-index", "sparse-gather", "sra", "allgather",
	                            * "hier" (since 2.4 through the C ABI: needs the topology, below), "low-rank"
	                            * (since 2.7: spec "powersgd:R"; needs the shapes, below) */
	const char *decision;      /* "auto" (or NULL): the cost model, verified online; "compressed", "dense": pinned */
	int32_t fail_on_nonfinite; /* 0: a bucket with NaN/Inf on any rank goes dense that step; 1: the step fails (GC_ERR_NONFINITE) */
	int32_t warmup;            /* steps numbered below it exchange every bucket dense */
	double timeout_seconds;    /* per collective; 0: 60 s */
	int32_t workers;           /* compressor threads, and the cap on the library's (gc_compressor_create); 0: all CPUs */
	int32_t device;            /* libgradcomp_cuda.so: -1 host buckets; ≥ 0 the CUDA device of the buckets */
	double momentum;           /* since 2.1: momentum correction, the optimizer's momentum in [0, 1) (0: off;
	                            * host and device buckets): each bucket becomes u = m·u + g before its exchange, so
	                            * run the optimizer without momentum. (2.1 always masked, see
	                            * momentum_masking.) A 2.0 caller's size (56) means 0. */
	const char *schedule;      /* since 2.1: compression warm-up, "STEPS@SPEC[,STEPS@SPEC...]" after warmup
	                            * (e.g. "100@topk:0.25,100@topk:0.0625"), then spec; NULL or "": none. The phases
	                            * keep spec's strategy (decision "auto": the cost model decides for spec, and
	                            * verification starts after the last phase); host and device buckets. */
	double guard;              /* since 2.2: the accuracy guard's threshold (0: off; needs error_feedback;
	                            * host and device buckets): a bucket whose error feedback holds back more than guard times the
	                            * norm of its gradient, on some rank, goes dense with its residual on its next
	                            * compressed step, emptying the memory (gc_bucket_stats.guarded, the reason,
	                            * gc_engine_held_back and gc_engine_verdict report it). A 2.0 or 2.1 caller's size (56, 72) means 0. */
	int32_t momentum_masking;  /* since 2.2: 1: DGC's momentum factor masking (needs momentum): top-k/random-k
	                            * zero u where they sent. 0 (and before 2.2): u is never masked. */
	/* Since 2.4: this rank's place among the machines of the job: node `node` of `nodes`, local rank
	 * `local_rank` of the `local_size` ranks of that node; all four 0: unknown (flat; and before 2.4).
	 * Strategy "hier" needs it: a reduce-scatter among the ranks of each node (GC_GROUP_NODE), each rank's
	 * shard (1/local_size of the bucket, its node's average) exchanged across nodes with the configured
	 * codec, error feedback and momentum, among the ranks of its local rank (GC_GROUP_CROSS), then an
	 * all-gather in the node. Every node must hold local_size ranks (nodes × local_size = the transport's
	 * size); nodes are numbered in the order of their lowest rank and local ranks in rank order within a
	 * node. A rank whose place is out of range, or "hier" without one, is GC_ERR_CONFIG on every rank;
	 * places that the ranks do not agree on (the engine all-gathers them after the handshake) are
	 * GC_ERR_CONFIG on every rank, naming the first rank at fault. The engine state records the layout
	 * and this rank's place, and gc_engine_state_load / gc_engine_state_check refuse another
	 * (GC_ERR_CORRUPT). Device engines run the sharded "hier" (every codec but top-k and random-k, whose
	 * "hier" is host buckets only). Other strategies ignore it. With strategy "auto" and a place on 2 nodes
	 * or more of 2 ranks or more, the engine times steps of the flat strategy and of "hier" at creation and
	 * keeps the faster (host buckets). */
	int32_t node;
	int32_t nodes;
	int32_t local_rank;
	int32_t local_size;
	const char *node_spec;     /* since 2.5: the codec of "hier"'s node stages (host buckets): NULL or "" for
	                            * float32, "bf16", "fp16" or "int8" (SDP4Bit's 8-bit inside a node): each stage's
	                            * parts quantized once, without error feedback. Needs strategy "hier" or "auto";
	                            * compared by the handshake. A 2.4 or older caller's size (104 or less) means float32. */
	/* Since 2.7: the shapes of each bucket's tensors, as matrices in the order they lie in the bucket
	 * (tensor j starts where tensor j−1 ends, and their elements add up to the bucket's): bucket i has
	 * tensor_counts[i] tensors, and shapes holds their (rows, cols) pairs, bucket 0's first. A 1-D tensor is
	 * 1×n, a convolution weight out×(in·kh·kw), as torch's PowerSGD views them. Spec "powersgd:R" (strategy
	 * "low-rank") needs them; the other strategies ignore them, but they are checked (GC_ERR_CONFIG) and
	 * the handshake compares them. Both NULL: none; one NULL is GC_ERR_CONFIG. A 2.6 or older caller's size
	 * (112) means none. */
	const uint64_t *tensor_counts;
	const uint64_t *shapes;
	double feedback_decay;     /* since 2.11: β, decayed error feedback (SparseLoCo's e ← β·e + g): a compressed
	                            * step keeps β times what its payload did not carry; in (0, 1], needs
	                            * error_feedback; 0 (and a 2.10 or older caller's size, 128 or less) means 1, no
	                            * decay. Host and device buckets; compared by the handshake and recorded in the
	                            * engine state (a state of another β is GC_ERR_CORRUPT). */
} gc_engine_config;

/* Creates an engine for nbuckets buckets of sizes[i] float32 elements over
 * transport t, and runs the handshake (and, with decision "auto", the cost
 * model's link probe and compressor timing) through t: it BLOCKS until
 * those posts are completed, so another thread must take them. A rank
 * whose configuration differs from another's gets GC_ERR_CONFIG naming the
 * field and both values, on every rank. A rank whose configuration is
 * invalid (cfg NULL or shorter than ABI 2.0's, a string that does not
 * parse, a value out of range, NULL or implausible sizes) still takes part
 * in the handshake to say so: every rank gets GC_ERR_CONFIG at once, naming
 * that rank and the setting (the rank waits for the others up to cfg's
 * timeout, or 60 s where it cannot be read). A rank whose device does not
 * open, or whose buffers would need more host memory than the machine can
 * give (checked before anything is allocated: at most 7/8 of MemAvailable
 * or of the container's memory cgroup, whichever is less), does the same
 * but returns its own status (GC_ERR_NOCUDA, GC_ERR_NODEVICE, GC_ERR_CUDA;
 * GC_ERR_NOMEM). Only a NULL out (GC_ERR_INVALID), an
 * unknown transport (GC_ERR_HANDLE) and a transport that already has an
 * engine (GC_ERR_STATE) fail without taking part: the other ranks then
 * wait until their timeout. One engine per transport. */
gc_status gc_engine_create(gc_hosted t, const gc_engine_config *cfg, const uint64_t *sizes, size_t nbuckets, gc_engine *out);

/* ---- The engine on its own NCCL communicator (since ABI 2.9) ----
 * For device buckets (cfg->device ≥ 0) the engine can own its NCCL
 * communicator: rank 0 makes a unique id with gc_nccl_unique_id, the host
 * spreads its GC_NCCL_UNIQUE_ID_BYTES bytes to every rank by any means
 * (torch.distributed's store, MPI, a file), and every rank calls
 * gc_engine_create_nccl with it. libnccl.so.2 is the copy the process has
 * already loaded (PyTorch's) if any, else $GRADCOMP_NCCL, else the
 * linker's search path. From then on no call of the engine needs the host:
 * buckets go gc_engine_step, gc_engine_ready_device, gc_engine_done,
 * gc_engine_wait, and the engine's own agreement (handshake, cost model,
 * verification, reshaped loads) runs over a split of the same
 * communicator, staged through small device buffers. Destroying the
 * engine destroys its communicators. */
#define GC_NCCL_UNIQUE_ID_BYTES 128

/* Writes a fresh NCCL unique id (ncclGetUniqueId) into id. GC_ERR_NCCL
 * when libnccl.so.2 does not load (the message lists where it looked) or
 * the call fails. */
gc_status gc_nccl_unique_id(uint8_t *id);

/* Joins rank (of size) to the NCCL communicator of id on CUDA device
 * cfg->device (made current on NCCL's init thread), then creates the
 * engine over it as gc_engine_create does over a transport, handshake and
 * cost model included, and BLOCKS until every rank has done the same. A
 * rank whose configuration is invalid joins and takes part in the
 * handshake to say so (GC_ERR_CONFIG on every rank). A rank whose device
 * or NCCL does not open cannot join: it returns its own status
 * (GC_ERR_NOCUDA, GC_ERR_NODEVICE, GC_ERR_CUDA, GC_ERR_NCCL) and the
 * others' initialisation ends with GC_ERR_COMM within cfg's timeout
 * (default 60 s). cfg->device < 0, rank outside [0, size) or an all-zero
 * id are GC_ERR_INVALID. Strategy "hier" splits the communicator by node
 * (ncclCommSplit, NCCL ≥ 2.18) as cfg's topology says. */
gc_status gc_engine_create_nccl(const uint8_t *id, int rank, int size, const gc_engine_config *cfg,
                                const uint64_t *sizes, size_t nbuckets, gc_engine *out);

/* Destroys e: a step in flight is abandoned (its memory as after a
 * failed step, see gc_engine_wait). The transport is not destroyed. */
gc_status gc_engine_destroy(gc_engine e);

/* Starts a step; GC_ERR_STATE while one is in flight. */
gc_status gc_engine_step(gc_engine e);

/* Hands bucket i's gradient (grad[0..n), host float32, n its size) to the
 * engine and returns at once; the engine owns grad until gc_engine_wait
 * returns, which leaves the rank average in it. An unknown or already
 * ready bucket, a wrong n, or no step: GC_ERR_STATE or GC_ERR_SIZE,
 * nothing taken. */
gc_status gc_engine_ready(gc_engine e, size_t bucket, float *grad, size_t n);

/* Since 2.6: *delegable = 1 when the caller may exchange bucket i of the
 * step in flight itself (gc_engine_delegate), else 0: the bucket goes
 * dense this step in a way a plain all-reduce of the average reproduces
 * (not compressed, no momentum, no fail_on_nonfinite, not "hier"); every
 * rank gets the same answer. Host engines; since 2.9 device engines too
 * (cfg.device ≥ 0), which also answer 0 in a step the online
 * verification (decision "auto") times: it times the dense path by
 * events on the engine's streams. */
gc_status gc_engine_delegable(gc_engine e, size_t bucket, int *delegable);

/* Since 2.6: takes bucket i, in place of gc_engine_ready, as exchanged by
 * the caller: the caller all-reduces the bucket's gradient into the rank
 * average with its own collective (e.g. a framework's native all-reduce
 * of its own buffer) and calls gc_engine_delegate_done when it has ended.
 * The engine makes no collective for it and leaves its error-feedback
 * memory as a dense step does; gc_engine_stats counts its ring all-reduce
 * bytes; gc_engine_wait waits for gc_engine_delegate_done (GC_ERR_COMM
 * when it does not come within the engine's timeout). A bucket that is
 * not delegable: GC_ERR_STATE, nothing taken.
 * Since 2.9 for a device engine too: the caller all-reduces the bucket's
 * device buffer on its own stream; the engine enqueues nothing for it
 * (gc_engine_done's event does not cover it: the caller orders its own
 * all-reduce), and gc_engine_wait does not wait for
 * gc_engine_delegate_done, which is optional there. */
gc_status gc_engine_delegate(gc_engine e, size_t bucket);

/* Since 2.6: the caller's all-reduce of delegated bucket i has ended; any
 * thread. GC_ERR_STATE for a bucket not delegated this step, or twice.
 * Since 2.9 a device engine accepts it with the same checks and waits for
 * nothing (optional there). */
gc_status gc_engine_delegate_done(gc_engine e, size_t bucket);

/* The same for a device engine (cfg.device ≥ 0): grad is device memory,
 * complete once stream passes this call; never waits for the device. */
gc_status gc_engine_ready_device(gc_engine e, size_t bucket, gc_devptr grad, size_t n, gc_stream stream);

/* Device engine: makes stream wait for the step's end (before the
 * optimizer) without blocking the host; not for a delegated bucket's
 * all-reduce, which the caller orders itself. */
gc_status gc_engine_done(gc_engine e, gc_stream stream);

/* Blocks until the step has ended (bounded by timeout_seconds, 0: none
 * beyond the engine's per-collective timeout). GC_ERR_NONFINITE (with
 * fail_on_nonfinite): a gradient held NaN/Inf; the message names the
 * buckets and ranks; the engine stays usable and the step is skipped on
 * every rank (skip the optimizer step): every error-feedback memory and
 * momentum velocity is as before it, host and device. GC_ERR_COMM: a collective
 * failed or timed out, the engine is broken; every error-feedback memory
 * of a host engine holds e + g (the step's gradients are kept), a device
 * engine's keeps e (they are lost). The statistics of the step are
 * readable after either. */
gc_status gc_engine_wait(gc_engine e, double timeout_seconds);

/* Statistics of one bucket in the last waited step. strategy and reason
 * are copied NUL-terminated into the caller's buffers (cut to fit). The
 * reason is written for people: gc_engine_verdict (since 2.10) gives what
 * it says about the path, the caution and the accuracy guard as values. */
typedef struct gc_bucket_stats {
	uint64_t elements;
	uint64_t bytes_sent;        /* this rank's bytes on the wire for the bucket */
	int32_t compressed;         /* 1: crossed the wire compressed this step */
	int32_t nonfinite;          /* 1: some rank's gradient held NaN/Inf */
	int32_t trial;              /* 1: a verification trial step */
	int32_t switched;           /* 1: verification changed the decision with this step */
	int32_t decided_compressed; /* 1: the decision for the steps to come is compressed */
	int32_t guarded;            /* since 2.2 (reserved, 0, before): 1: the accuracy guard sent the bucket dense
	                             * with its residual this step */
	double compress_seconds, exchange_seconds, decompress_seconds;
	double predicted_dense_seconds, predicted_compressed_seconds;
	double measured_dense_seconds, measured_compressed_seconds;
	char strategy[32];
	char reason[512];
} gc_bucket_stats;

/* The last waited step: its number, total bytes sent by this rank, wall
 * time and exposed time (what wait blocked), and bucket i's statistics
 * (out may be NULL). GC_ERR_STATE before any step was waited for. */
gc_status gc_engine_stats(gc_engine e, size_t bucket, gc_bucket_stats *out,
                          uint64_t *step, uint64_t *bytes_sent, double *total_seconds, double *exposed_seconds);

/* The accuracy guard's measure of bucket in the last waited step (since
 * 2.2): the largest over the ranks of ‖e‖/‖g‖, what error feedback held
 * back after the step against the step's gradient; 0 when the bucket did
 * not go compressed or the engine has no guard. GC_ERR_STATE before any
 * step was waited for. */
gc_status gc_engine_held_back(gc_engine e, size_t bucket, double *held_back);

/* ---- Structured statistics (since ABI 2.10) ----
 * What chose each bucket's path, the configuration's caution and the
 * accuracy guard's state, as values: gc_bucket_stats.reason says the same
 * for people, in words that may change; a program reads these. The host
 * and device engines fill them alike; gc_name gives each value's name. */

/* What chose a bucket's path in a step, the same on every rank. A step
 * takes the path of the bucket's decision (CODEC, PINNED, COST_MODEL,
 * VERIFICATION) unless WARMUP, TRIAL, GUARD or FALLBACK overrides it (each
 * of those over the ones before it). */
typedef enum gc_origin {
	GC_ORIGIN_CODEC = 0,        /* spec "none": the dense all-reduce is the only path */
	GC_ORIGIN_PINNED = 1,       /* cfg->decision "compressed" or "dense" */
	GC_ORIGIN_COST_MODEL = 2,   /* decision "auto": the cost model's, and no verification window has ended since */
	GC_ORIGIN_VERIFICATION = 3, /* decision "auto": the latest verification window's (switched: it changed it) */
	GC_ORIGIN_WARMUP = 4,       /* a warm-up step (cfg->warmup) sent the bucket, decided compressed, dense */
	GC_ORIGIN_TRIAL = 5,        /* a verification trial ran the alternative configuration (gc_bucket_stats.trial) */
	GC_ORIGIN_GUARD = 6,        /* the accuracy guard sent the bucket dense with its residual (guarded) */
	GC_ORIGIN_FALLBACK = 7      /* the step did not take the path chosen for it: a rank's payload could not carry
	                             * the bucket (NaN/Inf, a value the codec cannot hold) and it went dense instead of
	                             * compressed (host buckets), or a NaN/Inf skipped it (cfg->fail_on_nonfinite) */
} gc_origin;

/* A warning about the engine's configuration, the same for every bucket
 * and step: the engine runs, but accuracy or speed is likely to suffer. */
typedef enum gc_caution {
	GC_CAUTION_NONE = 0,
	GC_CAUTION_RANDOMK_RATIO = 1 /* random-k keeps fewer than a quarter of each bucket, unscaled: accuracy at the
	                              * same step budget suffers */
} gc_caution;

/* The accuracy guard's state of a bucket after a step (cfg->guard). */
typedef enum gc_guard_state {
	GC_GUARD_OFF = 0,     /* the engine has no accuracy guard (cfg->guard 0) */
	GC_GUARD_CLEAR = 1,   /* no flush pending */
	GC_GUARD_TRIPPED = 2, /* this step's held_back passed guard_threshold: the bucket's next compressed step
	                       * flushes (goes dense with its residual: origin GC_ORIGIN_GUARD, guarded) */
	GC_GUARD_PENDING = 3  /* a flush is pending from an earlier step (or a loaded state) and this step did not
	                       * carry it out (it did not go compressed, or the flush met a NaN) */
} gc_guard_state;

/* The verdicts of one bucket in the last waited step. The library writes
 * it: the caller sets size to sizeof(gc_bucket_verdict) of its header; the
 * library writes at most that many bytes, leaving fields past its own
 * struct (a newer header's) as they were, and sets size to the bytes it
 * wrote. */
typedef struct gc_bucket_verdict {
	uint32_t size;
	int32_t origin;         /* gc_origin */
	int32_t caution;        /* gc_caution */
	int32_t guard;          /* gc_guard_state */
	double held_back;       /* gc_engine_held_back's */
	double guard_threshold; /* cfg->guard (0: no guard) */
} gc_bucket_verdict;

/* Bucket's verdicts in the last waited step (since 2.10). GC_ERR_STATE
 * before any step was waited for; GC_ERR_INVALID for a NULL out or a size
 * below 2.10's (32). */
gc_status gc_engine_verdict(gc_engine e, size_t bucket, gc_bucket_verdict *out);

/* The lists of names gc_name reads (since 2.10): the library's own, the
 * one source a binding needs. */
typedef enum gc_name_list {
	GC_NAMES_STRATEGY = 0, /* gc_engine_config.strategy's, "auto" first; gc_bucket_stats.strategy is one */
	GC_NAMES_DECISION = 1, /* gc_engine_config.decision's, "auto" first */
	GC_NAMES_ORIGIN = 2,   /* gc_origin's by value: "codec", "pinned", "cost-model", ... */
	GC_NAMES_CAUTION = 3,  /* gc_caution's by value: "none", "random-k-ratio" */
	GC_NAMES_GUARD = 4,    /* gc_guard_state's by value: "off", "clear", "tripped", "pending" */
	GC_NAMES_OUTER_OPTIMIZER = 5 /* since 2.11: gc_outer_optimizer's by value: "nesterov", "sgd", "none" */
} gc_name_list;

/* Name i of list (since 2.10), in static storage valid while the library
 * is loaded; NULL past the list's end (i = its length), for a negative i
 * or an unknown list. A binding lists one with i = 0, 1, ... until NULL. */
const char *gc_name(gc_name_list list, int i);

/* The engine's state (error-feedback memories and momentum velocities,
 * next step number, world size and rank, bucket layout, and the settings
 * that shape the exchange: spec, strategy as configured and in use, error
 * feedback, momentum and its masking, guard, schedule; versioned,
 * checksummed): size, save (GC_ERR_SIZE if cap is short, *written the
 * size needed) and load (validated whole first: a damaged state, or one
 * saved with another of those settings or bucket layout, or whose
 * strategy byte names no strategy, is GC_ERR_CORRUPT naming what differs
 * with both values, and e is unchanged). It loads at another world size:
 * the strategy in use may then differ where both engines were configured
 * "auto". decision, warmup, timeout_seconds, workers and fail_on_nonfinite
 * are not recorded and may change on resume. GC_ERR_STATE during a step. */
gc_status gc_engine_state_size(gc_engine e, size_t *len);
gc_status gc_engine_state_save(gc_engine e, uint8_t *dst, size_t cap, size_t *written);
gc_status gc_engine_state_load(gc_engine e, const uint8_t *src, size_t len);

/* Loads a state across a change of shape (since 2.5): of another strategy
 * ("hier" or flat), node layout or world size, which gc_engine_state_load
 * refuses. COLLECTIVE: every rank of e calls it, with the state its rank
 * saved, or src NULL (len 0) where the old job had no such rank; it BLOCKS
 * until its posts are completed. Each old rank's error-feedback memories
 * and momentum velocities are summed by what they add to the average (one
 * all-reduce) and handed out to e's ranks, so that the next steps add the
 * same; the step number is the states' (they must agree); pending
 * accuracy-guard flushes are cleared. The states must have e's spec,
 * error feedback, momentum, schedule, guard and bucket sizes: otherwise
 * GC_ERR_CORRUPT on every rank (the faulty rank's message says why) and e
 * is unchanged. */
gc_status gc_engine_state_load_reshaped(gc_engine e, const uint8_t *src, size_t len);

/* Reads what a saved engine state records, without an engine (checksum
 * checked): the canonical spec and strategy in use (NUL-terminated, cut to
 * spec_cap / strategy_cap), world size, rank, next step and bucket count;
 * sizes (if not NULL, sizes_cap entries) gets the bucket sizes. */
gc_status gc_engine_state_info(const uint8_t *src, size_t len, char *spec, size_t spec_cap,
                               char *strategy, size_t strategy_cap, int *world, int *rank,
                               uint64_t *next_step, size_t *nbuckets, uint64_t *sizes, size_t sizes_cap);

/* Reads the node layout a saved engine state records (since 2.5): this
 * rank's node of nodes and local rank of local_size; all 0 for a state of
 * a flat strategy or older than the layout (format 4). */
gc_status gc_engine_state_layout(const uint8_t *src, size_t len, int *node, int *nodes, int *local_rank,
                                 int *local_size);

/* Checks a saved engine state against a configuration, without an engine
 * (since 2.3): GC_OK when gc_engine_state_load would accept src[0..len) into
 * an engine created with cfg, sizes and nbuckets on world_size ranks, else
 * the status and message (after the function's name) that load would give:
 * GC_ERR_CORRUPT for a damaged state or one saved with other settings (the
 * message names the setting and both values). SRA's second memory is
 * checked as the rank that saved the state would load it. A cfg or sizes
 * that gc_engine_create would refuse are GC_ERR_CONFIG (GC_ERR_NOMEM where
 * the buckets' bookkeeping alone would not fit in memory); world_size
 * outside 1 to 65535 is GC_ERR_INVALID. cfg's timeout_seconds, workers and device
 * play no part ("auto" resolves as for host buckets; a state saved with
 * "auto" passes whatever it resolved to, as either kind of engine loads
 * it). */
gc_status gc_engine_state_check(const uint8_t *src, size_t len, const gc_engine_config *cfg,
                                const uint64_t *sizes, size_t nbuckets, int world_size);

/* ---- Outer synchronization: DiLoCo, Streaming DiLoCo, SparseLoCo (since ABI 2.11) ----
 *
 * A gc_outer is gradcomp's outer loop (package outer's Loop) over a hosted
 * transport, whose collectives the host carries out with its own
 * communicator exactly as for gc_engine_create (posts, take or launcher,
 * complete; see "Engines" above). Each rank (a worker) trains its own
 * copy of the model with its own inner optimizer and data and calls
 * gc_outer_step after every inner optimizer step; every H inner steps
 * (sync_every) the workers average how far they moved from the global
 * weights θ_global — the pseudo-gradient Δ = θ_global − θ_local, float32 —
 * through one engine per fragment (gc_engine_config's codec, strategy,
 * error feedback and its decay apply to it), an outer optimizer applies
 * the average to θ_global (the same on every rank) and the local weights,
 * the caller's params, become α·θ_local + (1 − α)·θ_global. Fragment f
 * of F starts its sync at the inner steps s ≥ off_f with (s − off_f) mod
 * H = 0, off_f = floor((f+1)·H/F), and finishes it τ (delay) steps later,
 * its exchange overlapping those inner steps (τ = 0: within the same
 * gc_outer_step). The schedule, the optimizer and the state live in the
 * library; gc_outer_due tells a host what the next step touches.
 *
 * The params are the caller's host float32 tensors, given at
 * gc_outer_create: the library reads and writes them during
 * gc_outer_create (which copies rank 0's into every rank's) and
 * gc_outer_step only, and keeps their addresses until gc_outer_destroy,
 * so they must stay valid and in place until then. */
typedef uint64_t gc_outer;

/* The outer optimizer (gc_outer_config.optimizer); gc_name's
 * GC_NAMES_OUTER_OPTIMIZER lists their names. With Δ̄ the average of an
 * element's pseudo-gradient, θ its global weight and m its momentum,
 * every operation a float32 one rounded on its own: */
typedef enum gc_outer_optimizer {
	GC_OUTER_NESTEROV = 0, /* DiLoCo's, torch.optim.SGD(nesterov=True): m ← μ·m + Δ̄; θ ← θ − lr·(Δ̄ + μ·m)
	                        * (lr 0: 0.7, momentum 0: 0.9) */
	GC_OUTER_SGD = 1,      /* SparseLoCo's: θ ← θ − lr·Δ̄ (lr > 0, momentum 0) */
	GC_OUTER_NONE = 2      /* θ ← θ − Δ̄: the average of the local weights (lr and momentum 0) */
} gc_outer_optimizer;

/* What a sync whose average is not finite (some rank's Δ held NaN/Inf)
 * does (gc_outer_config.on_nonfinite). Either way it is skipped on every
 * rank: the fragment's global weights, momentum, local weights and
 * error-feedback memory stay as they were, and gc_outer_report names it. */
typedef enum gc_outer_nonfinite {
	GC_OUTER_SKIP = 0, /* gc_outer_step returns GC_OK */
	GC_OUTER_FAIL = 1  /* gc_outer_step returns GC_ERR_NONFINITE (the loop stays usable) */
} gc_outer_nonfinite;

/* An outer loop's configuration. Set size to sizeof(gc_outer_config);
 * later versions append fields, and the library reads as far as size
 * says (only the sizes of ABIs it knows: 72 since 2.11; any other is
 * refused, naming both sizes, before a byte past the first four is read).
 * Every field must be equal on every rank: gc_outer_create's handshake
 * compares them all, with the tensor sizes, fragments and shapes. */
typedef struct gc_outer_config {
	uint32_t size;                /* sizeof(gc_outer_config) of the caller's header: 72 */
	int32_t sync_every;           /* H ≥ 1: each fragment syncs once every H inner steps */
	int32_t fragments;            /* F: 0 means 1, or with fragment_of as many as it names. Without fragment_of
	                               * the fragments are F contiguous groups of tensors, in order, balanced by elements
	                               * (F at most the number of tensors; gc_outer_layout gives the layout) */
	int32_t delay;                /* τ ≥ 0, with τ·F < H: a fragment's exchange is applied τ inner steps after its
	                               * start (0: within the same gc_outer_step) */
	double alpha;                 /* α in [0, 1): at a finish the local weights become α·θ_local + (1−α)·θ_global */
	int32_t optimizer;            /* gc_outer_optimizer */
	int32_t on_nonfinite;         /* gc_outer_nonfinite */
	double lr;                    /* the outer learning rate (0: nesterov's 0.7; sgd needs one; none takes 0) */
	double momentum;              /* nesterov's μ in (0, 1) (0: 0.9); sgd and none take 0 */
	uint64_t bucket_elements;     /* the largest engine bucket, in float32s (0: 4 Mi): a fragment's tensors are laid
	                               * out in buckets along tensor boundaries, a larger tensor split (not with shapes) */
	const int32_t *fragment_of;   /* NULL (the default layout) or ntensors entries: each tensor's fragment, numbered
	                               * from 0, every fragment holding a tensor with elements */
	const uint64_t *shapes;       /* NULL or ntensors (rows, cols) pairs: each tensor as a matrix (1-D: 1×n), which
	                               * spec "powersgd:R" needs */
} gc_outer_config;

/* Creates rank t's outer loop over ntensors tensors, params[i] of
 * sizes[i] float32 elements (host memory, see above; a tensor of 0
 * elements may be NULL), with ocfg and the fragment engines' ecfg: its
 * spec, strategy, decision, error_feedback, feedback_decay, warmup,
 * schedule, guard, momentum, timeout_seconds (which also bounds the
 * loop's own collectives) and workers; device must be -1 and
 * tensor_counts and shapes NULL (the loop's shapes are ocfg->shapes);
 * fail_on_nonfinite is the loop's (set, so a NaN is never averaged in).
 * COLLECTIVE, it BLOCKS until its posts are completed: the handshake (a
 * configuration differing from another rank's is GC_ERR_CONFIG on every
 * rank, naming the field and both values), the broadcast of rank 0's
 * params into every rank's params, which become θ_global, and each
 * fragment engine's creation (as gc_engine_create). A rank whose
 * configuration or arguments are invalid (NULL or a size this library
 * does not read, a value out of range, NULL params or sizes) still takes
 * part to say so: every rank gets GC_ERR_CONFIG at once, naming that rank
 * and the field. Only a NULL out (GC_ERR_INVALID), an unknown transport
 * (GC_ERR_HANDLE) and a transport that already has an engine or outer loop
 * (GC_ERR_STATE) fail without taking part. One engine or outer loop per
 * transport. */
gc_status gc_outer_create(gc_hosted t, const gc_outer_config *ocfg, const gc_engine_config *ecfg,
                          float *const *params, const uint64_t *sizes, size_t ntensors, gc_outer *out);

/* Destroys o: an exchange in flight is abandoned; the transport is not
 * destroyed and may take another engine or loop. */
gc_status gc_outer_destroy(gc_outer o);

/* What one gc_outer_step did. The caller sets size (sizeof, at least 64,
 * ABI 2.11's) and capacity and the arrays (each NULL or capacity int32
 * entries; F ≤ ntensors, so ntensors entries always suffice); the library
 * writes the counts and the first capacity fragment indices of each list
 * into the arrays that are not NULL, and never writes past its own struct
 * (a newer header's fields stay as they were). */
typedef struct gc_outer_report {
	uint32_t size;          /* in: sizeof(gc_outer_report) */
	uint32_t capacity;      /* in: entries each non-NULL array holds */
	int32_t *started;       /* in: NULL or an array; out: the fragments whose sync started, ascending */
	int32_t *finished;      /* out: the fragments whose sync ended (applied or skipped), ascending */
	int32_t *skipped;       /* out: those of finished that were skipped (a non-finite average), ascending */
	uint64_t step;          /* out: the inner step s this call counted (1 for the first) */
	uint64_t bytes_sent;    /* out: this rank's bytes on the wire for the finished syncs' exchanges */
	uint32_t nstarted;      /* out: how many started (the array holds the first capacity) */
	uint32_t nfinished;     /* out: how many finished */
	uint32_t nskipped;      /* out: how many were skipped */
	int32_t first_skipped;  /* out: the first skipped fragment, -1 for none */
} gc_outer_report;

/* Counts one inner step s and carries out the schedule's work at s: it
 * finishes the exchanges due at s (waiting for them, bounded by the
 * engines' timeout) and applies their averages (θ_global and the params
 * of those fragments), then starts the syncs due at s (Δ from the params;
 * with delay 0 finishing each at once). Call it on every rank after each
 * inner optimizer step; between two calls the host keeps carrying out the
 * posts of the exchanges in flight. *rep is filled whatever the status:
 * GC_ERR_NONFINITE (GC_OUTER_FAIL: a sync skipped on every rank, the
 * loop usable; the other finished fragments were applied), GC_ERR_COMM (a
 * collective failed or timed out; the loop is broken, later calls
 * GC_ERR_BROKEN: what rep says was done before the failure, nothing of
 * the failed sync). A NULL rep or a size below 64 is GC_ERR_INVALID and
 * counts no step. */
gc_status gc_outer_step(gc_outer o, gc_outer_report *rep);

/* What the NEXT gc_outer_step does: the fragments whose sync it starts
 * (*nstarts of them) and those whose sync it finishes (*nfinishes; with
 * delay 0 the ones it starts), each ascending, the first capacity of each
 * into starts and finishes (NULL only with capacity 0). For a host whose
 * weights live elsewhere (a GPU) and are mirrored in params: the step
 * reads the tensors of both lists' fragments and writes those of
 * finishes, so copy the former into params before the step and the
 * latter back after it (gc_outer_layout gives each tensor's fragment); it
 * touches no other tensor. No collective. */
gc_status gc_outer_due(gc_outer o, int32_t *starts, int32_t *finishes, size_t capacity, size_t *nstarts,
                       size_t *nfinishes);

/* Each tensor's fragment into fragment_of (ntensors entries, the loop's
 * tensor count, else GC_ERR_SIZE; NULL with ntensors 0 to get only the
 * count) and the number of fragments F into *nfragments. */
gc_status gc_outer_layout(gc_outer o, int32_t *fragment_of, size_t ntensors, size_t *nfragments);

/* Copies tensor's global weights θ_global (n its elements, else
 * GC_ERR_SIZE) into dst: to evaluate or export the global model. */
gc_status gc_outer_global(gc_outer o, size_t tensor, float *dst, size_t n);

/* The loop's state (its configuration, the inner step, θ_global, the
 * outer momentum, the syncs in flight with their arrived averages and
 * every fragment engine's state; versioned, checksummed): size, save
 * (GC_ERR_SIZE if cap is short, *written the size needed) and load. Call
 * save on every rank at the same inner step: a sync in flight is first
 * waited for (BLOCKING until its posts are completed) and its average
 * saved, so a run resumed from the states applies exactly what the
 * uninterrupted one would. The params are the caller's to checkpoint,
 * with its inner optimizer. Load is COLLECTIVE (it BLOCKS until its posts
 * are completed), into a loop with no sync in flight (a new one, to
 * resume; else GC_ERR_CORRUPT, nothing changed): every rank passes
 * the state its rank saved, or src NULL (len 0) where the saved job had no
 * such rank. On the saved number of ranks the resumed run is bit for bit
 * the uninterrupted one; on another the shared part comes from the lowest
 * rank with a state and the engines' error-feedback memories are summed
 * and handed out again. A damaged state, one of another configuration
 * (tensors, fragments, H, F, τ, α, optimizer, engine settings: the
 * message names the field and both values) or states the ranks disagree
 * on are GC_ERR_CORRUPT on every rank and nothing changes; a failed
 * collective during the load is GC_ERR_COMM and breaks the loop. */
gc_status gc_outer_state_size(gc_outer o, size_t *len);
gc_status gc_outer_state_save(gc_outer o, uint8_t *dst, size_t cap, size_t *written);
gc_status gc_outer_state_load(gc_outer o, const uint8_t *src, size_t len);

/* In libgradcomp_cuda.so, gc_settle of a device bucket only swaps device
 * pointers, and gc_state_size/save copy device residuals to the host on
 * gradcomp's own stream (waiting for it, not for any caller's stream): the
 * state holds host and device buckets alike and loads into either library.
 * gc_state_load puts every bucket in host memory (device buckets are freed
 * and move back on their next gc_compress_device). gc_compressor_destroy
 * frees the handle's device memory. */

#ifdef __cplusplus
}
#endif

#endif /* GRADCOMP_H */
