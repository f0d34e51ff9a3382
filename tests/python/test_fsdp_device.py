"""gradcomp.fsdp's CUDA branch, end to end without a GPU: in the
fake-device test mode (GRADCOMP_FAKE_DEVICE=1, libgradcomp_fake.so) the
FSDP hook hands the reduce outputs (CPU tensors) in place to the device
engine on its own NCCL communicator (the mock libnccl.so.2), bootstrapped
through torch.distributed's store over the replicate group. On 4 gloo
ranks as 2 replicas × 2 shards, the same training through the host engine
and through the device engine must give the same parameters bit for bit,
the device engine without a Python host, with no torch collective on the
replicate group after its bootstrap and its Wait off the hook's thread; a
spec that differs in one replicate group fails every rank of the job.
Skipped on a torch without FSDP2 (Debian's 1.13)."""

import os
import unittest

import torch

try:
    from torch.distributed.fsdp import fully_shard
except Exception as e:  # ImportError; torch 1.13's fsdp package fails on Python 3.11 with a ValueError
    fully_shard, _why = None, "%s: %s" % (type(e).__name__, e)

import ranks
from libpath import require_library

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MOCK = os.path.join(ROOT, "build", "mocknccl", "libnccl.so.2")
FAKE_LIB = os.path.join(ROOT, "plugin", "python", "gradcomp", "libgradcomp_fake.so")
WORLD = 4
STEPS, MISMATCH_STEPS = 5, 3
PINNED = dict(decision="compressed", warmup_steps=2, workers=1)
#: (spec, steps, hidden width, FSDPState keywords); warm-up 2: a plain step, a dense engine step, 3 compressed.
CASES = [("int8", STEPS, 24, PINNED), ("topk:0.1", STEPS, 24, PINNED),
         ("powersgd:4:min_compression=1", STEPS, 64, PINNED)]


def setUpModule():
    if fully_shard is None:
        raise unittest.SkipTest("torch %s has no FSDP2 (torch.distributed.fsdp.fully_shard: %s): gradcomp.fsdp "
                                "needs torch 2.x" % (torch.__version__, _why))
    require_library()
    for path, what in ((MOCK, "the mock libnccl.so.2"), (FAKE_LIB, "libgradcomp_fake.so")):
        if not os.path.exists(path):
            raise unittest.SkipTest("%s is not built (run `make plugin`): %s" % (what, path))


class FSDPDeviceBranch(unittest.TestCase):
    """FSDP2 through the device engine on fake devices against the host
    engine: one spawn of 4 ranks each (setUpClass)."""

    @classmethod
    def setUpClass(cls):
        import fsdp_device_workers as w

        cls.host = ranks.run(w.fsdp_device, WORLD, False, MOCK, CASES, MISMATCH_STEPS, timeout=240)
        cls.dev = ranks.run(w.fsdp_device, WORLD, True, MOCK, CASES, MISMATCH_STEPS, timeout=240)

    def test_bit_exact_with_the_host_engine(self):
        for c, (spec, _, _, _) in enumerate(CASES):
            for r in range(WORLD):
                host, dev = self.host[r]["cases"][c], self.dev[r]["cases"][c]
                with self.subTest(spec=spec, rank=r):
                    self.assertEqual(host["library"], "libgradcomp.so")
                    self.assertEqual(dev["library"], "libgradcomp_fake.so")
                    self.assertEqual((host["device"], dev["device"]), (-1, r), "the fake device is the rank")
                    self.assertTrue(host["python_host"])
                    self.assertFalse(dev["python_host"], "the device engine has no Python host")
                    self.assertEqual(dev["params"], host["params"], "parameters differ from the host engine's")
                    self.assertEqual(dev["losses"], host["losses"])
                    self.assertEqual(dev["stats"], host["stats"])
                    self.assertEqual(dev["stats"], {"compressed": 3 * (STEPS - 2), "dense": 3 + 3,
                                                    "plain_steps": 1, "engine_steps": STEPS - 1})
                    self.assertEqual(dev["strategies"], host["strategies"])
                    self.assertNotIn("dense", dev["strategies"])
                    # The replicas of a shard got the same average.
                    self.assertEqual(dev["params"], self.dev[(r + 2) % WORLD]["cases"][c]["params"])

    def test_no_collective_on_the_replicate_group_after_the_bootstrap(self):
        for c, (spec, _, _, _) in enumerate(CASES):
            for r in range(WORLD):
                dev = self.dev[r]["cases"][c]
                with self.subTest(spec=spec, rank=r):
                    self.assertEqual(dev["collectives"], {}, "torch collectives on the replicate group")
                    # the shard-group agreement after the handshake, once
                    self.assertEqual(dev["elsewhere"], {"all_gather_object": 1})
                    self.assertFalse(dev["wait_on_hook_thread"], "the engine's Wait ran on the autograd thread")

    def test_mismatch_in_one_replicate_group_fails_every_rank(self):
        for results, where in ((self.dev, "device"), (self.host, "host")):
            for r in range(WORLD):
                m = results[r]["mismatch"]
                with self.subTest(engine=where, rank=r):
                    self.assertIsNotNone(m, "rank %d trained with a mismatched spec in its job" % r)
                    self.assertEqual(m["step"], 1)  # the engine is made at the second step
                    self.assertEqual(m["type"], "ConfigError")
                    self.assertIn("int4", m["message"])
                    if r % 2 == 1:  # the other replicate group: told by its shard group
                        self.assertIn("other replicate groups", m["message"])

    def test_another_device_is_refused(self):
        for r in range(WORLD):
            o = self.dev[r]["other_device"]
            with self.subTest(rank=r):
                self.assertIn("fake device %d" % (r + WORLD), o["register"] or "")
                self.assertIn("device %d" % r, o["register"])
                self.assertIn("fake device %d" % (r + WORLD), o["hook"] or "")
                self.assertIn("fake device %d" % r, o["hook"])


if __name__ == "__main__":
    unittest.main()
