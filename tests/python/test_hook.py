"""gradcomp.torch under real torch: the hook on one rank with crafted
buckets, and on 2 or 4 gloo ranks (spawned processes): the host's
collectives, mismatched configurations, NaN buckets, checkpoints, bytes on
the wire against each strategy's formula, the overlapped exchange."""

import datetime
import logging
import os
import tempfile
import unittest

import torch
import torch.distributed as dist

import gradcomp
import gradcomp.torch as gct

import ranks
import workers
from libpath import require_library

WORLD = 4


def setUpModule():
    require_library()


class OneRank(unittest.TestCase):
    """The hook in this process, on a gloo group of one rank."""

    @classmethod
    def setUpClass(cls):
        cls._store = tempfile.NamedTemporaryFile(prefix="gradcomp-store-", delete=False)
        cls._store.close()
        os.unlink(cls._store.name)
        dist.init_process_group(
            "gloo", init_method="file://" + cls._store.name, rank=0, world_size=1,
            timeout=datetime.timedelta(seconds=60),
        )

    @classmethod
    def tearDownClass(cls):
        dist.destroy_process_group()
        if os.path.exists(cls._store.name):
            os.unlink(cls._store.name)

    def state(self, spec, **kw):
        kw.setdefault("warmup_steps", 2)
        kw.setdefault("decision", "compressed")
        s = gct.State(spec, workers=1, **kw)
        self.addCleanup(s.close)
        return s

    def run_steps(self, state, make_buffer, steps):
        """Runs the hook `steps` times on fresh buffers; returns the last
        (input, output) pair."""
        for _ in range(steps):
            buf = make_buffer()
            given = buf.clone()
            out = gct.hook(state, workers.FakeBucket(buf)).wait()
        return given, out

    def test_state_arguments(self):
        with self.assertRaises(ValueError) as cm:
            gct.State("topk:0.01", warmup_steps=1)
        self.assertIn("warmup_steps", str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            gct.State("topk:7")
        self.assertIn("topk:7", str(cm.exception))  # the library's message
        for kw in [dict(decision="guess"), dict(on_nonfinite="ignore"), dict(strategy="ring"), dict(timeout=0),
                   dict(momentum=1.0), dict(momentum=-0.1), dict(momentum=float("nan")), dict(momentum=True),
                   dict(guard=-1.0), dict(guard=float("nan")), dict(guard=float("inf")), dict(guard=True),
                   dict(guard=2.0, error_feedback=False), dict(momentum_masking=True)]:
            with self.subTest(**kw), self.assertRaises(ValueError):
                gct.State("int8", **kw)
        # The strategies are the library's, low-rank included.
        self.assertEqual(gct.State.strategies(), gradcomp.names(gradcomp.Names.STRATEGY))
        gct.State("powersgd:2", strategy="low-rank").close()

    def test_momentum_correction_carries_the_velocity(self):
        # From the engine's first step (hook step 2) the bucket becomes
        # u = m·u + g: with g = 1 every step, u = 1, 1.5, 1.75.
        state = self.state("none", momentum=0.5)
        outs = []
        for _ in range(5):
            outs.append(float(gct.hook(state, workers.FakeBucket(torch.ones(8))).wait()[0]))
        self.assertEqual(outs, [1.0, 1.0, 1.0, 1.5, 1.75])
        sd = state.state_dict()
        other = self.state("none", momentum=0.9)
        with self.assertRaises(ValueError) as cm:
            other.load_state_dict(sd)  # applied when its engine is made: refused then, or now
            for _ in range(3):
                gct.hook(other, workers.FakeBucket(torch.ones(8))).wait()
        self.assertIn("momentum", str(cm.exception))

    def test_accuracy_guard_flushes_after_a_trip(self):
        # Top-k 5 % of fresh random buckets: what error feedback holds back
        # grows past 1.2·|g| within a few steps; the next step goes dense
        # with the residual (held_back 0), is counted and logged.
        state = self.state("topk:0.05", guard=1.2)
        torch.manual_seed(3)
        held, guarded, verdicts = [], [], []
        with self.assertLogs("gradcomp", "INFO") as cm:
            for _ in range(16):
                gct.hook(state, workers.FakeBucket(torch.randn(1000))).wait()
                if state.last_step is not None:
                    b = state.last_step.buckets[0]
                    held.append(b.held_back)
                    guarded.append(b.guarded)
                    verdicts.append((b.origin, b.guard, b.guard_threshold))
        self.assertIn(True, guarded, held)
        first = guarded.index(True)
        self.assertGreater(first, 0)
        self.assertGreater(held[first - 1], 1.2)
        self.assertEqual(held[first], 0.0)
        self.assertTrue(all(h <= 1.2 for h in held[:first - 1]), held)
        self.assertEqual(state.stats["guarded"], guarded.count(True))
        # The verdicts say it as values: the trip, then the flush; the log
        # lines come from them.
        self.assertEqual(verdicts[first - 1], ("pinned", "tripped", 1.2))
        self.assertEqual(verdicts[first], ("guard", "clear", 1.2))
        self.assertTrue(all(v == ("pinned", "clear", 1.2) for v in verdicts[:first - 1]), verdicts)
        self.assertTrue(any("accuracy guard tripped: held back %.3g" % held[first - 1] in line for line in cm.output),
                        cm.output)
        self.assertTrue(any("accuracy guard: dense with the residual" in line for line in cm.output), cm.output)

    def test_momentum_masking_reaches_the_engine(self):
        # Top-k 50 % of a constant bucket with momentum 0.5 through the
        # ABI's momentum_masking: masking zeroes u where the payload sent,
        # so from the second engine step the outputs differ.
        def run(masking):
            state = self.state("topk:0.5", momentum=0.5, momentum_masking=masking)
            torch.manual_seed(5)
            return [gct.hook(state, workers.FakeBucket(torch.randn(64))).wait().clone() for _ in range(5)]
        plain, masked = run(False), run(True)
        self.assertTrue(all(torch.equal(a, b) for a, b in zip(plain[:3], masked[:3])))
        self.assertFalse(torch.equal(plain[4], masked[4]))

    def test_schedule_ramps_to_the_target(self):
        # Hook steps 0-1 plain, engine step 0 (hook step 2) and 1 in phase 1
        # (topk:0.25), then the target topk:0.02, as the engine's stats say.
        state = self.state("topk:0.02", schedule=[(2, "topk:0.25")])
        reasons = []
        for _ in range(6):
            gct.hook(state, workers.FakeBucket(torch.randn(1000))).wait()
            if state.last_step is not None:
                reasons.append(state.last_step.buckets[0].reason)
        self.assertIn("schedule phase 1 of 2: topk:0.25", reasons[0])
        self.assertIn("schedule phase 2 of 2: topk:0.02", reasons[-1])
        # Under the cost model: it decides for the target; the phases still
        # name themselves in the compressed buckets' reasons.
        auto = self.state("topk:0.02", decision="auto", schedule=[(2, "topk:0.25")])
        for _ in range(6):
            gct.hook(auto, workers.FakeBucket(torch.randn(1000))).wait()
        self.assertIn("schedule phase 2 of 2: topk:0.02", auto.last_step.buckets[0].reason)
        with self.assertRaises(ValueError):
            gct.State("topk:0.02", schedule=[(0, "topk:0.25")])
        with self.assertRaises(ValueError) as cm:  # a phase harsher than the target
            state = self.state("topk:0.1", schedule=[(2, "topk:0.01")])
            for _ in range(3):
                gct.hook(state, workers.FakeBucket(torch.randn(1000))).wait()
        self.assertIn("compresses more than the next", str(cm.exception))
        with self.assertRaises(TypeError):
            gct.State("topk:0.02", schedule=[5])

    def test_random_k_below_the_safe_ratio_warns(self):
        state = self.state("randomk:0.01")
        with self.assertLogs("gradcomp", "WARNING") as cm:
            self.run_steps(state, lambda: torch.randn(1000), 3)
            # A step's lines come with its statistics, after its averages:
            # out once the State is read (or the next step begins).
            self.assertEqual(state.stats["engine_steps"], 1)
        self.assertEqual(state.last_step.buckets[0].caution, "random-k-ratio")
        self.assertEqual(sum("caution random-k-ratio" in line for line in cm.output), 1, cm.output)

    def test_exact_codec_returns_the_gradient(self):
        state = self.state("none")
        given, out = self.run_steps(state, lambda: torch.randn(1000), 4)
        self.assertTrue(torch.equal(given, out))
        self.assertEqual(state.stats["plain_steps"], 2)
        self.assertEqual(state.stats["engine_steps"], 2)
        self.assertEqual(state.engine.sizes, [1000])

    def test_other_dtypes_and_strides_are_staged(self):
        for name, make in [
            ("float64", lambda: torch.randn(1000, dtype=torch.float64)),
            ("float16", lambda: torch.randn(1000).half()),
            ("strided", lambda: torch.randn(2000)[::2]),
        ]:
            with self.subTest(name):
                state = self.state("none")
                given, out = self.run_steps(state, make, 3)
                self.assertEqual(out.dtype, given.dtype)
                self.assertTrue(torch.equal(out, given.float().to(given.dtype)))
                self.assertEqual(state.stats["engine_steps"], 1)

    def test_refused_buckets(self):
        state = self.state("int8")
        with self.assertRaises(TypeError):
            gct.hook(state, workers.FakeBucket(torch.zeros(10, dtype=torch.int32)))

        class CudaTensor:
            device = torch.device("cuda", 0)

        if not gradcomp.has_cuda():
            with self.assertRaises(NotImplementedError) as cm:
                gct.hook(state, workers.FakeBucket(CudaTensor()))
            self.assertIn("libgradcomp_cuda.so", str(cm.exception))
        with self.assertRaises(NotImplementedError):
            gct.hook(state, workers.FakeBucket(torch.zeros(10, device="meta")))

    def test_engine_too_large_for_the_machine_is_a_memory_error(self):
        # 256 buckets of 2^31 - 1 elements: refused before anything is
        # allocated (Go's allocator would end the process).
        with self.assertRaises(MemoryError) as cm:
            gradcomp.Engine("int8", [2 ** 31 - 1] * 256, workers=1)
        self.assertIsInstance(cm.exception, gradcomp.OutOfMemoryError)
        self.assertEqual(cm.exception.status, gradcomp.Status.NOMEM)

    def test_layout_change_is_an_error(self):
        state = self.state("int8")
        self.run_steps(state, lambda: torch.randn(1000), 3)
        with self.assertRaises(ValueError) as cm:
            gct.hook(state, workers.FakeBucket(torch.randn(999)))
        self.assertIn("999 elements", str(cm.exception))
        self.assertIn("[1000]", str(cm.exception))
        self.assertIsNone(state.engine)  # the step was abandoned with the engine
        with self.assertRaises(ValueError):  # and the State says so from then on
            gct.hook(state, workers.FakeBucket(torch.randn(1000)))

    def test_error_feedback_keeps_the_residual(self):
        # One rank: the averaged bucket is D(C(e + g)); with error feedback,
        # what is not sent now is sent later, so the sum of outputs tracks
        # the sum of inputs much better than without.
        torch.manual_seed(0)
        grads = [torch.randn(4096) for _ in range(12)]
        sent = {}
        for ef in (True, False):
            state = self.state("topk:0.02", error_feedback=ef)
            total = torch.zeros(4096)
            for g in grads:
                total += gct.hook(state, workers.FakeBucket(g.clone())).wait()
            sent[ef] = float((total - sum(grads)).norm())
        self.assertLess(sent[True], 0.8 * sent[False], sent)

    def test_nonfinite_bucket(self):
        for mode in ("dense", "raise"):
            for overlap in (True, False):
                with self.subTest(on_nonfinite=mode, overlap=overlap):
                    state = self.state("topk:0.1", on_nonfinite=mode, overlap=overlap)
                    self.run_steps(state, lambda: torch.randn(1000), 3)
                    bad = torch.randn(1000)
                    bad[7] = float("inf")
                    fut = gct.hook(state, workers.FakeBucket(bad.clone()))
                    if mode == "raise":
                        with self.assertRaises(FloatingPointError) as cm:
                            fut.wait()
                        self.assertIsInstance(cm.exception, gradcomp.NonFiniteError)
                        self.assertIn("bucket 0", str(cm.exception))
                    else:
                        self.assertTrue(torch.equal(fut.wait(), bad))  # one rank: the dense average is the bucket
                    self.assertEqual(state.stats["nonfinite"], 1)
                    given, out = self.run_steps(state, lambda: torch.randn(1000), 1)
                    self.assertTrue(bool(torch.isfinite(out).all()))
                    self.assertFalse(state.last_step.buckets[0].nonfinite)

    def test_decisions_are_logged_and_summarized(self):
        state = self.state("topk:0.1")
        self.assertIn("no engine step yet", state.summary())
        with self.assertLogs("gradcomp", logging.INFO) as logs:
            self.run_steps(state, lambda: torch.randn(1000), 5)
        decisions = [m for m in logs.output if "bucket 0 (1000 elements)" in m]
        self.assertEqual(len(decisions), 1, logs.output)  # one line per decision, not per step
        self.assertIn("sparse-gather, compressed", decisions[0])
        self.assertEqual((state.last_step.buckets[0].origin, state.last_step.buckets[0].caution), ("pinned", "none"))
        table = state.summary()
        for word in ("bucket", "sparse-gather", "compressed", "pinned", "1000", "reason"):
            self.assertIn(word, table)
        self.assertEqual(state.stats["compressed"], 3)

    def test_state_dict_checks(self):
        state = self.state("int8")
        with self.assertRaises(ValueError):
            state.load_state_dict({"format": "something else"})
        self.run_steps(state, lambda: torch.randn(1000), 3)
        saved = state.state_dict()
        other = self.state("sign")
        with self.assertRaises(ValueError) as cm:
            other.load_state_dict(saved)
        self.assertIn("sign", str(cm.exception))
        bigger = self.state("int8", model=torch.nn.Linear(10, 10))  # 110 parameters
        with self.assertRaises(ValueError) as cm:
            bigger.load_state_dict(saved)
        self.assertIn("110", str(cm.exception))
        self.assertIsNone(bigger.state_dict()["engine"])  # nothing changed
        state.load_state_dict(state.state_dict())
        fresh = self.state("int8")
        fresh.load_state_dict(saved)
        self.assertEqual(fresh.state_dict(), saved)  # kept until the engine exists


class Ranks(unittest.TestCase):
    """2 or 4 spawned gloo ranks."""

    def test_host_carries_out_every_collective(self):
        results = ranks.run(workers.hosted_ops, WORLD, timeout=120)
        for rank, r in enumerate(results):
            with self.subTest(rank=rank):
                self.assertEqual(r["allreduce_written"], 12)
                self.assertEqual(r["allreduce"], [10.0, 12.0, 2.0])  # sums over ranks 0..3
                self.assertEqual(r["allgather_written"], 2 * WORLD)
                self.assertEqual(r["allgather"], [v for q in range(WORLD) for v in (q, 10 + q)])
                col = [sum(q * 100 + 2 * rank + j for q in range(WORLD)) for j in range(2)]
                self.assertEqual(r["reducescatter"], [float(v) for v in col])
                self.assertEqual(r["alltoall"], [q * 16 + 2 * rank + j for q in range(WORLD) for j in range(2)])
                self.assertEqual(r["broadcast"], [WORLD] * 3)
                self.assertEqual(r["barrier_written"], 0)
                self.assertEqual(r["empty_allreduce"], 0)
                for name, err in r["errors"].items():
                    self.assertIsNotNone(err, name)

    def test_mismatched_configs_raise_value_error_on_every_rank(self):
        variants = [
            [dict(spec="topk:0.01", decision="compressed", warmup_steps=2), dict(spec="int8", decision="compressed",
                                                                                 warmup_steps=2)],
            [dict(warmup_steps=3), dict(warmup_steps=4)],
            [dict(decision="compressed"), dict(decision="dense")],
            [dict(on_nonfinite="raise"), dict(on_nonfinite="dense")],
            [dict(strategy="sra"), dict(strategy="allgather")],
            [dict(error_feedback=True), dict(error_feedback=False)],
            [dict(guard=2.0), dict(guard=3.0)],
        ]
        results = ranks.run(workers.mismatched_configs, WORLD, variants, timeout=150)
        for rank, per_variant in enumerate(results):
            for v, (variant, got) in enumerate(zip(variants, per_variant)):
                with self.subTest(rank=rank, variant=variant):
                    self.assertIsNotNone(got, "rank %d trained on without an error" % rank)
                    self.assertTrue(got["is_value_error"], got)
                    self.assertEqual(got["step"], 2, got)  # the engine's handshake, at the first step after DDP's two
                    self.assertLess(got["seconds"], 20, got)  # no collective timeout
                    self.assertIn("ranks disagree", got["message"])
        messages = [per_variant[0]["message"] for per_variant in results]
        self.assertIn("topk:0.01", messages[0])
        self.assertIn("int8", messages[0])
        self.assertIn("warm-up", results[0][1]["message"])
        self.assertIn("decision", results[0][2]["message"])
        self.assertIn("strategy", results[0][4]["message"])
        self.assertIn("error feedback", results[0][5]["message"])
        self.assertIn("accuracy guard", results[0][6]["message"])

    def test_invalid_setting_on_one_rank_fails_every_rank(self):
        # Settings the State passes on and the engine refuses when it is
        # created (step 2): the rank that has one still takes part in the
        # handshake, so every rank fails at once, naming it.
        variants = [
            [dict(timeout=30), dict(timeout=30, workers=-1)],
            [dict(timeout=30), dict(timeout=30, schedule="10@nonsense")],
        ]
        results = ranks.run(workers.mismatched_configs, 2, variants, timeout=150)
        for rank, per_variant in enumerate(results):
            for variant, got in zip(variants, per_variant):
                with self.subTest(rank=rank, variant=variant):
                    self.assertIsNotNone(got, "rank %d trained on without an error" % rank)
                    self.assertTrue(got["is_value_error"], got)
                    self.assertEqual(got["step"], 2, got)
                    self.assertLess(got["seconds"], 15, got)  # not the 30 s timeout
                    self.assertIn("rank 1", got["message"])
        self.assertIn("workers", results[0][0]["message"])
        self.assertIn("nonsense", results[0][1]["message"])

    def test_nan_bucket_goes_dense_or_raises(self):
        results = ranks.run(workers.nonfinite_bucket, WORLD, "topk:0.01", 1, timeout=150)
        for rank, per_mode in enumerate(results):
            dense, raised = per_mode["dense"], per_mode["raise"]
            with self.subTest(rank=rank, mode="dense"):
                self.assertEqual(dense["buckets"], 2)
                self.assertIsNone(dense["error"])
                self.assertEqual(dense["after_nan"]["nonfinite"], 2)
                self.assertTrue(dense["grads_nan"], "the dense exchange spreads the NaN, as the default hook does")
                self.assertTrue(dense["clean_finite"])
                self.assertEqual(dense["after_clean"]["compressed"], dense["after_nan"]["compressed"] + 2)
            with self.subTest(rank=rank, mode="raise"):
                err = raised["error"]
                self.assertIsNotNone(err, "no error on rank %d" % rank)
                self.assertTrue(err["is_fpe"], err)
                self.assertEqual(err["type"], "NonFiniteError")
                self.assertIn("bucket", err["message"])
                self.assertIn("rank 1", err["message"])
                self.assertTrue(raised["clean_finite"], "the State stays usable after the error")
                self.assertEqual(raised["after_clean"]["compressed"], raised["before"]["compressed"] + 2)

    def test_engine_checkpoint_resume_is_bit_exact(self):
        specs = ["int8", "topk:0.05", "randomk:0.1", "sign"]
        results = ranks.run(workers.engine_resume, WORLD, specs, 5, 2, timeout=150)
        for rank, per_spec in enumerate(results):
            for spec in specs:
                with self.subTest(rank=rank, spec=spec):
                    r = per_spec[spec]
                    self.assertTrue(r["averages_equal"])
                    self.assertTrue(r["state_equal"])
                    self.assertEqual(r["next_step"], 5)

    def test_hook_checkpoint_resume_and_refusals(self):
        results = ranks.run(workers.checkpoint_resume, WORLD, "int8", 9, 4, timeout=200)
        for rank, r in enumerate(results):
            with self.subTest(rank=rank):
                self.assertTrue(r["pending_same"])
                self.assertEqual(r["saved_next_step"], 2)  # steps 2, 3 ran on the engine
                # The resumed State's engine continues from the saved state at
                # once (its first two steps staged while DDP rebuilds).
                self.assertEqual(r["resumed_next_step"], 2 + (9 - 4))
                self.assertEqual(r["resumed_iter"], 9)
                self.assertEqual(r["stats"]["compressed"], 5)
                self.assertTrue(r["finite"])
                # Where the last step's time went: every part measured.
                split = r["split"]
                self.assertEqual(set(split), {"backward", "encode", "wire", "handoff", "decode", "exposed"})
                self.assertTrue(all(v >= 0 for v in split.values()), split)
                self.assertGreater(split["wire"], 0, split)
                self.assertGreater(split["encode"], 0, split)
                for name, refusal in r["refusals"].items():
                    with self.subTest(refusal=name):
                        self.assertTrue(refusal["refused"], refusal)
                        self.assertTrue(refusal["unchanged"], refusal)
                        self.assertTrue(refusal.get("usable", True), refusal)
                self.assertIn("int8", r["refusals"]["other spec"]["message"])
                self.assertTrue(r["other_strategy_reshape"])
                self.assertIn("guard", r["refusals"]["other guard (engine state)"]["message"])
                self.assertTrue(r["relabeled_reshape"])
                self.assertIn("4810", r["refusals"]["other model (model=)"]["message"])
                self.assertIn("9610", r["refusals"]["other model (engine)"]["message"])

    def test_unused_parameters(self):
        # DDP(find_unused_parameters=True) all-reduces its used-parameter
        # map on its own group while the engine's collectives run: they
        # must not meet on one gloo group (they did: the ranks issued
        # collectives of different sizes, or hung).
        for case in ("alternate", "per rank", "no_sync"):
            with self.subTest(case=case):
                results = ranks.run(workers.unused_parameters, 2, "int8", case, 9, timeout=150)
                for rank, r in enumerate(results):
                    self.assertTrue(r["finite"], (rank, r))
                    self.assertEqual(r["stats"]["steps"], 9)
                    self.assertEqual(r["stats"]["plain_steps"], 2)
                    self.assertEqual(r["stats"]["compressed"], 7)  # one bucket, 7 engine steps
                    self.assertLess(r["seconds"], 20)  # no collective waited for its timeout
                self.assertEqual(results[0]["params"], results[1]["params"])  # the ranks agree
        # Without find_unused_parameters, DDP refuses the step after one
        # with an unused parameter, under this hook as under its own.
        results = ranks.run(workers.unused_parameters, 2, "int8", "not found", 9, timeout=150)
        for rank, r in enumerate(results):
            self.assertIn("Expected to have finished reduction", r["error"] or "", (rank, r))
            self.assertLess(r["seconds"], 20)

    def test_buckets_in_a_different_order_on_each_rank(self):
        # The engine launches bucket i's exchange once buckets 0..i are
        # ready, whatever order each rank hands them over in; so does DDP's
        # own all-reduce of the engine's dense buckets.
        for spec in ("none", "int8"):
            with self.subTest(spec=spec):
                results = ranks.run(workers.bucket_orders, 3, spec, 5, timeout=120)
                for rank, r in enumerate(results):
                    self.assertEqual(r["averages"], results[0]["averages"], rank)
                    self.assertEqual(r["compressed"], 0 if spec == "none" else 9)
                    # Every dense bucket-step of the engine (3 steps after the
                    # 2 plain ones; int8 has no engine warm-up step) went to
                    # DDP's all-reduce.
                    self.assertEqual(r["native"], r["dense"] - 3 * r["plain_steps"], r)
                    self.assertEqual(r["native"], 9 if spec == "none" else 0, r)
                    self.assertEqual(r["engine_steps"], 3, r)
                    # Steps DDP's all-reduce carried whole are settled at the
                    # next step's start or when the State is read, without
                    # the finisher thread the engine's exchanges need.
                    self.assertEqual(r["finisher"], spec != "none", r)
                    # Its split ends with the last all-reduce, not when read.
                    self.assertGreaterEqual(r["split"]["exposed"], 0, r)
                    self.assertLessEqual(r["split"]["exposed"], r["exposed_bound"], r)
                if spec == "none":  # the engine's steps: multiples of 1/64, summed exactly in any order, then /N
                    self.assertEqual(results[0]["averages"][2:], results[0]["exact"][2:])

    def _resume(self, world, spec, cut, warmup, steps=11):
        with tempfile.TemporaryDirectory(prefix="gradcomp-resume-") as d:
            path = os.path.join(d, "ckpt")
            straight = ranks.run(workers.resume_exact, world, spec, steps, cut, warmup, "straight", path, timeout=200)
            resumed = ranks.run(workers.resume_exact, world, spec, steps, cut, warmup, "resume", path, timeout=200)
        for rank in range(world):
            with self.subTest(world=world, spec=spec, cut=cut, warmup=warmup, rank=rank):
                self.assertEqual(resumed[rank]["params"], straight[rank]["params"])
                self.assertEqual(resumed[rank]["stats"]["plain_steps"], 0)
                self.assertEqual(resumed[rank]["stats"]["engine_steps"], steps - cut)

    def test_resume_is_bit_exact_at_2_ranks(self):
        # Saved after compression began, and inside the warm-up.
        self._resume(2, "int8", cut=7, warmup=4)
        self._resume(2, "topk:0.01", cut=3, warmup=5)
        # PowerSGD: its residuals and warm-start Q's travel in state_dict.
        self._resume(2, "powersgd:2", cut=7, warmup=4)

    def test_resume_is_bit_exact_at_4_ranks(self):
        self._resume(4, "int8", cut=7, warmup=4)
        self._resume(4, "randomk:0.25", cut=3, warmup=5)

    def _check_bytes(self, world):
        n = 200000
        configs = [("int8", "auto"), ("int4", "auto"), ("sign", "auto"), ("topk:0.01", "auto"),
                   ("randomk:0.01", "auto"), ("none", "dense")]
        results = ranks.run(workers.bytes_sent, world, configs, n, timeout=300)
        k = n // 100
        ring = 2 * (world - 1) / world
        # A quantizer's payload: n·bits/8 bytes of codes and, per 512-element
        # bucket, its float32 (min, scale), or sign's one scale. At 2 ranks
        # the engine all-gathers the payloads, (N−1)·S, the same volume as
        # SRA's 2(N−1)/N·S there, in one collective.
        quant = lambda bits, scale: ("sra" if world > 2 else "allgather", ring * (n * bits / 8 + scale * n / 512))
        formulas = {
            "int8 auto": quant(8, 8),
            "int4 auto": quant(4, 8),
            "sign auto": quant(1, 4),
            "topk:0.01 auto": ("sparse-gather", (world - 1) * k * 8),
            "randomk:0.01 auto": ("shared-index", ring * k * 4),
            "none dense": ("dense", ring * 4 * n),
        }
        for rank, r in enumerate(results):
            for name, (strategy, formula) in formulas.items():
                with self.subTest(world=world, rank=rank, config=name):
                    got = r[name]
                    self.assertEqual(got["strategy"], strategy)
                    self.assertEqual(got["elements"], n)
                    self.assertGreaterEqual(got["bytes"], int(formula), got)
                    self.assertLessEqual(got["bytes"], 1.05 * formula, got)  # headers and statuses: < 5 %

    def test_bytes_sent_match_the_formulas_at_2_ranks(self):
        self._check_bytes(2)

    def test_bytes_sent_match_the_formulas_at_8_ranks(self):
        self._check_bytes(8)

    def test_dead_peer_is_a_comm_error_on_the_others(self):
        results = ranks.run(workers.peer_dies, 3, "int8", 2, 5.0, timeout=120, dies=(2,))
        for rank, r in enumerate(results[:2]):
            with self.subTest(rank=rank):
                step, after = r
                self.assertIsNotNone(step, "rank %d trained on past a dead peer" % rank)
                self.assertTrue(step["is_comm"], step)
                self.assertLess(step["seconds"], 5.0 + 10, step)  # within the collective timeout
                self.assertIsNotNone(after)
                self.assertTrue(after["is_comm"], after)  # the State stays broken, saying why
                self.assertLess(after["seconds"], 1.0, after)

    def test_hook_returns_while_the_exchange_runs(self):
        # Rank 1 reaches its hook 1 s late: rank 0's overlapped hook returns
        # a future not yet completed; with overlap=False it returns a
        # completed one. Both give the same bits on every rank.
        results = ranks.run(workers.late_rank, 2, "topk:0.05", 1.0, timeout=150)
        first = results[0]
        self.assertTrue(first["True"]["returned_pending"])
        self.assertFalse(first["False"]["returned_pending"])
        for rank, r in enumerate(results):
            with self.subTest(rank=rank):
                self.assertEqual(r["True"]["result"], first["True"]["result"])
                self.assertEqual(r["True"]["result"], r["False"]["result"])
                self.assertEqual(r["True"]["compressed"], 2)
                self.assertEqual(r["False"]["compressed"], 2)


class Hier(unittest.TestCase):
    """strategy="hier" on 4 gloo ranks as 2 nodes × 2
    (GRADCOMP_RANKS_PER_NODE=2)."""

    def test_dense_matches_the_all_reduce_average(self):
        results = ranks.run(workers.hier_dense, WORLD, 2, 6, timeout=200)
        for rank, r in enumerate(results):
            with self.subTest(rank=rank):
                self.assertEqual(r["topology"], [rank // 2, 2, rank % 2, 2])
                self.assertEqual(r["engine_steps"], 4)
                self.assertEqual(set(r["strategy"]), {"hier"})
                self.assertIn("hierarchical (2 nodes × 2 ranks", r["reason"])
                self.assertGreater(r["ops_by_group"].get("node", 0), 0, r["ops_by_group"])
                self.assertGreater(r["ops_by_group"].get("cross", 0), 0, r["ops_by_group"])
                self.assertLess(r["max_diff"], 1e-5)  # the same average, summed in another order

    def test_int8_trains_close_to_flat(self):
        results = ranks.run(workers.hier_train, WORLD, 2, 3, 0, timeout=300)
        r = results[0]
        self.assertEqual(r["int8 hier"]["strategy"], "hier")
        self.assertGreater(r["int8 hier"]["compressed"], 0)
        for name in ("int8 flat", "default"):
            with self.subTest(against=name):
                self.assertGreater(r["int8 hier"]["accuracy"], r[name]["accuracy"] - 0.03, r)
                self.assertLess(r["int8 hier"]["loss"], r[name]["loss"] * 1.25 + 0.02, r)
        for other in results[1:]:
            self.assertEqual(other["int8 hier"]["accuracy"], r["int8 hier"]["accuracy"])

    def test_state_dict_round_trip_and_other_layout_refused(self):
        results = ranks.run(workers.hier_checkpoint, WORLD, 2, 4, 8, 5, timeout=300)
        for rank, r in enumerate(results):
            with self.subTest(rank=rank):
                self.assertEqual(r["saved_next_step"], 3)  # hook steps 2, 3, 4 ran on the engine
                self.assertEqual(r["resumed_next_step"], 3 + 3)
                self.assertEqual(r["iter"], 8)
                self.assertTrue(r["finite"])
                self.assertTrue(r["pending_reshape"])  # another layout loads across shapes, before the engine
                for where, refusal in r["refusals"].items():
                    with self.subTest(where=where):
                        self.assertTrue(refusal["refused"], refusal)
                        self.assertIn("layout", refusal["message"])
                        self.assertIn("2 nodes × 2 ranks", refusal["message"])
                        self.assertIn("1 nodes × 4 ranks", refusal["message"])

    def test_node_spec_codes_the_node_stages(self):
        results = ranks.run(workers.hier_node_spec, WORLD, 2, 6, timeout=300)
        for rank, r in enumerate(results):
            with self.subTest(rank=rank):
                self.assertEqual(r["bf16"]["strategy"], "hier")
                self.assertLess(r["fp32"]["max_diff"], 1e-5)  # the same average, summed in another order
                self.assertGreater(r["bf16"]["max_diff"], 0)  # bf16 rounds
                self.assertLess(r["bf16"]["max_diff"], 1e-2)
                self.assertLess(r["bf16"]["bytes_sent"], r["fp32"]["bytes_sent"])
                self.assertIsNotNone(r["mismatch"], "rank %d trained with node specs that differ" % rank)
                self.assertIn("node spec", r["mismatch"]["message"])

    def test_auto_chooses_a_shape_and_resumes_in_it(self):
        results = ranks.run(workers.hier_auto, WORLD, 2, 8, 5, timeout=300)
        chosen = results[0]["strategy"]
        self.assertIn(chosen, ("hier", "sra"))
        for rank, r in enumerate(results):
            with self.subTest(rank=rank):
                self.assertEqual(r["topology"], [rank // 2, 2, rank % 2, 2])
                self.assertEqual(r["strategy"], chosen)  # every rank keeps the same shape
                self.assertIn("auto on 2 nodes × 2 ranks: hierarchical", r["reason"])
                self.assertEqual(r["resumed_strategy"], chosen)
                self.assertEqual(r["resume_other"], "sra" if chosen == "hier" else "hier")
                self.assertEqual(r["saved_next_step"], 3)  # hook steps 2, 3, 4 ran on the engine
                self.assertEqual(r["resumed_next_step"], 3 + 3)
                self.assertTrue(r["finite"])

    def test_load_state_reshaped_takes_another_shape(self):
        results = ranks.run(workers.hier_reshape, WORLD, 2, timeout=300)
        for rank, r in enumerate(results):
            with self.subTest(rank=rank):
                self.assertIn("strategy", r["plain_refused"] or "")  # hier's state, a flat engine
                self.assertEqual(r["next_step"], r["saved_next_step"])
                self.assertTrue(r["finite"])
                s = r["state_reshape"]
                self.assertEqual(s["strategy"], "sra")  # one node: flat
                self.assertEqual(s["next_step"], r["saved_next_step"] + 3)
                self.assertTrue(s["finite"])

    def test_bad_layouts_fail_every_rank(self):
        cases = [[3, 3, 3, 3], [2, 2, 4, 4]]
        results = ranks.run(workers.hier_bad_layouts, WORLD, cases, timeout=150)
        for rank, per_case in enumerate(results):
            for case, got in zip(cases, per_case):
                with self.subTest(rank=rank, case=case):
                    self.assertIsNotNone(got, "rank %d made a State" % rank)
                    self.assertTrue(got["is_value_error"], got)
                    self.assertLess(got["seconds"], 20, got)
        self.assertIn("every node must hold the same number", results[0][0]["message"])
        self.assertIn("ranks disagree on GRADCOMP_RANKS_PER_NODE", results[0][1]["message"])

    def test_engine_refuses_places_the_ranks_disagree_on(self):
        results = ranks.run(workers.hier_engine_disagree, WORLD, timeout=150)
        for rank, got in enumerate(results):
            with self.subTest(rank=rank):
                self.assertIsNotNone(got)
                self.assertEqual(got["type"], "ConfigError", got)
                self.assertIn("ranks 2 and 3 both say node 1, local rank 0", got["message"])
                self.assertLess(got["seconds"], 20, got)


if __name__ == "__main__":
    unittest.main()
