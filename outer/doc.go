// Package outer is outer synchronization for low-communication training:
// DiLoCo, Streaming DiLoCo and SparseLoCo over the overlap engine. Each
// worker (a rank of a comm.Comm) trains its own copy of the model with its
// own inner optimizer and data; every H inner steps the workers average
// how far they moved — the pseudo-gradient — through an overlap.Engine
// (compressed, with error feedback, as configured) and an outer optimizer
// applies that average to the global weights the workers share.
//
//	loop, err := outer.New(ctx, c, params, outer.Config{SyncEvery: 100})
//	for each inner step:
//		inner optimizer step on params (this rank's data)
//		report, err := loop.Step(ctx)
//
// # The algorithm
//
// Every rank holds the global weights θ_global (the same on every rank:
// New broadcasts rank 0's params and both start there) and its local
// weights θ_local, the caller's params. A sync of a set of tensors:
//
//	Δ = θ_global − θ_local                 on each rank, float32
//	Δ̄ = the engine's average of Δ over the ranks
//	θ_global ← outer optimizer step with Δ̄ (Optimizer)
//	θ_local ← α·θ_local + (1 − α)·θ_global (Alpha; α = 0 takes θ_global)
//
// The outer optimizers (Optimizer.Kind) are Nesterov (torch.optim.SGD with
// nesterov=True: m ← μ·m + Δ̄, θ ← θ − lr·(Δ̄ + μ·m); lr 0.7, μ 0.9 by
// default), SGD (θ ← θ − lr·Δ̄) and None (θ ← θ − Δ̄: the average of the
// local weights).
//
//   - DiLoCo is one fragment (F = 1) without delay: every H steps, all the
//     tensors, Nesterov.
//   - Streaming DiLoCo splits the tensors into F fragments synchronized at
//     staggered steps, each exchange overlapping τ inner steps (Delay),
//     and blends the arrived global weights into the local ones (Alpha).
//   - SparseLoCo lets error feedback take the place of outer momentum:
//     Engine.ErrorFeedback on, a sparse codec (top-k of 1–3 %) in
//     Engine.Spec, Optimizer SGD. The engine's error-feedback memory
//     keeps, per rank, what its compressed Δ did not carry (e ← e + Δ;
//     send C(e); e ← e − D(C(e))) and adds it to the next sync's.
//
// The pseudo-gradients go through one overlap.Engine per fragment, over
// the Loop's Comm, with the Engine settings given (FailOnNonFinite set,
// so a NaN is never averaged in): every codec, strategy and accuracy
// option of the engine applies to them. A fragment's tensors are laid out
// in the engine's buckets in order, along tensor boundaries where they fit
// in BucketElements.
//
// # The schedule
//
// Inner steps are counted s = 1, 2, …: the caller calls Step once after
// each inner optimizer step. With H = SyncEvery, F fragments and τ =
// Delay, fragment f (0 to F−1) starts a sync at the steps s with
//
//	s ≥ off_f and (s − off_f) mod H = 0,  off_f = ⌊(f+1)·H/F⌋
//
// and finishes it at step s + τ (τ = 0: within the same Step). So with F =
// 1 the syncs are at H, 2H, …; with F = 4, H = 8 fragment 0 starts at 2,
// 10, 18, …, fragment 1 at 4, 12, …, fragment 2 at 6, 14, …, fragment 3
// at 8, 16, …. Step finishes the exchanges due at s first, then starts
// the syncs due at s, in fragment order. Δ is taken at the start; the
// average is applied at the finish, to the global weights as they are
// then, and blended into the local weights as they are then (τ inner
// steps further on). New refuses τ·F ≥ H: with τ·F < H every exchange
// finishes at or before the next one starts, so one exchange at most is in
// flight and the fragment engines can share one Comm (an engine makes
// collectives only in New, between its Step and its Wait, and in
// LoadReshaped).
//
// # Failures
//
// A non-finite average (some rank's Δ held NaN or Inf) skips that sync on
// every rank: the fragment's global weights, momentum, local weights and
// error-feedback memory stay as they were, Sync.Skipped names it, and with
// OnNonFinite FailNonFinite Step also returns its *NonFiniteSyncError.
// A failed exchange (a dead or stalled peer, found within Engine.Timeout;
// an ended context) is returned by Step on every rank that takes part,
// with params, the global weights and the momentum as before the call; it
// breaks the Loop (*BrokenError afterwards): build a new one over a new
// Comm and resume from a checkpoint. New refuses an invalid configuration
// with a *ConfigError naming the field, and ranks that disagree with a
// *ConfigMismatchError naming the field and both values, on every rank.
//
// # Checkpoints
//
// Save writes a rank's state (the configuration, s, the global weights,
// the outer momentum, the syncs in flight with their arrived averages, the
// fragment engines' states) and Load restores it on every rank, bit for
// bit on the same number of ranks and reshaping the engines' states on
// another. The caller checkpoints params and its inner optimizer itself.
package outer
