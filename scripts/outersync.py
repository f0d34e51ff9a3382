"""The exchanges that scripts/diloco.py compares: one class per kind of
configuration, each telling the training loop what to call and what it
sent.

Every class is built on one worker after its model and inner optimizer
exist, and offers

    net                  the module to call forward (DDP's wrapper, or the model)
    after_step(s)        called after inner optimizer step s (1, 2, ...);
                         returns (bytes this worker sent in it, the
                         fragments whose synchronization started in it)
    global_params()      the tensors to evaluate (the weights the workers share)
    close()

Bytes are the engine's own count where gradcomp exchanges
(report.bytes_sent, State.stats) and a ring all-reduce's 2(W−1)/W·4·n
for the fp32 all-reduces of torch (DDP's gradients, the reference's and
torchft's pseudo-gradients).
"""

import datetime
import logging
import os
import socket

import torch
import torch.distributed as dist

#: gradcomp's DDP hook: dense warm-up steps (as scripts/lm.py's default).
HOOK_WARMUP = 10


def ring_bytes(n, world):
    """What one worker sends in a ring all-reduce of n float32s."""
    return 2 * (world - 1) * 4 * n // world


class DDP:
    """torch DDP: its own all-reduce of the gradients every step, or, with
    spec, gradcomp's hook (gradcomp.torch.State(spec) and
    register_comm_hook, as scripts/lm.py registers it)."""

    delay = 0  # τ: no exchange outlives its step

    def __init__(self, model, world, a, spec=None):
        from torch.nn.parallel import DistributedDataParallel

        self.model, self.world = model, world
        self.net = DistributedDataParallel(model)
        self.state = None
        if spec:
            import gradcomp.torch as gct

            self.state = gct.State(spec, model=model, decision=a.decision, warmup_steps=HOOK_WARMUP, workers=1,
                                   timeout=float(a.collective_timeout))
            self.net.register_comm_hook(self.state, gct.hook)
        self.nparams = sum(p.numel() for p in model.parameters())

    def after_step(self, s):
        if self.state is not None:
            return self.state.stats["bytes_sent"], (0,)
        return ring_bytes(self.nparams, self.world), (0,)

    def global_params(self):
        return list(self.model.parameters())

    def close(self):
        if self.state is not None:
            self.state.close()


class Outer:
    """gradcomp.outer.DiLoCo with the keyword arguments given, on a process
    group of its own: its exchanges in flight (delay > 0) run collectives
    from the loop's host thread, which must not interleave with the
    training loop's barriers on the default group."""

    def __init__(self, model, a, **kw):
        import gradcomp.outer

        self.net, self.delay = model, kw.get("delay", 0)
        self.loop = gradcomp.outer.DiLoCo(list(model.parameters()), a.sync_every, decision=a.decision,
                                          timeout=float(a.collective_timeout), group=dist.new_group(), **kw)

    def after_step(self, s):
        report = self.loop.step()
        if report.step != s:
            raise RuntimeError("gradcomp.outer: report.step %d at inner step %d" % (report.step, s))
        return report.bytes_sent, tuple(report.started)

    def global_params(self):
        return self.loop.global_params()

    def close(self):
        self.loop.close()


class Reference:
    """DiLoCo in plain torch, for exactness: every H steps an fp32
    all_reduce of the pseudo-gradients θ_global − θ_local (summed, then
    divided by W), torch.optim.SGD(nesterov=True) on the global weights,
    and the local weights set to them."""

    delay = 0  # τ: no exchange outlives its step

    def __init__(self, model, world, a):
        self.net, self.world, self.every = model, world, a.sync_every
        self.local = list(model.parameters())
        self.glob = [p.detach().clone() for p in self.local]
        self.opt = torch.optim.SGD(self.glob, lr=a.outer_lr, momentum=a.outer_momentum, nesterov=True)

    def after_step(self, s):
        if s % self.every:
            return 0, ()
        with torch.no_grad():
            flat = torch.cat([(g - p).reshape(-1) for g, p in zip(self.glob, self.local)])
            dist.all_reduce(flat)
            flat /= self.world
            for g, d in zip(self.glob, flat.split([g.numel() for g in self.glob])):
                g.grad = d.view_as(g)
            self.opt.step()
            for p, g in zip(self.local, self.glob):
                p.copy_(g)
        return ring_bytes(flat.numel(), self.world), (0,)

    def global_params(self):
        return self.glob

    def close(self):
        pass


class Torchft:
    """torchft's DiLoCo (torchft.local_sgd.DiLoCo, one fragment, Nesterov
    outer SGD as the reference's), each worker a replica group of one:
    a TCPStore and a Manager (ProcessGroupGloo) per worker, the
    Lighthouse in worker 0, on ports after a.port. Its step hook on the
    inner optimizer synchronizes every H steps."""

    delay = 0  # τ: no exchange outlives its step

    def __init__(self, model, inner, rank, world, a):
        os.environ.setdefault("RUST_LOG", "warn")  # the Lighthouse's and Manager's per-quorum lines
        logging.getLogger("torchft").setLevel(logging.WARNING)
        from torchft import Manager, ProcessGroupGloo
        from torchft.local_sgd import DiLoCo

        self.net, self.world, self.every = model, world, a.sync_every
        self.nparams = sum(p.numel() for p in model.parameters())
        here = _address_toward(a.master)
        self.lighthouse = None
        if rank == 0:
            from torchft._torchft import LighthouseServer

            self.lighthouse = LighthouseServer(bind="[::]:%d" % (a.port + 1), min_replicas=world)
        self.store = dist.TCPStore(here, a.port + 2 + 2 * rank, is_master=True, wait_for_workers=False)
        timeout = datetime.timedelta(seconds=a.collective_timeout)
        self.manager = Manager(pg=ProcessGroupGloo(timeout=timeout), min_replica_size=world, use_async_quorum=False,
                               init_sync=False,  # the workers start from the same weights (seed)
                               load_state_dict=lambda sd: model.load_state_dict(sd["model"]),
                               state_dict=lambda: {"model": model.state_dict()}, replica_id=str(rank),
                               store_addr=here, store_port=a.port + 2 + 2 * rank, rank=0, world_size=1,
                               lighthouse_addr="http://%s:%d" % (a.master, a.port + 1), hostname=here,
                               port=a.port + 3 + 2 * rank, timeout=timeout)
        outer = torch.optim.SGD(model.parameters(), lr=a.outer_lr, momentum=a.outer_momentum, nesterov=True)
        self.diloco = DiLoCo(self.manager, [model], inner, outer, sync_every=a.sync_every,
                             backup_device=torch.device("cpu"), pin_memory=False)
        self.diloco.__enter__()
        self.names = [n for n, _ in model.named_parameters()]

    def after_step(self, s):
        if s % self.every:
            return 0, ()
        return ring_bytes(self.nparams, self.world), (0,)

    def global_params(self):
        frag = self.diloco._fragments[0]  # torchft keeps the global weights there
        return [frag.original_parameters[n] for n in self.names]

    def close(self):
        self.diloco.__exit__(None, None, None)
        self.manager.shutdown(wait=False)
        if self.lighthouse is not None:
            self.lighthouse.shutdown()


def _address_toward(host):
    """This machine's address on the route to host (a network namespace's
    own address under scripts/diloco, 127.0.0.1 locally)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, 9))
        return s.getsockname()[0]


def build(name, model, inner, rank, world, a):
    """The exchange of configuration name (see scripts/diloco.py)."""
    if name == "ddp":
        return DDP(model, world, a)
    if name.startswith("ddp:"):
        return DDP(model, world, a, spec=name[len("ddp:"):])
    nesterov = dict(optimizer="nesterov", lr=a.outer_lr, momentum=a.outer_momentum)
    if name == "diloco":
        return Outer(model, a, spec="none", **nesterov)
    if name == "streaming":
        return Outer(model, a, fragments=a.fragments, delay=a.delay, alpha=a.alpha, spec="int4",
                     error_feedback=True, **nesterov)
    if name == "sparseloco":
        return Outer(model, a, spec="topk:%g:chunk=4096:bits=2" % a.topk_ratio, error_feedback=True,
                     feedback_decay=a.feedback_decay, optimizer="sgd", lr=a.sparse_lr)
    if name == "reference":
        return Reference(model, world, a)
    if name == "torchft":
        return Torchft(model, inner, rank, world, a)
    raise ValueError("scripts/outersync.py: unknown configuration %r" % name)
