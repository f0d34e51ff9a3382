"""ctypes binding of libgradcomp.so's C ABI (plugin/include/gradcomp.h).

The library is found, loaded and checked on first use, never at import:
``GRADCOMP_LIB`` (a path to the library) if set; else, when torch has been
imported and sees a GPU, ``libgradcomp_cuda.so`` next to this file (where
``make plugin`` copies it), falling back to ``libgradcomp.so`` there if it
is missing or does not load. One process holds one of the two (each carries
a Go runtime), so the choice is made once. Every function of the header is
declared here with its exact argument and result types; :func:`call` runs
one and turns a status other than ``GC_OK`` into an exception carrying
``gc_last_error()``'s message.
"""

import ctypes
import enum
import os
import sys
import threading

#: The ABI major version this package speaks (GRADCOMP_ABI_MAJOR).
ABI_MAJOR = 2
#: The ABI minor version this package was written against (GRADCOMP_ABI_MINOR).
ABI_MINOR = 2

#: The environment variable naming the library to load.
ENV_LIB = "GRADCOMP_LIB"
#: The CPU library's file name.
CPU_LIB_NAME = "libgradcomp.so"
#: The CUDA library's file name (device calls; needs libcuda.so.1).
CUDA_LIB_NAME = "libgradcomp_cuda.so"

#: gc_features bit: the loaded library runs the device calls.
FEATURE_CUDA = 1

# Flags of gc_compress.
FEEDBACK = 1
DEFER = 2


class Status(enum.IntEnum):
    """gc_status: the result of every call (GC_OK and the GC_ERR_* codes)."""

    OK = 0
    INVALID = 1
    SPEC = 2
    HANDLE = 3
    SIZE = 4
    CORRUPT = 5
    NONFINITE = 6
    MISMATCH = 7
    STATE = 8
    INTERNAL = 9
    NOCUDA = 10
    NODEVICE = 11
    CUDA = 12


class Settle(enum.IntEnum):
    """gc_settle_mode: how a deferred compress of a bucket is settled."""

    COMMIT = 0
    RETAIN = 1
    DISCARD = 2


class Error(Exception):
    """A gradcomp call failed: ``status`` is its :class:`Status`, ``function``
    the C function's name, and the message is ``gc_last_error()``'s (which
    names the function and the arguments at fault) with the status name."""

    def __init__(self, function, status, message):
        self.function = function
        self.status = status
        super().__init__("%s [GC_ERR_%s]" % (message or "%s failed without a message" % function, status.name))


class InvalidArgumentError(Error, ValueError):
    """The library refused an argument: GC_ERR_SPEC, GC_ERR_INVALID or GC_ERR_SIZE."""


class LibraryError(Error, RuntimeError):
    """Any other failure status (corrupt input, mismatch, state, handle, internal)."""


class NonFiniteError(LibraryError):
    """GC_ERR_NONFINITE: the gradient held a NaN or an Inf; nothing was
    written and error-feedback memory is untouched."""


class DeviceError(LibraryError):
    """A device call failed for want of CUDA (GC_ERR_NOCUDA: the CPU library
    is loaded; GC_ERR_NODEVICE: the driver sees no such GPU) or in the CUDA
    driver (GC_ERR_CUDA)."""


_DEVICE_STATUSES = (Status.NOCUDA, Status.NODEVICE, Status.CUDA)


class LibraryNotFoundError(OSError):
    """The shared library could not be loaded (or is an incompatible ABI)."""


_VALUE_STATUSES = (Status.SPEC, Status.INVALID, Status.SIZE)

_size_p = ctypes.POINTER(ctypes.c_size_t)
_float_p = ctypes.c_void_p  # raw addresses: callers pass integers
_byte_p = ctypes.c_void_p

# name: (restype, argtypes). Every status-returning function uses c_int.
_PROTOTYPES = {
    "gc_abi_version": (ctypes.c_uint32, []),
    "gc_version": (ctypes.c_char_p, []),
    "gc_last_error": (ctypes.c_char_p, []),
    "gc_compressor_create": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(ctypes.c_uint64)]),
    "gc_compressor_destroy": (ctypes.c_int, [ctypes.c_uint64]),
    "gc_compressor_spec": (ctypes.c_int, [ctypes.c_uint64, ctypes.c_char_p, ctypes.c_size_t, _size_p]),
    "gc_max_encoded_len": (ctypes.c_int, [ctypes.c_uint64, ctypes.c_size_t, _size_p]),
    "gc_compress": (
        ctypes.c_int,
        [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint32,
         _float_p, ctypes.c_size_t, _byte_p, ctypes.c_size_t, _size_p],
    ),
    "gc_settle": (ctypes.c_int, [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int]),
    "gc_payload_len": (ctypes.c_int, [_byte_p, ctypes.c_size_t, _size_p]),
    "gc_decompress": (ctypes.c_int, [ctypes.c_uint64, _byte_p, ctypes.c_size_t, _float_p, ctypes.c_size_t]),
    "gc_decompress_add": (ctypes.c_int, [ctypes.c_uint64, _byte_p, ctypes.c_size_t, _float_p, ctypes.c_size_t]),
    "gc_state_size": (ctypes.c_int, [ctypes.c_uint64, _size_p]),
    "gc_state_save": (ctypes.c_int, [ctypes.c_uint64, _byte_p, ctypes.c_size_t, _size_p]),
    "gc_state_load": (ctypes.c_int, [ctypes.c_uint64, _byte_p, ctypes.c_size_t]),
    "gc_decide": (
        ctypes.c_int,
        [ctypes.c_uint64, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_double, ctypes.c_double,
         ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_double), ctypes.POINTER(ctypes.c_double)],
    ),
}

_devptr = ctypes.c_size_t  # gc_devptr and gc_stream: uintptr_t
_stream = ctypes.c_size_t

# Functions added after ABI 1.0: name -> (minor version, restype, argtypes).
_OPTIONAL = {
    "gc_live_handles": (1, ctypes.c_int, [_size_p]),
    "gc_features": (2, ctypes.c_uint32, []),
    "gc_device_info": (
        2, ctypes.c_int,
        [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int),
         ctypes.POINTER(ctypes.c_uint64)],
    ),
    "gc_compress_device": (
        2, ctypes.c_int,
        [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint32,
         _devptr, ctypes.c_size_t, _devptr, ctypes.c_size_t, _stream, _size_p],
    ),
    "gc_decompress_device": (
        2, ctypes.c_int, [ctypes.c_uint64, _devptr, ctypes.c_size_t, _devptr, ctypes.c_size_t, _stream],
    ),
    "gc_decompress_add_device": (
        2, ctypes.c_int, [ctypes.c_uint64, _devptr, ctypes.c_size_t, _devptr, ctypes.c_size_t, _stream],
    ),
    "gc_decompress_slots_device": (
        2, ctypes.c_int,
        [ctypes.c_uint64, _devptr, ctypes.c_size_t, ctypes.c_size_t, _devptr, ctypes.c_size_t, ctypes.c_int, _stream],
    ),
}

_lock = threading.Lock()
_lib = None
_path = None


def torch_sees_gpu():
    """Whether torch is imported (this package never imports it) and sees a
    CUDA device."""
    torch = sys.modules.get("torch")
    try:
        return torch is not None and bool(torch.cuda.is_available())
    except Exception:  # a torch without CUDA support, or a broken install
        return False


def candidates():
    """The paths tried, in order: $GRADCOMP_LIB if set (only it); else the
    CUDA library next to this package when torch sees a GPU, then the CPU
    library next to it."""
    env = os.environ.get(ENV_LIB)
    if env:
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    names = [CUDA_LIB_NAME, CPU_LIB_NAME] if torch_sees_gpu() else [CPU_LIB_NAME]
    return [os.path.join(here, name) for name in names]


def lib():
    """The loaded library, loading and checking it on the first call.

    Raises LibraryNotFoundError naming every path tried when none loads, or
    when the library's ABI major version differs from ABI_MAJOR.
    """
    global _lib
    with _lock:
        if _lib is None:
            _lib = _load()
        return _lib


def path():
    """The file of the loaded library (loading it if need be)."""
    lib()
    return _path


def _load():
    global _path
    tried = []
    for path in candidates():
        if not os.path.exists(path):
            tried.append("%s (no such file)" % path)
            continue
        try:
            handle = ctypes.CDLL(path)
        except OSError as e:
            tried.append("%s (%s)" % (path, e))
            continue
        for name in ("gc_abi_version", "gc_last_error"):
            if not hasattr(handle, name):
                raise LibraryNotFoundError("%s lacks %s: not a gradcomp library" % (path, name))
        for name, (restype, argtypes) in _PROTOTYPES.items():
            fn = getattr(handle, name, None)
            if fn is not None:  # a missing one fails when called, naming it
                fn.restype = restype
                fn.argtypes = argtypes
        version = handle.gc_abi_version()
        if version >> 16 != ABI_MAJOR:
            raise LibraryNotFoundError(
                "%s has ABI %d.%d; this package needs ABI %d.x" % (path, version >> 16, version & 0xFFFF, ABI_MAJOR)
            )
        for name, (minor, restype, argtypes) in _OPTIONAL.items():
            fn = getattr(handle, name, None)
            if version & 0xFFFF >= minor and fn is not None:
                fn.restype = restype
                fn.argtypes = argtypes
        _path = path
        return handle
    raise LibraryNotFoundError(
        "gradcomp: cannot load %s: tried %s; build it with `make plugin` or set %s"
        % (CPU_LIB_NAME, "; ".join(tried), ENV_LIB)
    )


def has(name):
    """Whether the loaded library provides the ABI function ``name`` (one
    added in a later minor version needs that version)."""
    handle = lib()
    if name in _OPTIONAL and handle.gc_abi_version() & 0xFFFF < _OPTIONAL[name][0]:
        return False
    fn = getattr(handle, name, None)
    return fn is not None and fn.argtypes is not None


def function(name):
    """The library's ABI function ``name``; LibraryError when the loaded
    library lacks it."""
    if not has(name):
        version = lib().gc_abi_version()
        raise LibraryError(
            name, Status.INVALID,
            "the loaded library (ABI %d.%d) lacks %s" % (version >> 16, version & 0xFFFF, name),
        )
    return getattr(lib(), name)


def last_error():
    """The calling thread's last error message from the library, or ""."""
    msg = lib().gc_last_error()
    return msg.decode("utf-8", "replace") if msg else ""


def call(name, *args):
    """Calls the library's function ``name`` with ``args``; a status other
    than GC_OK raises InvalidArgumentError (ValueError) for GC_ERR_SPEC,
    GC_ERR_INVALID and GC_ERR_SIZE, NonFiniteError for GC_ERR_NONFINITE,
    DeviceError for GC_ERR_NOCUDA, GC_ERR_NODEVICE and GC_ERR_CUDA, and
    LibraryError (RuntimeError) for the rest, with gc_last_error's message.
    """
    fn = function(name)
    status = fn(*args)
    if status == Status.OK:
        return
    try:
        status = Status(status)
    except ValueError:
        raise LibraryError(name, Status.INTERNAL, "unknown status %d; %s" % (status, last_error()))
    message = last_error()
    if status in _VALUE_STATUSES:
        raise InvalidArgumentError(name, status, message)
    if status == Status.NONFINITE:
        raise NonFiniteError(name, status, message)
    if status in _DEVICE_STATUSES:
        raise DeviceError(name, status, message)
    raise LibraryError(name, status, message)
