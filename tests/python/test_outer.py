"""gradcomp.outer.DiLoCo on gloo ranks (the rank side is outer_workers.py):
DiLoCo (codec none, Nesterov; H = 1 and 10) against a plain torch
reference, also through host mirrors (a non-contiguous tensor; every
tensor in the fake-device test mode, where CPU tensors take the CUDA
branch); the streaming schedule (F = 2, τ = 1, α = 0.5, int4 with error
feedback); SparseLoCo's settings and their bytes; a non-finite sync
skipped or raised; ranks that disagree; a bit-exact resume; two levels
(DDP, and FSDP2 under torch 2.x, inside 2 workers of 2 ranks, the loop
across the workers) against the 2-worker reference; states loaded at
another number of workers (4 → 2 → 4, None where the saved job had no such
rank). Four spawns in all, to stay within about a minute on 2 cores."""

import os
import unittest

import torch

import outer_workers
import ranks
from libpath import require_library

try:
    from torch.distributed.fsdp import fully_shard
except Exception as e:  # ImportError; torch 1.13's fsdp package fails on Python 3.11 with a ValueError
    fully_shard, _why = None, "%s: %s" % (type(e).__name__, e)

HERE = os.path.dirname(os.path.abspath(__file__))
FAKE_LIB = os.path.join(os.path.dirname(os.path.dirname(HERE)), "plugin", "python", "gradcomp", "libgradcomp_fake.so")

#: float32 rounding: the library's outer step rounds each product on its
#: own, torch's SGD may fuse them; a few ulps of values of order 1.
ROUNDING = 1e-5


def setUpModule():
    require_library()


_two_ranks = []


def two_ranks():
    """outer_workers.two_ranks's results, from one spawn shared by the
    tests that read them."""
    if not _two_ranks:
        _two_ranks.append(ranks.run(outer_workers.two_ranks, 2, timeout=240))
    return _two_ranks[0]


def schedule(step, sync_every, fragments, delay):
    """The fragments the package doc's schedule starts and finishes at
    ``step``: f starts at s ≥ off_f = ⌊(f+1)·H/F⌋ with (s − off_f) mod H =
    0 and finishes τ steps later."""
    def starts(s):
        return [f for f in range(fragments) if s >= (f + 1) * sync_every // fragments
                and (s - (f + 1) * sync_every // fragments) % sync_every == 0]
    return starts(step), starts(step - delay) if step > delay else []


class TwoRanks(unittest.TestCase):
    """One 2-rank spawn runs every 2-rank case (outer_workers.two_ranks)."""

    @classmethod
    def setUpClass(cls):
        cls.out = two_ranks()

    def test_diloco_equals_the_torch_reference(self):
        for r, out in enumerate(self.out):
            for case, syncs in (("diloco_h1", 3), ("diloco_h10", 2), ("diloco_h10_noncontiguous", 2)):
                got = out[case]
                self.assertLess(got["diff"], ROUNDING, "rank %d, %s: differs from the reference" % (r, case))
                self.assertEqual(sum(len(rep[2]) for rep in got["reports"]), syncs, case)
            self.assertFalse(out["diloco_h10"]["mirrored"])
            self.assertTrue(out["diloco_h10_noncontiguous"]["mirrored"])
            self.assertEqual(out["diloco_h10_noncontiguous"]["global"], out["diloco_h10"]["global"],
                             "rank %d: the mirrored tensor changed the results" % r)
            self.assertEqual(out["diloco_h10_noncontiguous"]["params"], out["diloco_h10"]["params"])
            self.assertEqual([rep[:4] for rep in out["diloco_h1"]["reports"]],
                             [[s, [0], [0], []] for s in (1, 2, 3)])

    def test_streaming_follows_the_schedule(self):
        for r, out in enumerate(self.out):
            st = out["streaming"]
            self.assertEqual((st["fragments"], st["fragment_of"]), (2, [0, 1, 1]))  # 128 | 8 + 40 elements
            for step, started, finished, skipped, sent in st["reports"]:
                want = schedule(step, 6, 2, 1)
                self.assertEqual((started, finished), want, "rank %d, step %d" % (r, step))
                self.assertEqual(skipped, [])
                self.assertEqual(sent > 0, bool(finished))
            self.assertTrue(st["globals_equal"], "the ranks' global weights differ")

    def test_sparseloco_sends_little(self):
        for out in self.out:
            sp = out["sparseloco"]
            self.assertEqual(sp["syncs"], 2)
            self.assertLess(sp["bytes"], sp["dense_bytes"] / 4, sp)

    def test_nonfinite_skips_or_raises(self):
        for r, out in enumerate(self.out):
            nf = out["nonfinite"]
            self.assertEqual(nf["skip"]["report"][:4], [2, [0], [0], [0]])
            self.assertIsNone(nf["skip"]["raised"])
            self.assertIsNone(nf["raise"]["report"])
            self.assertIn("fragment 0's sync of step 2 skipped", nf["raise"]["raised"])
            for policy in ("skip", "raise"):
                self.assertTrue(nf[policy]["global_unchanged"], policy)
            self.assertEqual(len(nf["warnings"]), 1, nf["warnings"])
            self.assertIn("inner step 2: fragment 0's sync skipped on every rank", nf["warnings"][0])

    def test_ranks_that_disagree_fail_alike(self):
        for out in self.out:
            self.assertIn("ranks disagree on SyncEvery: rank 1 has 5, rank 0 has 4", out["mismatch"])

    def test_resume_is_bit_exact(self):
        for r, out in enumerate(self.out):
            res = out["resume"]
            self.assertTrue(res["reports_equal"] and res["global_equal"] and res["params_equal"], "rank %d" % r)
            self.assertIn("not a state_dict of format gradcomp.outer/1", res["refused"])
            self.assertEqual(res["world"], 2)


class FakeDevice(unittest.TestCase):
    """The CUDA branch without a GPU: every tensor through a host mirror,
    the same results as the CPU branch's."""

    def test_mirrors_give_the_cpu_branch_results(self):
        if not os.path.exists(FAKE_LIB):
            self.skipTest("libgradcomp_fake.so is not built (run `make plugin`): %s" % FAKE_LIB)
        fake = ranks.run(outer_workers.fake_device, 2, timeout=240)
        cpu = two_ranks()
        for r in range(2):
            self.assertEqual(fake[r]["library"], "libgradcomp_fake.so")
            self.assertTrue(fake[r]["mirrored"])
            self.assertLess(fake[r]["diff"], ROUNDING)
            self.assertEqual(fake[r]["streaming"]["reports"], cpu[r]["streaming"]["reports"])
            self.assertEqual(fake[r]["streaming"]["global"], cpu[r]["streaming"]["global"])


class TwoLevel(unittest.TestCase):
    """4 ranks as 2 workers × 2: DDP or FSDP2 inside a worker, the loop
    across the workers, each local rank on its cross-worker group; 6
    inner steps, H = 3, so that the ranks end on a sync."""

    def check(self, out):
        for r, o in enumerate(out):
            self.assertTrue(o["identical"], "rank %d: the ranks' parameters differ" % r)
            self.assertLess(o["diff"], ROUNDING, "rank %d: differs from the 2-worker reference" % r)

    def test_ddp_inside_workers(self):
        out = ranks.run(outer_workers.two_level, 4, "ddp", 6, 3, timeout=240)
        self.check(out)
        for r, o in enumerate(out):
            self.assertFalse(o["mirrored"])
            self.assertEqual(o["reshape"], {"to2": True, "to4": True, "world": 4}, "rank %d" % r)

    def test_fsdp2_inside_workers(self):
        if fully_shard is None:
            self.skipTest("torch %s has no FSDP2 (torch.distributed.fsdp.fully_shard: %s): it needs torch 2.x"
                          % (torch.__version__, _why))
        out = ranks.run(outer_workers.two_level, 4, "fsdp2", 6, 3, timeout=240)
        self.check(out)
        for o in out:
            self.assertTrue(o["mirrored"], "DTensor shards go through mirrors")


if __name__ == "__main__":
    unittest.main()
