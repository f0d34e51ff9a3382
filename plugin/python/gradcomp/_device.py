"""Where a hook's buckets live, for the engine: host memory (the host
engine over a hosted transport), or a device (the device engine on its own
NCCL communicator: a CUDA GPU, or, in the fake-device test mode, a fake
device whose memory is host memory).

In the fake-device test mode (``GRADCOMP_FAKE_DEVICE=1``,
:func:`gradcomp._lib.fake_device`) the hooks take their CUDA branch for
CPU tensors: a tensor's address is its device pointer, 0 (the fake
device's default stream) its stream, and the fake device's ordinal the
process's local rank. Nothing orders torch's CPU work after the fake
device's streams, so there the hooks complete DDP's futures only once the
engine's step has ended (a host wait, on the State's finisher thread),
where on a GPU they complete them at once, ordered on the stream.
"""

import os

import torch

from . import _lib

__all__ = ["describe", "future", "ordinal", "stream"]


def ordinal(t, rank):
    """The device ordinal of ``t`` for the engine: -1 for host memory, the
    CUDA device's index, or in the fake-device test mode the local rank
    (``LOCAL_RANK``, else ``rank``)."""
    if t.is_cuda:
        return t.device.index if t.device.index is not None else torch.cuda.current_device()
    if _lib.fake_device():
        return int(os.environ.get("LOCAL_RANK", rank))
    return -1


def describe(t, rank):
    """``t``'s device as messages name it ("cuda:1", "fake device 0", "cpu")."""
    if t.is_cuda or not _lib.fake_device():
        return str(t.device)
    return "fake device %d" % ordinal(t, rank)


def stream(t):
    """The raw stream handle the engine orders ``t``'s work on: torch's
    current stream on ``t``'s CUDA device, else 0 (a fake device's default
    stream)."""
    return torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else 0


def future(t):
    """A future for ``t``: CUDA-aware on ``t``'s device (its completion is
    ordered on the current stream, without a host wait), else plain."""
    return torch.futures.Future(devices=[t.device]) if t.is_cuda else torch.futures.Future()
