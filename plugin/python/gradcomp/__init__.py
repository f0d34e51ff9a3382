"""gradcomp: gradient compression with error feedback, over libgradcomp.so.

A pure-Python (ctypes) binding of gradcomp's C ABI (plugin/include/gradcomp.h)
and, in :mod:`gradcomp.torch`, a DDP communication hook. Importing this
package needs neither torch nor a GPU nor the library: the library is found
and loaded on first use, from ``$GRADCOMP_LIB`` or next to this package
(``make plugin`` copies it there).

Errors: a call the library refuses raises :class:`InvalidArgumentError` (a
ValueError) for a bad spec, argument or size, :class:`NonFiniteError` for a
NaN or Inf in a gradient, and :class:`LibraryError` (a RuntimeError) for the
rest, each with the library's message (gc_last_error); :class:`DeviceError`
(a LibraryError) when a device call finds no CUDA library, no GPU, or a
failing CUDA driver.
"""

from ._compressor import (
    Compressor,
    Decision,
    DeviceInfo,
    abi_version,
    device_info,
    has_cuda,
    live_handles,
    payload_len,
    payload_len_raw,
    version,
)
from ._lib import (
    ABI_MAJOR,
    ABI_MINOR,
    DeviceError,
    Error,
    InvalidArgumentError,
    LibraryError,
    LibraryNotFoundError,
    NonFiniteError,
    Settle,
    Status,
)

__all__ = [
    "ABI_MAJOR",
    "ABI_MINOR",
    "Compressor",
    "Decision",
    "DeviceError",
    "DeviceInfo",
    "Error",
    "InvalidArgumentError",
    "LibraryError",
    "LibraryNotFoundError",
    "NonFiniteError",
    "Settle",
    "Status",
    "abi_version",
    "device_info",
    "has_cuda",
    "live_handles",
    "payload_len",
    "payload_len_raw",
    "version",
]
