"""The DDP hook's CUDA branch, end to end without a GPU: in the
fake-device test mode (GRADCOMP_FAKE_DEVICE=1, libgradcomp_fake.so) the
hook hands CPU tensors to the device engine as device pointers, and the
engine runs on a fake device (host memory, CUDA's stream and event rules
enforced) over its own NCCL communicator, the mock libnccl.so.2 of
internal/ncclmock (processes sharing a world through shared memory),
bootstrapped through torch.distributed's store. Its results must be the
host engine's, bit for bit, with no torch collective and no Python thread
on a bucket's path after the bootstrap."""

import os
import unittest

import ranks
import device_workers
from libpath import require_library

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MOCK = os.path.join(ROOT, "build", "mocknccl", "libnccl.so.2")
FAKE_LIB = os.path.join(ROOT, "plugin", "python", "gradcomp", "libgradcomp_fake.so")


def setUpModule():
    require_library()
    for path, what in ((MOCK, "the mock libnccl.so.2"), (FAKE_LIB, "libgradcomp_fake.so")):
        if not os.path.exists(path):
            raise unittest.SkipTest("%s is not built (run `make plugin`): %s" % (what, path))


class DDPDeviceBranch(unittest.TestCase):
    """DDP through the device engine on fake devices against the host engine."""

    def compare(self, world, spec, steps=5, env=None, **state_kw):
        state_kw.setdefault("workers", 1)
        host = ranks.run(device_workers.ddp_train, world, False, MOCK, spec, steps, state_kw, env, timeout=240)
        dev = ranks.run(device_workers.ddp_train, world, True, MOCK, spec, steps, state_kw, env, timeout=240)
        for r in range(world):
            self.assertEqual(host[r]["library"], "libgradcomp.so")
            self.assertEqual(dev[r]["library"], "libgradcomp_fake.so")
            self.assertEqual(dev[r]["device"], r, "the fake device is the local rank")
            self.assertTrue(host[r]["python_host"])
            self.assertFalse(dev[r]["python_host"], "the device engine has no Python host")
            self.assertEqual(dev[r]["params"], host[r]["params"], "rank %d: parameters differ from the host "
                                                                  "engine's" % r)
            self.assertEqual(dev[r]["stats"], host[r]["stats"])
            self.assertEqual(dev[r]["strategies"], host[r]["strategies"])
            self.assertFalse(dev[r]["wait_on_hook_thread"], "an engine wait ran on the autograd thread")
        return host, dev

    def test_int8_two_ranks(self):
        _, dev = self.compare(2, "int8", warmup_steps=2, decision="compressed")
        for r, out in enumerate(dev):
            self.assertEqual(out["collectives"], {}, "rank %d: torch collectives after the bootstrap" % r)
            self.assertEqual(out["stats"]["compressed"], 2 * 3)

    def test_topk_four_ranks(self):
        _, dev = self.compare(4, "topk:0.01", warmup_steps=2, decision="compressed")
        for r, out in enumerate(dev):
            self.assertEqual(out["collectives"], {}, "rank %d: torch collectives after the bootstrap" % r)

    def test_powersgd_two_ranks(self):
        self.compare(2, "powersgd:2", warmup_steps=2, decision="compressed")

    def test_hier_two_nodes(self):
        """Strategy hier on 2 nodes × 2 ranks: the device engine splits its
        own communicator by node (ncclCommSplit) and gives the host
        engine's hierarchical results."""
        _, dev = self.compare(4, "int8", strategy="hier", warmup_steps=2, decision="compressed",
                              env={"GRADCOMP_RANKS_PER_NODE": "2"})
        for r, out in enumerate(dev):
            self.assertEqual(out["collectives"], {}, "rank %d: torch collectives after the bootstrap" % r)
            self.assertEqual(out["strategies"], ["hier", "hier"])

    def test_warmup_goes_to_ddp(self):
        """Dense warm-up buckets are DDP's own all-reduces on the device
        branch too: the same results, counted as native."""
        host, dev = self.compare(2, "int8", steps=6, warmup_steps=4, decision="compressed")
        for r in range(2):
            self.assertEqual(dev[r]["stats"]["native"], 2 * 2)
            self.assertEqual(dev[r]["collectives"].get("all_reduce"), 2 * 2)


if __name__ == "__main__":
    unittest.main()


class DDPDeviceBranchRefusals(unittest.TestCase):
    """What goes wrong on the device branch ends on every rank with an
    error naming its cause, within the State's timeout."""

    def test_mismatched_configs(self):
        variants = [[{"spec": "int8", "warmup_steps": 2, "decision": "compressed"},
                     {"spec": "int4", "warmup_steps": 2, "decision": "compressed"}]]
        out = ranks.run(device_workers.in_mode, 2, True, MOCK, "mismatched_configs", variants, timeout=120)
        for r in range(2):
            got = out[r][0]
            self.assertTrue(got["is_value_error"], got)
            self.assertIn("int4", got["message"])
            self.assertEqual(got["step"], 2, "the engine's handshake runs at the first step after the plain ones")

    def test_peer_dies(self):
        out = ranks.run(device_workers.in_mode, 2, True, MOCK, "peer_dies", "int8", 1, 3, timeout=120, dies=(1,))
        first, second = out[0]
        self.assertTrue(first["is_comm"], first)
        self.assertLess(first["seconds"], 3 + 10)
        self.assertIsNotNone(second, "the step after the failure must fail too (the State is broken)")

    def test_no_unique_id(self):
        out = ranks.run(device_workers.no_unique_id, 2, True, MOCK, 2.0, timeout=60)
        got = out[1]
        self.assertEqual(got["type"], "TimeoutError", got)
        self.assertIn("no NCCL unique id from its rank 0", got["message"])
        self.assertLess(got["seconds"], 2.0 + 5)

    def test_bucket_on_another_device(self):
        out = ranks.run(device_workers.bucket_moves, 2, True, MOCK, timeout=120)
        for r in range(2):
            self.assertEqual(out[r]["type"], "ValueError", out[r])
            self.assertIn("fake device %d" % (r + 2), out[r]["message"])
            self.assertIn("runs on device %d" % r, out[r]["message"])


class DDPDeviceBranchNonFinite(unittest.TestCase):
    """A NaN in one rank's gradient on the device branch: the device
    engine turns the bucket into NaN on every rank (it keeps no copy of g
    to send dense), reports it, and stays usable; under
    on_nonfinite="raise" backward raises FloatingPointError on every rank."""

    def test_nan_on_one_rank(self):
        out = ranks.run(device_workers.in_mode, 2, True, MOCK, "nonfinite_bucket", "int8", 1, timeout=180)
        for r in range(2):
            dense, raised = out[r]["dense"], out[r]["raise"]
            self.assertIsNone(dense["error"], dense)
            self.assertTrue(dense["grads_nan"], "the device engine poisons the bucket on every rank")
            self.assertTrue(dense["clean_finite"], "the next step is clean")
            self.assertTrue(raised["error"] and raised["error"]["is_fpe"], raised)
            self.assertTrue(raised["clean_finite"], "the State stays usable after the raise")


class DDPDeviceBranchCheckpoints(unittest.TestCase):
    """Checkpoints on the device branch: a run cut, saved and resumed in
    new processes ends bit for bit where the uninterrupted run does, and a
    state saved by the hierarchical engine loads across shapes."""

    def test_resume_is_bit_exact(self):
        import tempfile

        for spec, cut, warmup in (("int8", 5, 4), ("topk:0.01", 3, 4)):
            with tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, "ckpt")
                args = (spec, 8, cut, warmup)
                straight = ranks.run(device_workers.in_mode, 2, True, MOCK, "resume_exact", *args, "straight", path,
                                     timeout=200)
                resumed = ranks.run(device_workers.in_mode, 2, True, MOCK, "resume_exact", *args, "resume", path,
                                    timeout=200)
            for r in range(2):
                with self.subTest(spec=spec, rank=r):
                    self.assertEqual(resumed[r]["params"], straight[r]["params"])
                    self.assertEqual(resumed[r]["stats"]["engine_steps"], 8 - cut)

    def test_hier_state_loads_reshaped(self):
        results = ranks.run(device_workers.in_mode, 4, True, MOCK, "hier_reshape", 2, timeout=300)
        for r, out in enumerate(results):
            with self.subTest(rank=r):
                self.assertIn("strategy", out["plain_refused"] or "")
                self.assertEqual(out["next_step"], out["saved_next_step"])
                self.assertTrue(out["finite"])
                self.assertTrue(out["state_reshape"]["finite"])
