// Package overlap is gradcomp's engine: it takes gradient buckets as
// backward produces them, compresses them with error feedback, exchanges
// them between the ranks of a comm.Comm while the caller keeps computing,
// and leaves the rank-average in each bucket before the optimizer step.
//
//	e, err := overlap.New(ctx, c, sizes, overlap.Config{Spec: "topk:0.01", ErrorFeedback: true})
//	for each step:
//		e.Step()
//		for each bucket i, as backward produces it: e.Ready(i, grad[i])
//		stats, err := e.Wait(ctx)   // grad[i] now holds the average
//
// # One engine, two backends
//
// Engine (buffers in host memory, stages on goroutine streams, any
// comm.Comm) and DeviceEngine (buffers in device memory, stages on CUDA
// streams, a comm.DeviceComm such as NCCL) are one engine core (core.go)
// and a backend each. The core owns everything the ranks must agree on
// and everything a user relies on: the step protocol (Step, Ready, Done,
// Wait, Close), the launch order, the handshake, the decisions (pinned,
// the cost model's, verification's), warm-up, the statistics and the
// state format (Save, Load). A backend says where a bucket's buffers live
// and how a stage runs: prepare, encode, launch, wait, conclude, settle.
//
// # Pipeline
//
// Each bucket goes through compress → exchange → decode and average, on
// three streams (four for SRA, below): ordered worker goroutines standing
// in for CUDA streams, driven only by enqueue, record-event and wait-event
// (stream.go), so CUDA streams and events can replace them without
// changing this API. Ready
// enqueues the bucket's compression at once and never blocks; the
// exchanges are launched strictly in bucket order (bucket i once buckets
// 0..i are ready), so every rank makes the same collectives in the same
// order whatever order backward readies them in. Bucket i's exchange thus
// overlaps bucket i+1's compression, bucket i−1's decoding and the
// caller's compute. All collectives of an engine are issued from one
// stream, in one order on every rank. Over a comm.Starter the host engine
// leaves each bucket's last collective in flight and goes on to the next
// bucket's (up to the Starter's InFlight(); no buffers beyond the buckets'
// own), the decode stream waiting for it; a dense fallback its statuses
// call for is made at the end of the step, in bucket order (inflight.go).
// Delegate lets the caller exchange a dense bucket itself, on either
// engine (delegate.go, devicedelegate.go). SRA's exchange has two rounds (all-to-all, all-gather)
// with this rank's sum and re-encode between them: the host engine runs
// that work on a fourth stream, and enqueues bucket i's all-gather after
// bucket i+1's all-to-all (the last bucket's at once), so the link
// carries the next bucket while this rank reduces; the order depends on
// the bucket order alone.
//
// # Strategies and their results
//
// With N ranks, rank r's gradient g_r of a bucket of n elements, C and D
// the configured compressor's Compress and Decompress, and "sum" meaning
// decode-and-add in rank order into zeros (comm/inproc's order; comm/mpi's
// all-reduce order can differ in the last bits), every rank ends with:
//
//	dense (none)       sum_r g_r / N, a float32 all-reduce
//	shared-index       sum_r D(C(x_r)) / N: random-k under the shared key
//	                   (bucket, step), so the k indices agree and only the
//	                   k values are all-reduced
//	sparse-gather,     sum_r D(C(x_r)) / N: every rank's payload of the
//	allgather          whole bucket all-gathered, decoded and added
//	sra (and fp16/bf16 the bucket cut into N parts, part j = elements
//	under dense)       [j·n/N, (j+1)·n/N); rank r compresses each part;
//	                   an all-to-all brings part j of every rank to rank
//	                   j, which computes a_j = sum_r D(C(x_r[part j])) / N
//	                   and sends D(C(y_j)) of y_j = a_j (+ its second
//	                   error-feedback memory; none for sign) to everyone
//	                   by an all-gather
//	hier               on K nodes of L ranks (hier.go). Top-k, random-k:
//	                   the flat strategy's result, exchanged over
//	                   two-level collectives (comm/twolevel). Others: a
//	                   float32 reduce-scatter in the node, each
//	                   node-averaged shard of ⌈n/L⌉ elements exchanged
//	                   across nodes by an engine of its own (the codec's
//	                   auto strategy on K ranks, as above), an all-gather
//	                   in the node
//
// where x_r = e_r + g_r with error feedback (e_r the rank's memory of the
// bucket, updated e_r ← x_r − D(C(x_r)) when the step succeeds, or
// e_r ← β·(x_r − D(C(x_r))) with Config.FeedbackDecay β) and x_r = g_r
// without. The division is float32 x / float32(N).
//
// Keys. A payload is compressed under compress.Key{Bucket: tag<<32 |
// bucket, Step: step}: tag 0 for shared-index (the indices must agree);
// 1 + r·N + j for rank r's stage-1 part j (j = 0 for the gather
// strategies); 1 + N² + r for rank r's stage-2 (SRA) payload. So
// stochastic rounding draws differ between ranks and parts, and rounding
// errors average out across ranks instead of adding up. Error-feedback
// memory is keyed by the bucket index alone.
//
// Every slot a rank sends starts with a 16-byte status, the same on both
// backends (parts.go; the device's Encode kernels write it): ok, or the
// first NaN/Inf, or the first value the codec cannot represent (fp16
// beyond 65504), each with its element index; with Config.Guard a 16-byte
// block with the rank's ρ follows. Shared-index on the host carries N
// float32 statuses (and N float32 ρ) in front of its all-reduced values
// instead. The statuses arrive with the exchange itself, so agreeing on
// the path costs no extra collective: 16 bytes per slot (32 with the
// guard; N·4 bytes for shared-index) and, in the rare bad case, a second
// exchange.
//
// # Non-finite gradients
//
// A bucket with NaN or Inf on any rank (or one its codec cannot represent)
// is exchanged dense that step by every rank, after its compressed
// exchange showed the statuses, so the result is exactly what plain DDP
// gives (the NaN shows in it); BucketStats.NonFinite and Reason say who
// had what. Its error-feedback memory is left as it was: a non-finite
// value never enters it, and a step the caller skips (AMP's grad scaler)
// loses nothing. With Config.FailOnNonFinite every rank's Wait instead
// returns the same *NonFiniteStepError (the bucket is not exchanged further;
// the engine stays usable) and the step is skipped: every rank's memories
// and momentum velocities stay as they were before it. A dense bucket's
// result is checked after the all-reduce, the same on every rank.
//
// # Handshake and cost model
//
// New exchanges every rank's protocol version, canonical spec, strategy,
// node layout, shape choice, node-stage codec, error-feedback flag,
// decision mode, FailOnNonFinite, the other settings that shape the
// exchange and the bucket layout (two all-gathers; handshake.go lists
// them); a difference is a *ConfigMismatchError on every rank, e.g.
// "ranks disagree on spec: rank 2 has int8, rank 0 has topk:0.01".
//
// With DecideAuto, New then measures, on every rank: the link, with
// all-reduces of 256, 16 Ki, 256 Ki (and 1 Mi, for buckets of 512 Ki
// elements or more) float32s, the fastest of 5 each, fitted by least squares
// to t(V) = α + V/β, V the bytes a rank sends; and the engine's own paths
// — the compressed path's encode, its work between collectives (SRA's sum
// and re-encode) and its decode and average, and the dense path's average
// — run on a scratch engine over a loopback comm (collectives free, every
// rank sending what this one sends) for the smallest, median and largest
// bucket sizes, each stage's median over at least 20 ms fitted linear in n.
// Medians over a window, taken by all ranks at once, include what ranks
// sharing cores cost each other, without one preempted run moving them. Every rank then uses, for each probe, the
// fastest rank's time (an early rank also timed its wait for the others)
// and for each compute time the slowest rank's (one all-gather). Per
// bucket it predicts
//
//	dense      = A + max(0, M − A)
//	compressed = X + max(0, E − X) + max(0, D − X)
//
// with A = t(2(N−1)/N · 4n) the all-reduce and M the average, and E the
// encode, D the decode and X the exchange of the compressed path: the
// collectives' t(V) by the volumes below, plus the work between them. The
// max terms count what overlap hides: bucket i's encode runs while bucket
// i−1 is on the wire and its decode while bucket i+1 is, so with
// neighbours of similar size up to one exchange time of each is hidden;
// the first bucket's encode and the last one's decode are not, which this
// ignores. Compressed is chosen when predicted at least 20% faster (the
// model's error on a loaded host is of that order). Rank 0's choices are
// broadcast; the predictions and inputs appear in BucketStats.Reason.
// DecideCompressed and DecideDense pin the choice.
//
// The prediction is then checked online (verify.go): the first steps
// alternate the decided configuration with the alternative (all dense if
// anything is compressed, else all compressed), the ranks all-gather their
// step times, and every rank switches to the alternative when the slowest
// rank measured it at least 5% faster; the check repeats after 100 steps,
// the gap doubling while nothing changes. BucketStats carries the measured
// times (MeasuredDense, MeasuredCompressed), Trial and Switched.
//
// Predict gives the same model's answer for one bucket without an engine
// (the C ABI's gc_decide), from a link the caller measured.
//
// Volumes (bytes one rank sends, also BucketStats.BytesSent): an
// all-reduce of S bytes 2(N−1)/N·S, an all-gather of s bytes per rank
// (N−1)·s, an all-to-all of S bytes (N−1)/N·S.
//
// # Failures
//
// Every collective has Config.Timeout: a rank that stops calling (dead,
// hung) makes the others' Wait return a *StepError within it. Misuse (Ready
// of an unknown or already ready bucket, Wait without Step, Step during a
// step) is a *UsageError that changes nothing. A failed step (other than
// a *NonFiniteStepError, which skips it) leaves every compressed bucket's
// memory holding e + g — nothing of the step is lost — and breaks the
// engine: the ranks may be out of step, so later calls return a
// *BrokenError; build a new engine on a new Comm (comm/mpi: see its doc on
// abandoned collectives).
//
// # Limits
//
// Payloads are exchanged in fixed-size slots, so a spec with a lossless
// stage (whose payload lengths vary) is refused. Lengths are bounded by
// compress.MaxElements per bucket and 65535 ranks, and an engine's host
// memory by what the machine can give: New refuses, before allocating,
// buckets whose buffers would not fit (a *MemoryError; see memory.go).
package overlap
