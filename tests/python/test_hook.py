"""gradcomp.torch under real torch: the hook on one rank with crafted
buckets, and on 2 or 4 gloo ranks (spawned processes): mismatched specs,
NaN buckets, checkpoint/resume, the cost model, the overlapped exchange."""

import datetime
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
        for kw in [dict(cost_model="guess"), dict(on_nonfinite="ignore"), dict(probe_steps=0)]:
            with self.subTest(**kw), self.assertRaises(ValueError):
                gct.State("int8", **kw)

    def test_exact_codec_returns_the_gradient(self):
        state = gct.State("none", warmup_steps=2, cost_model="off", workers=1)
        given, out = self.run_steps(state, lambda: torch.randn(1000), 4)
        self.assertTrue(torch.equal(given, out))
        self.assertEqual(state.stats["compressed"], 2)
        self.assertEqual(state.stats["dense"], 2)

    def test_other_dtypes_and_strides_are_staged(self):
        for name, make in [
            ("float64", lambda: torch.randn(1000, dtype=torch.float64)),
            ("float16", lambda: torch.randn(1000).half()),
            ("strided", lambda: torch.randn(2000)[::2]),
        ]:
            with self.subTest(name):
                state = gct.State("none", warmup_steps=2, cost_model="off", workers=1)
                given, out = self.run_steps(state, make, 3)
                self.assertEqual(out.dtype, given.dtype)
                self.assertTrue(torch.equal(out, given.float().to(given.dtype)))
                self.assertEqual(state.stats["compressed"], 1)

    def test_refused_buckets(self):
        state = gct.State("int8", warmup_steps=2, workers=1)
        with self.assertRaises(TypeError):
            gct.hook(state, workers.FakeBucket(torch.zeros(10, dtype=torch.int32)))

        class CudaTensor:
            device = torch.device("cuda", 0)

        with self.assertRaises(NotImplementedError) as cm:
            gct.hook(state, workers.FakeBucket(CudaTensor()))
        self.assertIn("libgradcomp_cuda.so", str(cm.exception))
        with self.assertRaises(NotImplementedError):
            gct.hook(state, workers.FakeBucket(torch.zeros(10, device="meta")))

    def test_error_feedback_keeps_the_residual(self):
        # One rank: the averaged bucket is D(C(e + g)); with error feedback,
        # what is not sent now is sent later, so the sum of outputs tracks
        # the sum of inputs much better than without.
        torch.manual_seed(0)
        grads = [torch.randn(4096) for _ in range(12)]
        sent = {}
        for ef in (True, False):
            state = gct.State("topk:0.02", warmup_steps=2, cost_model="off", error_feedback=ef, workers=1)
            total = torch.zeros(4096)
            for g in grads:
                total += gct.hook(state, workers.FakeBucket(g.clone())).wait()
            sent[ef] = float((total - sum(grads)).norm())
        self.assertLess(sent[True], 0.8 * sent[False], sent)

    def test_nonfinite_bucket(self):
        for mode in ("dense", "raise"):
            for overlap in (True, False):
                with self.subTest(on_nonfinite=mode, overlap=overlap):
                    state = gct.State("topk:0.1", warmup_steps=2, cost_model="off", on_nonfinite=mode,
                                      overlap=overlap, workers=1)
                    self.run_steps(state, lambda: torch.randn(1000), 3)
                    before = state.compressor.save_state()
                    bad = torch.randn(1000)
                    bad[7] = float("inf")
                    fut = gct.hook(state, workers.FakeBucket(bad.clone()))
                    if mode == "raise":
                        with self.assertRaises(FloatingPointError) as cm:
                            fut.wait()
                        self.assertIn("bucket 0 at step 3", str(cm.exception))
                    else:
                        self.assertTrue(torch.equal(fut.wait(), bad))  # one rank: the dense average is the bucket
                    self.assertEqual(state.stats["nonfinite"], 1)
                    self.assertEqual(state.compressor.save_state(), before)
                    given, out = self.run_steps(state, lambda: torch.randn(1000), 1)
                    self.assertTrue(bool(torch.isfinite(out).all()))
                    self.assertEqual(state.stats["compressed"], 2)

    def test_cost_model_guesses_dense_on_one_rank(self):
        # One rank sends nothing: the dense exchange is free, compression
        # only costs, and the model's guess skips the probe steps.
        state = gct.State("topk:0.01", warmup_steps=3, workers=1)
        self.run_steps(state, lambda: torch.randn(100000), 6)
        self.assertEqual(state.bandwidth, float("inf"))
        self.assertEqual(state.guesses, {0: False})
        self.assertEqual(state.decisions, {0: False})
        self.assertEqual(state.stats["compressed"], 0)
        self.assertEqual(state.stats["dense"], 6)
        restored = gct.State("topk:0.01", warmup_steps=3, workers=1)
        restored.load_state_dict(state.state_dict())
        self.assertEqual((restored.guesses, restored.bandwidth), (state.guesses, state.bandwidth))

    def test_state_dict_checks(self):
        state = gct.State("int8", warmup_steps=2, workers=1)
        with self.assertRaises(ValueError):
            state.load_state_dict({"format": "something else"})
        other = gct.State("sign", warmup_steps=2, workers=1)
        with self.assertRaises(ValueError) as cm:
            state.load_state_dict(other.state_dict())
        self.assertIn("sign", str(cm.exception))
        state.load_state_dict(state.state_dict())


class FourRanks(unittest.TestCase):
    """DDP on 4 spawned gloo ranks."""

    def test_mismatched_specs_raise_on_every_rank(self):
        errors = ranks.run(workers.mismatched_specs, WORLD, ["topk:0.01", "int8"], timeout=150)
        for rank, err in enumerate(errors):
            with self.subTest(rank=rank):
                self.assertIsNotNone(err, "rank %d trained on without an error" % rank)
                # DDP re-raises the hook's ValueError from backward as a RuntimeError.
                self.assertIn("ValueError: gradcomp.torch: configuration mismatch", err)
                self.assertIn("spec=topk:0.01", err)
                self.assertIn("spec=int8", err)

    def test_nan_bucket_goes_dense(self):
        results = ranks.run(workers.nonfinite_bucket, WORLD, "topk:0.01", 1, timeout=150)
        for rank, r in enumerate(results):
            with self.subTest(rank=rank):
                self.assertEqual(r["buckets"], 2)
                self.assertEqual(r["stats_after_nan"]["nonfinite"], 2)
                self.assertTrue(r["grads_nan"], "the dense exchange spreads the NaN, as the default hook does")
                self.assertTrue(r["ef_unchanged"])
                self.assertTrue(r["clean_finite"])
                self.assertEqual(r["stats_after_clean"]["compressed"], r["stats_after_nan"]["compressed"] + 2)

    def test_checkpoint_resume_is_bit_exact(self):
        variants = [("topk:0.01", True), ("int8", True), ("sign", True), ("topk:0.01", False)]
        results = ranks.run(workers.checkpoint_resume_all, WORLD, variants, 16, 6, timeout=200)
        for rank, per_variant in enumerate(results):
            for (spec, named), r in zip(variants, per_variant):
                with self.subTest(rank=rank, spec=spec, model=named):
                    self.assertGreater(r["stats"]["compressed"], 0)
                    if named:
                        self.assertTrue(r["bit_exact"], "max |diff| %g" % r["max_abs_diff"])
                    else:
                        # Without model= the first step after the restore (DDP's
                        # buckets not yet rebuilt) goes dense, residual kept.
                        self.assertEqual(r["stats"]["layout_dense"], 1)
                        self.assertTrue(r["finite"])

    def test_cost_model_agrees_across_ranks(self):
        # Each variant: the loopback as measured, and a warm-up whose dense
        # exchanges are recorded as 5 s each (a slow link).
        results = ranks.run(workers.measured_decisions_all, 2, "topk:0.01", 10, [None, 5.0], timeout=150)
        self.assertEqual(results[0], results[1], "the ranks disagree")
        measured, slow = results[0]
        for name, r in [("measured", measured), ("slow", slow)]:
            with self.subTest(name):
                self.assertIn("0", r["guesses"])
                self.assertIn("0", r["decisions"])
                compressed = r["stats"].get("compressed", 0)
                # 3 warm-up steps; a compress guess is probed for 2 steps,
                # then 5 steps go the decided way; a dense guess never compresses.
                if not r["guesses"]["0"]:
                    self.assertFalse(r["decisions"]["0"])
                    self.assertEqual(compressed, 0)
                else:
                    self.assertEqual(compressed, 7 if r["decisions"]["0"] else 2)
        # 9,610 float32 in 5 s: 2·(2−1)/2·38,440 bytes / 5 s.
        self.assertAlmostEqual(slow["bandwidth"], 38440 / 5.0)
        self.assertEqual(slow["guesses"], {"0": True})
        self.assertEqual(slow["decisions"], {"0": True})
        self.assertGreater(measured["bandwidth"], 100 * slow["bandwidth"])


class Overlap(unittest.TestCase):
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
                self.assertEqual(r["True"]["stats"], r["False"]["stats"])
                self.assertEqual(r["True"]["stats"]["compressed"], 2)


if __name__ == "__main__":
    unittest.main()
