"""gradcomp.torch's hook where a framework owns the process group, on
spawned gloo ranks launched as torchrun launches them (ranks.run with
init=False): a State made before init_process_group (strategies "hier"
and "auto" learn the nodes at their first bucket, or load_state_dict),
PyTorch Lightning (gradcomp.lightning.CommHook) and Hugging Face
Accelerate (the hook registered after prepare()); and docs/PYTORCH.md's
recipes against the code these tests run. The framework tests skip,
naming the module, where it is not installed (Debian's Python with torch
1.13 has neither)."""

import importlib.util
import inspect
import os
import unittest

import framework_workers
import ranks
from libpath import require_library

#: docs/PYTORCH.md, whose recipes the framework tests run.
DOC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "PYTORCH.md")
#: The recipes' steps and warm-up, and the buckets DDP makes of the two-bucket MLP.
STEPS, WARMUP, BUCKETS = 6, 4, 2


def setUpModule():
    require_library()


def require(module):
    """Raises unittest.SkipTest naming ``module`` when it is not installed."""
    if importlib.util.find_spec(module) is None:
        raise unittest.SkipTest("%s is not installed (scripts/setup installs it in the torch 2.x virtual environment)"
                                % module)


def code_lines(text):
    """The code of ``text``'s lines, each stripped of indentation and
    comment (no recipe line holds a "#" in a string); blank lines and "..."
    dropped."""
    lines = (line.split("#")[0].strip() for line in text.splitlines())
    return [line for line in lines if line and line != "..."]


def doc_recipe(heading):
    """The code lines of the first ```python block after the line
    ``heading`` in docs/PYTORCH.md."""
    with open(DOC, encoding="utf-8") as f:
        text = f.read()
    at = text.find("\n%s\n" % heading)
    if at < 0:
        raise AssertionError("docs/PYTORCH.md has no heading %r" % heading)
    start = text.index("```python\n", at) + len("```python\n")
    return code_lines(text[start:text.index("```", start)])


class Recipes(unittest.TestCase):
    """docs/PYTORCH.md's recipes are the code the framework tests run."""

    def assert_recipe_runs(self, heading, fn):
        """Every code line of the recipe under ``heading`` is a line of
        ``fn``'s source, in the same order."""
        source = iter(code_lines(inspect.getsource(fn)))
        for line in doc_recipe(heading):
            if line not in source:
                self.fail("docs/PYTORCH.md, %s: %r is not in framework_workers.%s (in this order)"
                          % (heading, line, fn.__name__))

    def test_lightning(self):
        self.assert_recipe_runs("## PyTorch Lightning", framework_workers.lightning_fit)

    def test_accelerate(self):
        self.assert_recipe_runs("## Hugging Face Accelerate", framework_workers.accelerate_train)


class EngineCarried(unittest.TestCase):
    """What a framework's run must show: the recipe's STEPS steps with its
    BUCKETS buckets, the engine carrying every bucket after warm-up."""

    def assert_engine_carried(self, results):
        """Checks every rank's outcome (framework_workers.outcome)."""
        for rank, r in enumerate(results):
            with self.subTest(rank=rank):
                s = r["stats"]
                self.assertEqual(s["steps"], STEPS, s)
                self.assertEqual(s["plain_steps"], 2, s)  # torch's all-reduce, before the engine exists
                self.assertEqual(s["engine_steps"], STEPS - 2, s)
                self.assertEqual(s["native"], (WARMUP - 2) * BUCKETS, s)  # warm-up: dense, on DDP's all-reduce
                self.assertEqual(s["compressed"], (STEPS - WARMUP) * BUCKETS, s)  # then the engine's int8
                self.assertEqual(r["compressed"], [True] * BUCKETS)
                self.assertEqual(r["digest"], results[0]["digest"])  # every rank got the same averages


class Lightning(EngineCarried):
    """PyTorch Lightning's "ddp" strategy on 2 CPU ranks with
    gradcomp.lightning.CommHook."""

    @classmethod
    def setUpClass(cls):
        require("pytorch_lightning")

    def test_the_engine_carries_every_bucket_after_warm_up(self):
        self.assert_engine_carried(ranks.run(framework_workers.lightning_fit, 2, timeout=150, init=False))


class Accelerate(EngineCarried):
    """Hugging Face Accelerate on 2 CPU ranks, the hook registered on the
    model prepare() returns."""

    @classmethod
    def setUpClass(cls):
        require("accelerate")

    def test_the_engine_carries_every_bucket_after_warm_up(self):
        self.assert_engine_carried(ranks.run(framework_workers.accelerate_train, 2, timeout=150, init=False))


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
