"""gradcomp's DDP communication hook under PyTorch Lightning.

Usage (docs/PYTORCH.md, "PyTorch Lightning", has the recipe as tested)::

    import gradcomp.torch
    from gradcomp.lightning import CommHook

    state = gradcomp.torch.State("int8")
    trainer = Trainer(strategy="ddp", callbacks=[CommHook(state)], ...)
    trainer.fit(model, loader)

The State may be made before ``fit``, which initializes the process
group: it learns what needs the group at its first use.

This module imports Lightning: ``lightning.pytorch`` (the ``lightning``
package) where it is installed, else ``pytorch_lightning``. Importing
``gradcomp`` or ``gradcomp.torch`` never does.
"""

from torch.nn.parallel import DistributedDataParallel

from .torch import hook

try:
    from lightning.pytorch import Callback
except ImportError:
    try:
        from pytorch_lightning import Callback
    except ImportError as e:
        raise ImportError("gradcomp.lightning needs PyTorch Lightning: pip install lightning (or pytorch-lightning); "
                          "%s" % e) from e

__all__ = ["CommHook"]


class CommHook(Callback):
    """A Lightning callback that registers gradcomp's DDP communication
    hook, ``gradcomp.torch.hook`` over ``state`` (a gradcomp.torch.State),
    on the model Lightning's DDP strategy ("ddp", "ddp_spawn", ...) has
    wrapped, when fit starts: on CPU and CUDA ranks alike.

    Why a callback: ``DDPStrategy(ddp_comm_state=..., ddp_comm_hook=...)``
    registers its hook only when the strategy's root device is CUDA (its
    private ``_register_ddp_hooks``), so on CPU ranks it never does, and a
    DDPStrategy subclass overriding that method would depend on Lightning's
    internals. A callback needs only public API: ``on_fit_start`` runs on
    every rank after the strategy has wrapped the model
    (``trainer.strategy.model``, a DistributedDataParallel) and before the
    first training step. Do not also pass the hook to DDPStrategy: DDP
    takes one hook.

    One fit per State: each fit wraps the model in a new
    DistributedDataParallel, whose buckets a State that served another
    refuses. A Lightning checkpoint is saved by rank 0 alone, and a
    State's state is each rank's own (its error-feedback memories): save
    ``state.state_dict()`` on every rank to resume exactly.
    """

    def __init__(self, state):
        #: The gradcomp.torch.State the hook runs on.
        self.state = state

    def on_fit_start(self, trainer, pl_module):
        """Registers the hook on ``trainer.strategy.model``; TypeError,
        naming the strategy, when that is not DistributedDataParallel (a
        single-device run has no exchange to compress)."""
        model = trainer.strategy.model
        if not isinstance(model, DistributedDataParallel):
            raise TypeError("gradcomp.lightning.CommHook: the %s strategy's model is %s, not DistributedDataParallel: "
                            "gradcomp's hook needs a DDP strategy (strategy=\"ddp\") on more than one device"
                            % (type(trainer.strategy).__name__, type(model).__name__))
        model.register_comm_hook(self.state, hook)
