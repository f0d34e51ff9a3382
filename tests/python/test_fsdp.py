"""gradcomp.fsdp under torch 2.x: FSDP2 (fully_shard) within shard groups,
the cross-replica exchange through gradcomp's engine, on 4 gloo ranks as
2 replicas × 2 shards (one spawn for every case, to stay within a minute
on 2 cores): spec "none" against a single-process reference and native
HSDP (microbatches, bfloat16 compute; a root-only model), int8 with error feedback
training, PowerSGD training, a bit-exact resume, a checkpoint of another model refused, ranks
with different specs, NaN, accumulation into .grad and force-sum reduction
failing their step only. Skipped, with the reason, on a torch without
FSDP2 (Debian's 1.13)."""

import io
import logging
import traceback
import unittest

import torch
import torch.distributed as dist

try:
    from torch.distributed.fsdp import fully_shard
except Exception as e:  # ImportError; torch 1.13's fsdp package fails on Python 3.11 with a ValueError
    fully_shard, _why = None, "%s: %s" % (type(e).__name__, e)

import ranks
from libpath import require_library

WORLD, REPLICAS, SHARDS = 4, 2, 2
IN, OUT, BATCH = 16, 4, 16


def setUpModule():
    if fully_shard is None:
        raise unittest.SkipTest("torch %s has no FSDP2 (torch.distributed.fsdp.fully_shard: %s): gradcomp.fsdp "
                                "needs torch 2.x" % (torch.__version__, _why))
    require_library()


# ---- rank side (run through ranks.run in spawned processes)

def _net(seed, hidden):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(IN, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
                               torch.nn.ReLU(), torch.nn.Linear(hidden, OUT))


def _sharded(mesh, seed=0, hidden=24):
    """The MLP with its first two layers and the root (which manages the
    last layer) fully_shard'ed on ``mesh``."""
    m = _net(seed, hidden)
    fully_shard(m[0], mesh=mesh)
    fully_shard(m[2], mesh=mesh)
    fully_shard(m, mesh=mesh)
    return m


def _batch(step, rank):
    """Rank ``rank``'s batch of step ``step``: inputs and the classes a
    fixed teacher gives them."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(BATCH, IN, generator=g)
    teacher = torch.Generator().manual_seed(7)
    w = torch.randn(IN, OUT, generator=teacher)
    return x, (x @ w).argmax(1)


def _train(model, opt, rank, steps, first=0):
    losses = []
    for step in range(first, first + steps):
        x, y = _batch(step, rank)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _full(model):
    return [p.full_tensor().detach().clone() for p in model.parameters()]


def _locals(model):
    return [p.to_local().detach().clone() for p in model.parameters()]


def _replicate_groups():
    """New groups of the ranks holding the same shard (every rank makes all
    of them, in order); this rank's."""
    groups = [dist.new_group([s + r * SHARDS for r in range(REPLICAS)]) for s in range(SHARDS)]
    return groups[dist.get_rank() % SHARDS]


def _case(fn):
    try:
        return {"value": fn()}
    except BaseException:
        return {"error": traceback.format_exc()}


def fsdp_cases(rank, world, steps_dense, steps_int8, cut):
    import gradcomp.fsdp as gf

    mesh = gf.init_mesh(REPLICAS, SHARDS)
    shard, replicate = mesh["shard"], mesh["replicate"]
    out = {}

    def reference(steps):
        ref = _net(0, 24)
        opt = torch.optim.SGD(ref.parameters(), lr=0.1)
        for step in range(steps):
            xs, ys = zip(*(_batch(step, r) for r in range(world)))
            opt.zero_grad()
            torch.nn.functional.cross_entropy(ref(torch.cat(xs)), torch.cat(ys)).backward()
            opt.step()
        return list(ref.parameters())

    def diff(a, b):
        return max((x - y).abs().max().item() for x, y in zip(a, b))

    def accumulate(model, opt, step):
        # two microbatches, FSDP's way: no reduce-scatter (nor hook) for the first
        opt.zero_grad()
        model.set_requires_gradient_sync(False)
        x, y = _batch(100 + step, rank)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        model.set_requires_gradient_sync(True)
        x, y = _batch(200 + step, rank)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    def dense():
        # Spec "none", decision dense: HSDP's average, against one process
        # training on the 4 ranks' batches and against native HSDP; then
        # steps of two microbatches against native HSDP's.
        model = _sharded(shard)
        state = gf.register(model, gf.FSDPState("none", replicate, decision="dense", warmup_steps=1, workers=1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        _train(model, opt, rank, steps_dense)
        got = _full(model)
        hsdp = _sharded(mesh)  # a 2-D mesh: torch's own HSDP
        try:
            gf.register(hsdp, gf.FSDPState("none", replicate))
            refused = None
        except ValueError as e:
            refused = str(e)
        opt_hsdp = torch.optim.SGD(hsdp.parameters(), lr=0.1)
        _train(hsdp, opt_hsdp, rank, steps_dense)
        native = _full(hsdp)
        for step in range(2):
            accumulate(model, opt, step)
            accumulate(hsdp, opt_hsdp, step)
        stats = state.stats
        state.close()
        return {
            "vs_reference": diff(got, reference(steps_dense)), "vs_native_hsdp": diff(got, native),
            "moved": diff(got, _net(0, 24).parameters()), "accumulated_vs_native_hsdp": diff(_full(model), _full(hsdp)),
            "stats": stats, "buckets": state.buckets, "native_refused": refused,
        }

    def root_only():
        # One FSDP module (the root): its hook is the step's only bucket.
        model = _net(0, 24)
        fully_shard(model, mesh=shard)
        state = gf.register(model, gf.FSDPState("none", replicate, decision="dense", warmup_steps=1, workers=1))
        _train(model, torch.optim.SGD(model.parameters(), lr=0.1), rank, 3)
        res = {"vs_reference": diff(_full(model), reference(3)), "stats": state.stats, "buckets": state.buckets}
        state.close()
        return res

    def mixed():
        # bfloat16 compute, float32 parameters (reduced in float32 in torch
        # 2.15): the same as native HSDP's under the same policy; a
        # bfloat16 reduce dtype is refused on every rank.
        from torch.distributed.fsdp import MixedPrecisionPolicy

        def build(m, reduce_dtype=None):
            net = _net(0, 24)
            policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=reduce_dtype)
            for layer in (net[0], net[2], net):
                fully_shard(layer, mesh=m, mp_policy=policy)
            return net

        model = build(shard)
        state = gf.register(model, gf.FSDPState("none", replicate, decision="dense", warmup_steps=1, workers=1))
        _train(model, torch.optim.SGD(model.parameters(), lr=0.1), rank, 3)
        hsdp = build(mesh)
        _train(hsdp, torch.optim.SGD(hsdp.parameters(), lr=0.1), rank, 3)
        res = {"vs_native_hsdp": diff(_full(model), _full(hsdp)), "vs_reference": diff(_full(model), reference(3)),
               "engine_steps": state.stats["engine_steps"]}
        state.close()
        low = build(shard, torch.bfloat16)
        state = gf.register(low, gf.FSDPState("none", replicate, decision="dense", warmup_steps=1, workers=1))
        opt = torch.optim.SGD(low.parameters(), lr=0.1)
        res["bf16_reduce"] = None
        for step in range(2):
            try:
                _train(low, opt, rank, 1, first=step)
            except NotImplementedError as e:
                res["bf16_reduce"], res["bf16_step"] = str(e), step  # at the first backward, before an engine
                break
        state.close()
        return res

    def misuse():
        # NaN on one rank under on_nonfinite="raise", gradients accumulated
        # into .grad, FSDP's force-sum reduction: each fails its step on
        # every rank with its own type; the State goes on.
        model = _sharded(shard)
        state = gf.register(model, gf.FSDPState("int8", replicate, decision="compressed", warmup_steps=1,
                                                on_nonfinite="raise", workers=1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        _train(model, opt, rank, 2)
        res = {}
        logging.getLogger("gradcomp").setLevel(logging.ERROR)  # the NaN's warning
        x, y = _batch(2, rank)
        if rank == 0:
            x[0, 0] = float("nan")
        opt.zero_grad()
        try:
            torch.nn.functional.cross_entropy(model(x), y).backward()
            res["nan"] = None
        except FloatingPointError as e:
            res["nan"] = str(e)
        opt.zero_grad()  # the step is skipped
        x, y = _batch(3, rank)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        try:
            torch.nn.functional.cross_entropy(model(x), y).backward()  # into the .grad of the step before
            res["accumulated"] = None
        except ValueError as e:
            res["accumulated"] = str(e)
        opt.zero_grad()
        model.set_force_sum_reduction_for_comms(True)
        try:
            torch.nn.functional.cross_entropy(model(x), y).backward()
            res["force_sum"] = None
        except NotImplementedError as e:
            res["force_sum"] = str(e)
        model.set_force_sum_reduction_for_comms(False)
        opt.zero_grad()
        _train(model, opt, rank, 2, first=4)
        res["finite"] = all(torch.isfinite(p.to_local()).all().item() for p in model.parameters())
        res["stats"] = state.stats
        state.close()
        return res

    def int8():
        model = _sharded(shard)
        state = gf.register(model, gf.FSDPState("int8", replicate, decision="compressed", warmup_steps=2, workers=1))
        losses = _train(model, torch.optim.SGD(model.parameters(), lr=0.5), rank, steps_int8)
        s = state.last_step
        res = {"losses": losses, "stats": state.stats, "strategies": [b.strategy for b in s.buckets],
               "compressed": [b.compressed for b in s.buckets], "bytes": s.bytes_sent,
               "elements": sum(b.elements for b in s.buckets), "summary": state.summary()}
        state.close()
        return res

    def powersgd():
        # PowerSGD across the replicas on each module's parameter shards:
        # the 64×16 and 64×64 weights' 32-row shards at R = 4; the last
        # layer's 2×64 shard and the biases uncompressed.
        model = _sharded(shard, hidden=64)
        state = gf.register(model, gf.FSDPState("powersgd:4:min_compression=1", replicate, decision="compressed",
                                                warmup_steps=2, workers=1))
        losses = _train(model, torch.optim.SGD(model.parameters(), lr=0.5), rank, steps_int8)
        s = state.last_step
        res = {"losses": losses, "stats": state.stats, "strategies": [b.strategy for b in s.buckets],
               "compressed": [b.compressed for b in s.buckets], "bytes": s.bytes_sent,
               "elements": sum(b.elements for b in s.buckets), "shards": [t.tolist() for t in _locals(model)]}
        state.close()
        return res

    def resume():
        # A runs cut steps, is checkpointed, runs 2 more; B is made from the
        # checkpoint (model shards, State through torch.save) and runs the
        # same 2 steps on a group of its own: bit for bit A's.
        a = _sharded(shard, seed=1)
        sa = gf.register(a, gf.FSDPState("int8", replicate, decision="compressed", warmup_steps=2, workers=1))
        opt_a = torch.optim.SGD(a.parameters(), lr=0.2)
        _train(a, opt_a, rank, cut)
        buf = io.BytesIO()
        torch.save({"model": _locals(a), "gradcomp": sa.state_dict()}, buf)
        _train(a, opt_a, rank, 2, first=cut)
        buf.seek(0)
        ckpt = torch.load(buf, weights_only=False)
        b = _sharded(shard, seed=2)
        with torch.no_grad():
            for p, saved in zip(b.parameters(), ckpt["model"]):
                p.to_local().copy_(saved)
        sb = gf.register(b, gf.FSDPState("int8", _replicate_groups(), decision="compressed", warmup_steps=2,
                                         workers=1))
        sb.load_state_dict(ckpt["gradcomp"])
        _train(b, torch.optim.SGD(b.parameters(), lr=0.2), rank, 2, first=cut)
        same = all(torch.equal(x, y) for x, y in zip(_locals(a), _locals(b)))
        same_state = sa.engine.save_state() == sb.engine.save_state()
        moved = any(not torch.equal(x, y) for x, y in zip(_locals(a), ckpt["model"]))
        res = {"same_params": same, "same_engine_state": same_state, "moved": moved,
               "saved_iter": ckpt["gradcomp"]["iter"], "iters": [sa.iter, sb.iter],
               "engine_steps": sb.stats["engine_steps"], "plain_steps": sb.stats["plain_steps"]}
        sa.close()
        sb.close()
        out["_checkpoint"] = ckpt["gradcomp"]
        return res

    def bad_checkpoint():
        sd = out.get("_checkpoint")
        if sd is None:
            raise AssertionError("no checkpoint from the resume case")
        res = {}
        wider = _sharded(shard, hidden=32)
        sw = gf.register(wider, gf.FSDPState("int8", replicate, decision="compressed", warmup_steps=2, workers=1))
        for when in ("fresh", "after its first step"):
            if when != "fresh":
                _train(wider, torch.optim.SGD(wider.parameters(), lr=0.1), rank, 1)
            try:
                sw.load_state_dict(sd)
                res[when] = None
            except ValueError as e:
                res[when] = str(e)
        other = gf.FSDPState("int4", replicate, decision="compressed", workers=1)
        try:
            other.load_state_dict(sd)
            res["spec"] = None
        except ValueError as e:
            res["spec"] = str(e)
        res["iter_unchanged"] = sw.iter == 1
        sw.close()
        return res

    def mismatch():
        # Replicas disagree on the spec in both replicate groups: every rank
        # gets the engine's ValueError from backward, at its second step.
        model = _sharded(shard)
        spec = "int8" if rank < SHARDS else "int4"
        state = gf.register(model, gf.FSDPState(spec, _replicate_groups(), decision="compressed", warmup_steps=2,
                                                workers=1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(3):
            try:
                _train(model, opt, rank, 1, first=step)
            except Exception as e:
                return {"step": step, "type": type(e).__name__, "is_value_error": isinstance(e, ValueError),
                        "message": str(e), "summary": state.summary()}
        return None

    for name, fn in [("dense", dense), ("root_only", root_only), ("mixed", mixed), ("int8", int8), ("powersgd", powersgd),
                     ("misuse", misuse),
                     ("resume", resume), ("bad_checkpoint", bad_checkpoint), ("mismatch", mismatch)]:
        out[name] = _case(fn)
    out.pop("_checkpoint", None)
    return out


# ---- test side

class FSDP(unittest.TestCase):
    """Every case runs in one spawn of 4 ranks (setUpClass); each test reads
    its case on every rank."""

    STEPS_DENSE, STEPS_INT8, CUT = 5, 30, 4

    @classmethod
    def setUpClass(cls):
        cls.results = ranks.run(fsdp_cases, WORLD, cls.STEPS_DENSE, cls.STEPS_INT8, cls.CUT, timeout=150)

    def case(self, name):
        out = []
        for rank, r in enumerate(self.results):
            if "error" in r[name]:
                self.fail("rank %d, case %s:\n%s" % (rank, name, r[name]["error"]))
            out.append(r[name]["value"])
        return out

    def test_none_dense_is_hsdp(self):
        for rank, r in enumerate(self.case("dense")):
            self.assertGreater(r["moved"], 1e-3)  # it trained
            self.assertLess(r["vs_reference"], 2e-6, r)
            self.assertLess(r["vs_native_hsdp"], 2e-6, r)
            self.assertLess(r["accumulated_vs_native_hsdp"], 2e-6, r)
            s = r["stats"]
            # the microbatches' steps are engine steps too (one hook round per optimizer step)
            self.assertEqual((s["steps"], s["plain_steps"], s["engine_steps"]), (self.STEPS_DENSE + 2, 1,
                                                                                 self.STEPS_DENSE + 1))
            self.assertEqual(s["compressed"], 0)
            names = [name for name, _ in r["buckets"]]  # in hook order (backward's: the last layer first)
            self.assertEqual(names[0], "2")
            self.assertEqual(sorted(names), ["", "0", "2"])
            self.assertIn("native HSDP", r["native_refused"])

    def test_root_only(self):
        for rank, r in enumerate(self.case("root_only")):
            self.assertLess(r["vs_reference"], 2e-6, r)
            self.assertEqual(len(r["buckets"]), 1)
            self.assertEqual((r["stats"]["plain_steps"], r["stats"]["engine_steps"]), (1, 2))

    def test_mixed_precision(self):
        for rank, r in enumerate(self.case("mixed")):
            self.assertLess(r["vs_native_hsdp"], 2e-6, r)
            self.assertLess(r["vs_reference"], 0.05, r)  # bfloat16 compute
            self.assertEqual(r["engine_steps"], 2)
            self.assertIn("bfloat16", r["bf16_reduce"] or "")
            self.assertEqual(r["bf16_step"], 0)

    def test_nan_and_accumulation_fail_the_step_only(self):
        for rank, r in enumerate(self.case("misuse")):
            self.assertIn("non-finite", r["nan"] or "")
            self.assertIn("skip this optimizer step", r["nan"])
            self.assertIn("already holds a gradient", r["accumulated"] or "")
            self.assertIn("set_force_sum_reduction_for_comms", r["force_sum"] or "")
            self.assertTrue(r["finite"])
            self.assertEqual(r["stats"]["nonfinite"], 3)
            self.assertEqual(r["stats"]["steps"], 8)

    def test_int8_trains_compressed(self):
        for rank, r in enumerate(self.case("int8")):
            first, last = sum(r["losses"][:5]) / 5, sum(r["losses"][-5:]) / 5
            self.assertLess(last, 0.6 * first, r["losses"])
            s = r["stats"]
            self.assertEqual(s["engine_steps"], self.STEPS_INT8 - 1)
            self.assertEqual(s["compressed"], 3 * (self.STEPS_INT8 - 2))  # 3 buckets, after the warm-up
            self.assertEqual(r["compressed"], [True] * 3)
            self.assertNotIn("dense", r["strategies"])  # the engine's choice for int8 at 2 replicas: allgather
            # int8 across 2 replicas: about a quarter of the ring all-reduce's 2·(R-1)/R·4 bytes per element
            dense = 2 * (REPLICAS - 1) * 4 * r["elements"] // REPLICAS
            self.assertLess(r["bytes"], 0.4 * dense, (r["bytes"], dense))
            self.assertIn("compressed", r["summary"])

    def test_powersgd_trains_compressed(self):
        results = self.case("powersgd")
        for rank, r in enumerate(results):
            first, last = sum(r["losses"][:5]) / 5, sum(r["losses"][-5:]) / 5
            self.assertLess(last, 0.6 * first, r["losses"])
            self.assertEqual(r["stats"]["compressed"], 3 * (self.STEPS_INT8 - 2))
            self.assertEqual(r["strategies"], ["low-rank"] * 3)
            dense = 2 * (REPLICAS - 1) * 4 * r["elements"] // REPLICAS
            self.assertLess(r["bytes"], 0.5 * dense, (r["bytes"], dense))
            # The replicas of a shard hold the same parameters: every rank
            # of a replicate group got the same average.
            self.assertEqual(r["shards"], results[(rank + SHARDS) % WORLD]["shards"])

    def test_resume_is_bit_exact(self):
        for rank, r in enumerate(self.case("resume")):
            self.assertTrue(r["moved"])
            self.assertTrue(r["same_params"], r)
            self.assertTrue(r["same_engine_state"], r)
            self.assertEqual(r["saved_iter"], self.CUT)
            self.assertEqual(r["iters"], [self.CUT + 2] * 2)
            self.assertEqual((r["plain_steps"], r["engine_steps"]), (0, 2))  # no plain step after a resume

    def test_checkpoint_of_another_model_is_refused(self):
        for rank, r in enumerate(self.case("bad_checkpoint")):
            self.assertIsNotNone(r["fresh"])
            self.assertIn("not the same model", r["fresh"])
            self.assertIsNotNone(r["after its first step"])
            self.assertIn("not the same model", r["after its first step"])
            self.assertIn("spec", r["spec"] or "")
            self.assertTrue(r["iter_unchanged"])

    def test_mismatched_spec_fails_every_rank(self):
        for rank, r in enumerate(self.case("mismatch")):
            self.assertIsNotNone(r, "rank %d trained with mismatched specs" % rank)
            self.assertEqual(r["step"], 1)  # the engine is created at the second step
            self.assertTrue(r["is_value_error"], r)
            self.assertIn("int4", r["message"])
            self.assertIn("int8", r["message"])


class Arguments(unittest.TestCase):
    def test_state_arguments(self):
        import gradcomp.fsdp as gf

        with self.assertRaises(ValueError):
            gf.FSDPState("int8", None)
        for kw in [dict(decision="guess"), dict(on_nonfinite="ignore"), dict(strategy="hier"), dict(timeout=0),
                   dict(momentum=1.0), dict(guard=-1.0), dict(guard=2.0, error_feedback=False),
                   dict(momentum_masking=True), dict(warmup_steps=0)]:
            with self.subTest(**kw), self.assertRaises(ValueError):
                gf.FSDPState("int8", object(), **kw)
        with self.assertRaises(ValueError):
            gf.FSDPState("topk:7", object())
        with self.assertRaisesRegex(ValueError, "rank"):
            gf.FSDPState("powersgd:0", object())

    def test_strategies_are_the_librarys_but_hier(self):
        import gradcomp
        import gradcomp.fsdp as gf

        want = tuple(s for s in gradcomp.names(gradcomp.Names.STRATEGY) if s != "hier")
        self.assertEqual(gf.FSDPState.strategies(), want)
        self.assertIn("low-rank", want)


if __name__ == "__main__":
    unittest.main()
