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
#define GRADCOMP_ABI_MAJOR 1
#define GRADCOMP_ABI_MINOR 2
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
	GC_ERR_CUDA = 12       /* since 1.2: a CUDA driver call failed (the message names it) */
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
 * error-feedback memory, one residual per bucket id. */
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
