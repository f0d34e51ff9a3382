"""The engine through the Python front end gives the Go engine's results
bit for bit: for every case of tests/golden (testdata/cases.txt), 4 gloo
ranks drive the engine wrapper the DDP hook uses (tests/python/frontends.py)
with the golden gradients, and every average after every step and every
rank's final engine state must equal the files the Go engine wrote on
in-process ranks (go test ./tests/golden -update). The gradients are
multiples of 1/64 below 16, so gloo's all-reduce order (not rank order)
still sums them exactly.
"""

import os
import subprocess
import sys
import tempfile
import unittest

import libpath

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(HERE, "..", "golden", "testdata")
RANKS, STEPS, SIZES = 4, 3, (1000, 37)


def cases():
    with open(os.path.join(GOLDEN, "cases.txt")) as f:
        return [line.split() for line in f if line.strip()]


class Frontends(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        libpath.require_library()

    def test_matches_go_engine(self):
        for name, spec, strategy in cases():
            with self.subTest(case=name), tempfile.TemporaryDirectory(prefix="gradcomp-frontends-") as out:
                r = subprocess.run(
                    [sys.executable, os.path.join(HERE, "frontends.py"), "--spec", spec, "--strategy", strategy,
                     "--world", str(RANKS), "--steps", str(STEPS), "--out", out],
                    capture_output=True, text=True, timeout=120,
                )
                self.assertEqual(r.returncode, 0, "frontends.py %s: %s%s" % (name, r.stdout, r.stderr))
                with open(os.path.join(GOLDEN, name + ".avg"), "rb") as f:
                    golden = f.read()
                got = b""
                for s in range(STEPS):
                    for rank in range(RANKS):
                        for b in range(len(SIZES)):
                            with open(os.path.join(out, "avg_r%d_s%d_b%d.f32" % (rank, s, b)), "rb") as f:
                                got += f.read()
                self.assertEqual(len(got), len(golden), name)
                if got != golden:
                    at = next(i for i in range(len(got)) if got[i] != golden[i])
                    per_step = RANKS * sum(SIZES) * 4
                    self.fail("%s: averages differ from the Go engine's at byte %d (step %d)" % (name, at, at // per_step))
                for rank in range(RANKS):
                    with open(os.path.join(GOLDEN, "%s.state%d" % (name, rank)), "rb") as f:
                        want = f.read()
                    with open(os.path.join(out, "state_r%d.bin" % rank), "rb") as f:
                        self.assertEqual(f.read(), want, "%s: rank %d's engine state differs from the Go engine's" % (name, rank))


if __name__ == "__main__":
    unittest.main()
