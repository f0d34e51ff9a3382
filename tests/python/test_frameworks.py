"""gradcomp.torch's hook where a framework owns the process group, on
spawned gloo ranks launched as torchrun launches them (ranks.run with
init=False): a State made before init_process_group (strategies "hier"
and "auto" learn the nodes at their first bucket, or load_state_dict)."""

import unittest

import framework_workers
import ranks
from libpath import require_library


def setUpModule():
    require_library()


class StateBeforeInit(unittest.TestCase):
    """States made before init_process_group, on 4 ranks as 2 nodes × 2."""

    def test_hier_and_auto_learn_the_nodes_at_first_use(self):
        steps = 4
        results = ranks.run(framework_workers.state_before_init, 4, 2, steps, timeout=240, init=False)
        for rank, r in enumerate(results):
            for strategy in ("hier", "auto"):
                with self.subTest(rank=rank, strategy=strategy):
                    got = r[strategy]
                    self.assertIsNone(got["made_with"])  # nothing learned before the process group
                    self.assertEqual(got["topology"], [rank // 2, 2, rank % 2, 2])
                    self.assertEqual(got["stats"]["compressed"], steps - 2)  # warm-up 2: the engine's steps
                    self.assertEqual(got["digest"], results[0][strategy]["digest"])
            with self.subTest(rank=rank, strategy="hier", resumed=True):
                got = r["resumed"]
                self.assertIsNone(got["made_with"])
                self.assertEqual(got["loaded_with"], [rank // 2, 2, rank % 2, 2])  # learned by load_state_dict
                self.assertEqual(got["stats"]["steps"], steps + 2)
                self.assertEqual(got["stats"]["compressed"], 2)
                self.assertEqual(got["strategies"], ["hier"])
            self.assertEqual(r["hier"]["strategies"], ["hier"])
            self.assertIn("hierarchical (2 nodes × 2 ranks", r["hier"]["reason"])
            self.assertIn("auto on 2 nodes × 2 ranks: hierarchical", r["auto"]["reason"])  # the trial ran
            self.assertEqual(r["auto"]["strategies"], results[0]["auto"]["strategies"])  # every rank kept one


if __name__ == "__main__":
    unittest.main()
