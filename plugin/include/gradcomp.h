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
 * each parameter says. Pointers are host memory in libgradcomp.so. A pointer
 * may be NULL only where its length is 0; output pointers never. The library
 * keeps no pointer it was given after the call returns.
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
#define GRADCOMP_ABI_MINOR 1
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
	GC_ERR_INTERNAL = 9    /* a bug in gradcomp: please report the message */
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
 * until then: any GC_FEEDBACK call on a held bucket is GC_ERR_STATE rather
 * than a wait. On any error *written is 0, the residual is untouched and
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
 * "shared-index": overlap.ParseStrategy's names; "allgather" is an all-gather
 * of whole payloads, what the Python hook does) over a link of the given
 * bandwidth (bytes/s) and latency (seconds): *compress is 1 when the compressed exchange is predicted
 * faster than a dense all-reduce, 0 otherwise; the two predictions (seconds)
 * are returned when the pointers are not null. The compressor's own
 * encode/decode throughput is measured on first use and kept. */
gc_status gc_decide(gc_compressor h, const char *strategy, size_t n, int world,
                    double bandwidth, double latency,
                    int *compress, double *dense_seconds, double *compressed_seconds);

#ifdef __cplusplus
}
#endif

#endif /* GRADCOMP_H */
