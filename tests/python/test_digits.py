"""Accuracy: DDP on 4 gloo ranks trains an MLP on sklearn's digits for 10
epochs with torch's default all-reduce and with gradcomp's hook
(topk:0.01, int8, sign; error feedback on): each hook's test accuracy must
be within 1 point of the default's."""

import sys
import unittest

import ranks
import workers
from libpath import require_library

WORLD = 4
EPOCHS = 10
SPECS = ["topk:0.01", "int8", "sign"]
TOLERANCE = 0.01  # one point of accuracy


def setUpModule():
    require_library()


class Digits(unittest.TestCase):
    def test_hooks_match_the_default_accuracy(self):
        results = ranks.run(workers.train_digits, WORLD, [None] + SPECS, EPOCHS, 1, 10, timeout=400)
        for rank, r in enumerate(results[1:], 1):
            self.assertEqual(r, results[0], "rank %d ended with another model than rank 0" % rank)
        r = results[0]
        base = r["None"]["accuracy"]
        sys.stderr.write("\n[digits] %d ranks, %d epochs: default %.4f" % (WORLD, EPOCHS, base))
        for spec in SPECS:
            sys.stderr.write(", %s %.4f" % (spec, r[spec]["accuracy"]))
        sys.stderr.write("\n")
        for spec in SPECS:
            with self.subTest(spec=spec):
                self.assertGreater(r[spec]["stats"]["compressed"], 0)
                self.assertGreaterEqual(r[spec]["accuracy"], base - TOLERANCE)


if __name__ == "__main__":
    unittest.main()
