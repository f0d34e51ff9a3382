"""gradcomp: gradient compression with error feedback, over libgradcomp.so.

A pure-Python (ctypes) binding of gradcomp's C ABI (plugin/include/gradcomp.h):
the codecs (:class:`Compressor`), the engine over a hosted transport
(:class:`Engine`, whose collectives a thread carries out with
torch.distributed; see gradcomp._engine and gradcomp._host), in
:mod:`gradcomp.torch`, a DDP communication hook that drives the engine, and
in :mod:`gradcomp.outer` (imported with the package) the outer loop of
DiLoCo, Streaming DiLoCo and SparseLoCo.
Importing this
package needs neither torch nor a GPU nor the library: the library is found
and loaded on first use, from ``$GRADCOMP_LIB`` or next to this package
(``make plugin`` copies it there; a pip install or wheel holds it there,
built by plugin/python/setup.py).

Errors: a call the library refuses raises :class:`InvalidArgumentError` (a
ValueError) for a bad spec, argument or size, :class:`NonFiniteError` for a
NaN or Inf in a gradient, and :class:`LibraryError` (a RuntimeError) for the
rest, each with the library's message (gc_last_error); :class:`DeviceError`
(a LibraryError) when a device call finds no CUDA library, no GPU, or a
failing CUDA driver. The engine adds :class:`ConfigError` (a ValueError:
the ranks' configurations differ), :class:`CommError` (a collective failed
or timed out: the engine is broken), :class:`ClosedError` and
:class:`BrokenError`; its :class:`NonFiniteError` is a FloatingPointError
too.
"""

from ._compressor import (
    Compressor,
    Decision,
    DeviceInfo,
    abi_version,
    canonical_spec,
    device_info,
    has_cuda,
    live_handles,
    payload_len,
    payload_len_raw,
    version,
)
from ._engine import BucketStats, Engine, StateInfo, StepStats
from . import outer
from ._host import Hosted, TorchHost
from ._lib import (
    ABI_MAJOR,
    ABI_MINOR,
    BrokenError,
    ClosedError,
    CommError,
    ConfigError,
    DeviceError,
    Error,
    Group,
    InvalidArgumentError,
    LibraryError,
    LibraryNotFoundError,
    Names,
    NonFiniteError,
    OpKind,
    OutOfMemoryError,
    Settle,
    Status,
    names,
)

__all__ = [
    "ABI_MAJOR",
    "ABI_MINOR",
    "BrokenError",
    "BucketStats",
    "ClosedError",
    "CommError",
    "Compressor",
    "ConfigError",
    "Decision",
    "DeviceError",
    "DeviceInfo",
    "Engine",
    "Error",
    "Group",
    "Hosted",
    "InvalidArgumentError",
    "LibraryError",
    "LibraryNotFoundError",
    "Names",
    "NonFiniteError",
    "OpKind",
    "OutOfMemoryError",
    "Settle",
    "StateInfo",
    "Status",
    "StepStats",
    "TorchHost",
    "abi_version",
    "canonical_spec",
    "device_info",
    "has_cuda",
    "live_handles",
    "names",
    "outer",
    "payload_len",
    "payload_len_raw",
    "version",
]
