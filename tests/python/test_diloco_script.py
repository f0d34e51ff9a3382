"""scripts/diloco.py --quick on 2 workers, under the interpreter running
the tests (torch 1.13 or 2.x): every configuration leaves a result, and
gradcomp.outer's DiLoCo (spec none) ends where the plain-torch reference
ends, to rounding."""

import json
import os
import subprocess
import sys
import tempfile
import unittest

from libpath import require_library

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SCRIPT = os.path.join(ROOT, "scripts", "diloco.py")
CONFIGS = ("ddp", "diloco", "streaming", "sparseloco", "reference")
TIMEOUT = 300  # seconds; --quick takes under 2 minutes on 2 shared cores
#: float32 rounding, grown over the steps: the two may sum the same
#: pseudo-gradients in another order (‖Δθ‖/‖θ‖ and the loss difference;
#: the largest |Δθ| can reach an AdamW step where a gradient is near 0)
ROUNDING = 1e-5


def setUpModule():
    require_library()


class DilocoScript(unittest.TestCase):
    def test_quick_run_has_every_configuration_and_matches_the_reference(self):
        with tempfile.TemporaryDirectory(prefix="gradcomp-diloco-") as tmp:
            out = os.path.join(tmp, "results.jsonl")
            cmd = [sys.executable, SCRIPT, "--quick", "--workers", "2", "--configs", ",".join(CONFIGS),
                   "--run", "test", "--out", out]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT)
            self.assertEqual(r.returncode, 0, "%s failed:\n%s\n%s" % (" ".join(cmd), r.stdout[-4000:],
                                                                      r.stderr[-4000:]))
            with open(out) as f:
                rows = [json.loads(x) for x in f if x.strip()]
        results = {x["config"]: x for x in rows if "config" in x}
        for c in CONFIGS:
            with self.subTest(config=c):
                self.assertIn(c, results)
                self.assertIsNone(results[c].get("error"))
                self.assertLess(results[c]["final_val_loss"], 5.5)  # below ln 256: it learned
                self.assertGreater(results[c]["bytes_total"], 0)
        exact = [x for x in rows if x.get("compare") == ["diloco", "reference"]]
        self.assertEqual(len(exact), 1, "no diloco-vs-reference row in %s" % rows)
        e = exact[0]
        sys.stderr.write("\n[diloco] diloco vs reference: max |Δθ| %.3g, ‖Δθ‖/‖θ‖ %.3g, loss difference %.3g\n"
                         % (e["max_abs_dtheta"], e["rel_l2_dtheta"], e["val_loss_diff"]))
        self.assertLessEqual(e["rel_l2_dtheta"], ROUNDING)
        self.assertLessEqual(abs(e["val_loss_diff"]), ROUNDING)
        # the outer configurations send a fraction of DDP's bytes
        for c in ("diloco", "streaming", "sparseloco"):
            self.assertLess(results[c]["bytes_total"], results["ddp"]["bytes_total"] / 4)


if __name__ == "__main__":
    unittest.main()
