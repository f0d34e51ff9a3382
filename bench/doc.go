// Package bench measures gradcomp's compressors on synthetic gradients and
// reports the figures as a text table, CSV, JSON and PNG plots.
//
// The compressor suite (Run) takes a list of codec specs and a list of sizes.
// For every pair it draws a heavy-tailed synthetic gradient (Generate), and
// measures, side by side in one run:
//
//   - the compression ratio, 4·n / payload bytes;
//   - encode throughput (Compress) and decode-accumulate throughput
//     (DecompressAdd), both in GB/s (10⁹ bytes) of fp32 data, 4·n bytes per call;
//   - a plain copy of the same 4·n bytes, interleaved round by round with the
//     codec calls so both see the same machine state, and encode_vs_memcpy,
//     the ratio of the two throughputs;
//   - the relative L2 error ‖x − D(C(x))‖ / ‖x‖;
//   - for sampled top-k, its recall against exact top-k (see Recall);
//   - for a spec with a lossless stage, the ratio gained and the encode time
//     it costs against the same spec without it.
//
// Timings keep the best (fastest) of several rounds: on a shared machine
// noise only ever adds time, so the minimum is the most repeatable figure.
package bench
