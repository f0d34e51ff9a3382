"""TorchHost carries out several posts at once (gradcomp._host): on 3 gloo
ranks (spawned processes), a scripted transport hands the host every kind
of collective, up to 4 taken and not yet complete at a time as the hosted
transport allows, and the host must launch the next ones before the first
completes, complete each once with its right result, and count them and
their wire time; an engine of several buckets over the real transport must
give the plain average, with several of its collectives in flight; and a peer that dies fails the collectives in
flight at completion and the engine's step on the surviving ranks within
the timeout, with nothing left hanging."""

import datetime
import os
import threading
import time
import unittest

import torch
import torch.distributed as dist

import gradcomp
from gradcomp import _engine, _host, _lib

import ranks
from workers import _op
from libpath import require_library

WORLD = 3
IN_FLIGHT = 4  # hosted.DefaultInFlight
LATE = 0.5  # seconds the last rank starts its host late
DIES_AFTER = 0.5  # seconds after the barrier the dying rank ends its process


def setUpModule():
    require_library()


class ScriptedHosted:
    """Stands in for gradcomp._host.Hosted: hands out ``ops`` in order, at
    most ``limit`` taken and not yet completed at a time (the hosted
    transport's engine posts no more than that), and records every take
    and completion in order."""

    def __init__(self, rank, size, ops, limit=IN_FLIGHT):
        self.rank, self.size = rank, size
        self.ops = list(ops)
        self.limit = limit
        self.lock = threading.Lock()
        self.events = []  # ("take", id) and ("complete", id) in their order
        self.outstanding = set()
        self.completions = {}  # id -> [(status, message, recv_bytes), ...]
        self.all_done = threading.Event()

    def take(self, timeout, group=None):
        deadline = time.monotonic() + timeout
        while True:
            with self.lock:
                if self.ops and len(self.outstanding) < self.limit:
                    op = self.ops.pop(0)
                    self.outstanding.add(op.id)
                    self.events.append(("take", op.id))
                    return op
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.0005)

    def complete(self, op_id, status=_lib.Status.OK, message=None, recv_bytes=0):
        with self.lock:
            self.events.append(("complete", op_id))
            self.completions.setdefault(op_id, []).append((int(status), message, int(recv_bytes)))
            self.outstanding.discard(op_id)
            if not self.ops and not self.outstanding:
                self.all_done.set()


def _every_kind(rank, world):
    """Ops of every kind over tensors, and what each tensor must hold
    after: [(op, tensor or None, expected tensor or None)]."""
    K = _lib.OpKind
    out = []

    def add(kind, count, send, recv, expected=None, root=0, send_bytes=None, recv_bytes=None):
        nb = lambda t: 0 if t is None else t.numel() * t.element_size()
        ptr = lambda t: 0 if t is None or t.numel() == 0 else t.data_ptr()
        op = _op(kind, count, ptr(send), ptr(recv), nb(send) if send_bytes is None else send_bytes,
                 nb(recv) if recv_bytes is None else recv_bytes, root, op_id=len(out) + 1)
        out.append((op, recv, expected, send))

    for n in (1 << 18, 1000, 5, 1 << 16):  # the first ones run while the late rank is not there yet
        ar = (torch.arange(n, dtype=torch.float32) % 7) + rank
        add(K.ALLREDUCE, n, ar, ar, (torch.arange(n, dtype=torch.float32) % 7) * world + sum(range(world)))
    send = torch.tensor([rank * 10 + j for j in range(5)], dtype=torch.uint8)
    add(K.ALLGATHER, 5, send, torch.zeros(5 * world, dtype=torch.uint8),
        torch.tensor([q * 10 + j for q in range(world) for j in range(5)], dtype=torch.uint8))
    # Over DIRECT_GATHER_BYTES in all: a ring all-gather, not the direct one.
    n = _host.DIRECT_GATHER_BYTES // world + 1
    big = ((torch.arange(n) * 31 + rank * 7) % 251).to(torch.uint8)
    add(K.ALLGATHER, n, big, torch.zeros(n * world, dtype=torch.uint8),
        torch.cat([((torch.arange(n) * 31 + q * 7) % 251).to(torch.uint8) for q in range(world)]))
    rs = torch.tensor([rank * 100.0 + j for j in range(4 * world)])
    add(K.REDUCESCATTER, 4, rs, torch.zeros(4),
        torch.tensor([sum(q * 100.0 + rank * 4 + j for q in range(world)) for j in range(4)]))
    a = torch.tensor([rank * 16 + j for j in range(2 * world)], dtype=torch.uint8)
    add(K.ALLTOALL, 2 * world, a, torch.zeros(2 * world, dtype=torch.uint8),
        torch.tensor([q * 16 + rank * 2 + c for q in range(world) for c in range(2)], dtype=torch.uint8))
    # Refused at launch on every rank alike (a wrong length): completed with
    # an error, and the ops after it still match across ranks.
    bad = torch.zeros(3, dtype=torch.uint8)
    add(K.ALLGATHER, 2, bad, bad, recv_bytes=3)
    b = torch.full((3,), rank + 1, dtype=torch.uint8)
    add(K.BROADCAST, 3, b, b, torch.full((3,), world, dtype=torch.uint8), root=world - 1)
    add(K.BARRIER, 0, None, None)
    add(K.ALLREDUCE, 0, None, None)  # empty: nothing to carry
    for n in (300000, 4096, 17):
        ar = torch.full((n,), float(rank + 1))
        add(K.ALLREDUCE, n, ar, ar, torch.full((n,), float(sum(range(1, world + 1)))))
    rs = torch.full((21 * world,), float(rank + 1))
    add(K.REDUCESCATTER, 21, rs, torch.zeros(21), torch.full((21,), float(sum(range(1, world + 1)))))
    return out


def several_in_flight(rank, world):
    """A TorchHost over a ScriptedHosted handing out every kind of op; the
    last rank starts LATE seconds late, so the others' first collectives
    cannot finish before it comes. Returns what each rank saw."""
    ops = _every_kind(rank, world)
    host_group = dist.new_group(timeout=datetime.timedelta(seconds=20))
    if rank == world - 1:
        time.sleep(LATE)
    fake = ScriptedHosted(rank, world, [o[0] for o in ops])
    alltoalls = []  # the bytes each all_to_all_single call received
    all_to_all_single = dist.all_to_all_single

    def counted(output, *args, **kwargs):
        alltoalls.append(output.numel())
        return all_to_all_single(output, *args, **kwargs)

    dist.all_to_all_single = counted
    t0 = time.perf_counter()
    host = _host.TorchHost(fake, host_group)
    finished = fake.all_done.wait(30)
    elapsed = time.perf_counter() - t0
    stopped = host.stop(timeout=5)
    dist.all_to_all_single = all_to_all_single
    out = {"finished": finished, "stopped": stopped, "elapsed": elapsed, "wire": host.wire_seconds,
           "max_in_flight": host.max_in_flight, "in_flight_after": host.in_flight, "ops": dict(host.ops),
           "ops_by_group": dict(host.ops_by_group), "events": fake.events, "results": {}, "alltoalls": alltoalls}
    for op, recv, expected, _ in ops:
        r = {"completions": fake.completions.get(op.id, []), "want_bytes": int(op.recv_bytes)}
        if expected is not None:
            r["equal"] = bool(torch.equal(recv, expected))
        out["results"][op.id] = r
    # An engine of several buckets over the real transport: the plain
    # average, on every rank the same.
    sizes = [100000, 37, 5000, 1, 20000, 3000]
    grads = lambda r, s: [((torch.arange(n) * 7919 + r * 1000003 + s * 10007 + b * 101) % 2003 - 1001).float() / 64
                          for b, n in enumerate(sizes)]
    errs = []
    with _engine.Engine("none", sizes, decision="dense", timeout=20) as eng:
        for s in range(3):
            mine = grads(rank, s)
            eng.step()
            for b, g in enumerate(mine):
                eng.ready(b, g)
            eng.wait()
            for b, g in enumerate(mine):
                want = sum(grads(r, s)[b] for r in range(world)) / world
                errs.append(float((g - want).abs().max() / want.abs().max().clamp(min=1e-30)))
        out["engine_ops"] = sum(eng.host.ops.values())
        out["engine_wire"] = eng.host.wire_seconds
        out["engine_max_in_flight"] = eng.host.max_in_flight
        out["engine_launched"] = eng.host.launched
        out["engine_in_flight_after"] = eng.host.in_flight
    out["engine_error"] = max(errs)
    return out


def peer_dies(rank, world, timeout):
    """The last rank ends its process DIES_AFTER seconds after an engine
    step and a barrier; meanwhile a TorchHost over a ScriptedHosted on the
    others launches 4 all-reduces, which wait for it (each must fail when
    its Work finishes and be completed once with the error), then the engine's step must fail with a CommError
    within the timeout, the next one at once (BrokenError), and close must end the
    host's threads."""
    host_group = dist.new_group(timeout=datetime.timedelta(seconds=timeout))
    sizes = [40000, 300, 7]
    eng = _engine.Engine("none", sizes, decision="dense", timeout=timeout,
                         process_group=dist.new_group(timeout=datetime.timedelta(seconds=timeout)))
    grads = [torch.full((n,), float(rank)) for n in sizes]
    eng.step()
    for b, g in enumerate(grads):
        eng.ready(b, g)
    eng.wait()
    dist.barrier()
    if rank == world - 1:
        time.sleep(DIES_AFTER)  # the others' collectives wait for it meanwhile
        os._exit(0)
    bufs = [torch.ones(n) for n in (1 << 16, 1000, 10, 1 << 12, 5)]
    K = _lib.OpKind
    ops = [_op(K.ALLREDUCE, t.numel(), t.data_ptr(), t.data_ptr(), 4 * t.numel(), 4 * t.numel(), op_id=i + 1)
           for i, t in enumerate(bufs)]
    fake = ScriptedHosted(rank, world, ops)
    t0 = time.monotonic()
    host = _host.TorchHost(fake, host_group)
    finished = fake.all_done.wait(timeout + 20)
    out = {"finished": finished, "seconds": time.monotonic() - t0, "stopped": host.stop(timeout=5),
           "completions": {op.id: fake.completions.get(op.id, []) for op in ops},
           "max_in_flight": host.max_in_flight, "in_flight_after": host.in_flight}
    steps = []
    for _ in range(2):
        t0 = time.monotonic()
        try:
            eng.step()
            for b, g in enumerate(grads):
                eng.ready(b, g)
            eng.wait()
            steps.append(None)
        except Exception as e:
            steps.append({"type": type(e).__name__, "is_comm": isinstance(e, gradcomp.CommError), "message": str(e),
                          "seconds": time.monotonic() - t0})
    out["steps"] = steps
    host = eng.host
    t0 = time.monotonic()
    eng.close()
    out["close_seconds"] = time.monotonic() - t0
    out["engine_host_ended"] = host.stop(timeout=1) and not any(t.is_alive() for t in host._threads)
    return out


class SeveralInFlight(unittest.TestCase):
    def test_posts_run_at_once_and_complete_right(self):
        results = ranks.run(several_in_flight, WORLD, timeout=90)
        for rank, r in enumerate(results):
            with self.subTest(rank=rank):
                self.assertTrue(r["finished"], "rank %d: ops left uncompleted: %s" % (rank, r["events"]))
                self.assertTrue(r["stopped"])
                self.assertEqual(r["in_flight_after"], 0)
                launch_failures = 0
                for op_id, res in r["results"].items():
                    comps = res["completions"]
                    self.assertEqual(len(comps), 1, "op %s completed %d times: %s" % (op_id, len(comps), comps))
                    status, message, written = comps[0]
                    if op_id == "9":  # the wrong length
                        launch_failures += 1
                        self.assertEqual(status, int(_lib.Status.COMM))
                        self.assertIn("ALLGATHER (op 9) failed on rank %d launching it: ValueError" % rank, message)
                        self.assertIn("recv_bytes 3", message)
                        continue
                    self.assertEqual((status, message, written), (int(_lib.Status.OK), None, res["want_bytes"]),
                                     "op %s" % op_id)
                    if "equal" in res:
                        self.assertTrue(res["equal"], "op %s: wrong result" % op_id)
                self.assertEqual(launch_failures, 1)
                # On 3 ranks the small all-gather ran as an all-to-all (one
                # round of messages), the one over DIRECT_GATHER_BYTES as a
                # ring; the ALLTOALL op is the other all-to-all.
                self.assertEqual(sorted(r["alltoalls"]), [2 * WORLD, 5 * WORLD])
                self.assertEqual(sum(r["ops"].values()), len(r["results"]) - 1)
                self.assertEqual(r["ops"]["ALLREDUCE"], 8)
                self.assertEqual(r["ops_by_group"], {"world": len(r["results"]) - 1})
                # The wire time is the union of the collectives' intervals:
                # within the elapsed time however many ran at once.
                self.assertLessEqual(r["wire"], r["elapsed"] + 1e-3)
                self.assertGreater(r["wire"], 0)
                self.assertLess(r["engine_error"], 1e-6)
                self.assertGreater(r["engine_ops"], 0)
                self.assertGreater(r["engine_wire"], 0)
                self.assertEqual(r["engine_in_flight_after"], 0)
                # The engine's threads launched its posts (no taking thread).
                self.assertTrue(r["engine_launched"])
                # The engine leaves each bucket's last collective in flight
                # and goes on to the next bucket's (overlap over a
                # comm.Starter): the host carried several at once.
                self.assertGreaterEqual(r["engine_max_in_flight"], 2)
                self.assertLessEqual(r["engine_max_in_flight"], IN_FLIGHT)
                if rank == WORLD - 1:
                    continue  # the late rank's collectives may finish one by one
                # The others took (and launched) 4 posts before the first one
                # could complete: the late rank was not there yet.
                events = [tuple(e) for e in r["events"]]
                first_done = min(i for i, e in enumerate(events) if e[0] == "complete")
                self.assertEqual(events[:IN_FLIGHT], [("take", i) for i in range(1, IN_FLIGHT + 1)], events)
                self.assertGreaterEqual(first_done, IN_FLIGHT, events)
                self.assertEqual(r["max_in_flight"], IN_FLIGHT)
                self.assertGreater(r["wire"], LATE * 0.5)

    def test_dead_peer_fails_the_collectives_in_flight(self):
        timeout = 3.0
        results = ranks.run(peer_dies, WORLD, timeout, timeout=90, dies=(WORLD - 1,))
        for rank, r in enumerate(results[:-1]):
            with self.subTest(rank=rank):
                self.assertTrue(r["finished"], "rank %d: ops left uncompleted: %s" % (rank, r["completions"]))
                self.assertGreater(r["seconds"], DIES_AFTER * 0.5, r)  # failed as the peer died
                self.assertLess(r["seconds"], timeout + 10, r)
                self.assertTrue(r["stopped"])
                self.assertEqual(r["in_flight_after"], 0)
                self.assertEqual(r["max_in_flight"], IN_FLIGHT)
                for op_id, comps in r["completions"].items():
                    self.assertEqual(len(comps), 1, "op %s: %s" % (op_id, comps))
                    status, message, written = comps[0]
                    self.assertEqual(status, int(_lib.Status.COMM), comps)
                    self.assertIn("the host's ALLREDUCE (op %s) failed on rank %d as it ran: " % (op_id, rank), message)
                step, after = r["steps"]
                self.assertIsNotNone(step, "rank %d stepped on past a dead peer" % rank)
                self.assertTrue(step["is_comm"], step)
                self.assertLess(step["seconds"], timeout + 10, step)
                self.assertIn("rank %d" % rank, step["message"])
                self.assertIn("failed on rank %d as it ran: RuntimeError: " % rank, step["message"])
                self.assertIsNotNone(after)
                # The engine stays broken, saying why.
                self.assertEqual(after["type"], "BrokenError", after)
                self.assertIn("failed on rank %d as it ran" % rank, after["message"])
                self.assertLess(after["seconds"], 1.0, after)
                self.assertLess(r["close_seconds"], timeout + 5, r)
                self.assertTrue(r["engine_host_ended"])


if __name__ == "__main__":
    unittest.main()
