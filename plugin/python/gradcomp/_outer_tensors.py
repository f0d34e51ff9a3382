"""The caller's tensors as the outer loop's host float32 buffers.

gc_outer_create takes one host address per tensor, which the library
reads and writes during gc_outer_create and gc_outer_step only. A CPU
float32 tensor that is contiguous is handed over by its own address (the
library updates it in place). Any other — a CUDA tensor, a non-contiguous
view, an FSDP2 DTensor (whose local shard is resolved again at every copy),
or any tensor in the fake-device test mode, where CPU tensors take the
CUDA branch — gets a host MIRROR: a contiguous CPU tensor of its shape
(pinned for a CUDA tensor) that the library uses instead, copied from the
tensor before a step only for the fragments the step reads and back after
it only for those it wrote (gc_outer_due and gc_outer_layout say which: the
schedule is the library's).
"""

import ctypes

from . import _lib

__all__ = ["HostTensors"]


def _local(p):
    """``p``'s local tensor, without autograd: a DTensor's (FSDP2's) local
    shard, else ``p`` itself."""
    to_local = getattr(p, "to_local", None)
    t = to_local() if callable(to_local) else p
    return t.detach()


class HostTensors:
    """The outer loop's tensors: ``params`` (an iterable of float32
    tensors: parameters, plain tensors, DTensors), each by address or
    through a host mirror (see the module documentation). TypeError for a
    tensor that is not float32, or on neither the CPU nor a CUDA device,
    naming its index."""

    def __init__(self, params):
        import torch

        self.params = list(params)
        self.mirrors = []  # per tensor: its host mirror, or None (by address)
        for i, p in enumerate(self.params):
            t = _local(p)
            if t.dtype != torch.float32:
                raise TypeError("gradcomp.outer: tensor %d is %s: the outer loop takes float32 tensors" % (i, t.dtype))
            if t.device.type not in ("cpu", "cuda"):
                raise TypeError("gradcomp.outer: tensor %d is on %s: the outer loop takes CPU or CUDA tensors" % (i, t.device))
            dtensor = callable(getattr(p, "to_local", None))
            direct = t.device.type == "cpu" and t.is_contiguous() and not dtensor and not _lib.fake_device()
            self.mirrors.append(None if direct else torch.empty(t.shape, dtype=torch.float32, pin_memory=t.is_cuda))
        #: Whether some tensor has a mirror (steps then copy).
        self.mirrored = any(m is not None for m in self.mirrors)

    def __len__(self):
        return len(self.params)

    def shapes(self):
        """Each tensor's (local) shape."""
        return [tuple(_local(p).shape) for p in self.params]

    def host(self, i):
        """Tensor ``i``'s host buffer: its mirror, or the tensor itself."""
        m = self.mirrors[i]
        return _local(self.params[i]) if m is None else m

    def addresses(self):
        """The host addresses and element counts, as gc_outer_create takes
        them (a void * array, a uint64_t array), and the tensors they
        belong to (keep them alive while the addresses are in use)."""
        bufs = [self.host(i) for i in range(len(self))]
        addrs = (ctypes.c_void_p * max(len(bufs), 1))(*[b.data_ptr() or None for b in bufs])
        sizes = (ctypes.c_uint64 * max(len(bufs), 1))(*[b.numel() for b in bufs])
        return addrs, sizes, bufs

    def to_host(self, indices):
        """Copies the mirrored tensors among ``indices`` into their
        mirrors."""
        for i in indices:
            m = self.mirrors[i]
            if m is not None:
                m.copy_(_local(self.params[i]))

    def to_device(self, indices):
        """Copies the mirrors among ``indices`` back into their tensors."""
        import torch

        with torch.no_grad():
            for i in indices:
                m = self.mirrors[i]
                if m is not None:
                    _local(self.params[i]).copy_(m)
