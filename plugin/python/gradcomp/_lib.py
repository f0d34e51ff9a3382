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
ABI_MINOR = 11

#: The environment variable naming the library to load.
ENV_LIB = "GRADCOMP_LIB"
#: The CPU library's file name.
CPU_LIB_NAME = "libgradcomp.so"
#: The CUDA library's file name (device calls; needs libcuda.so.1).
CUDA_LIB_NAME = "libgradcomp_cuda.so"

#: The fake-device test library's file name (``make plugin``; see :func:`fake_device`).
FAKE_LIB_NAME = "libgradcomp_fake.so"
#: The environment variable that turns the fake-device test mode on.
ENV_FAKE_DEVICE = "GRADCOMP_FAKE_DEVICE"

#: gc_features bit: the loaded library runs the device calls.
FEATURE_CUDA = 1
#: gc_features bit (ABI 2.9): a test build whose engine runs on the fake device.
FEATURE_FAKE_DEVICE = 2
#: GC_NCCL_UNIQUE_ID_BYTES (ABI 2.9).
NCCL_UNIQUE_ID_BYTES = 128

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
    TIMEOUT = 13
    CLOSED = 14
    COMM = 15
    CONFIG = 16
    BROKEN = 17
    NOMEM = 18
    NCCL = 19


class OpKind(enum.IntEnum):
    """gc_op_kind: the collectives a hosted transport posts (gc_op.kind)."""

    ALLREDUCE = 1
    ALLGATHER = 2
    REDUCESCATTER = 3
    ALLTOALL = 4
    BROADCAST = 5
    BARRIER = 6


class Group(enum.IntEnum):
    """gc_op.group (ABI 2.4): the ranks that carry a post out. An engine
    with strategy "hier" posts on this rank's node group and cross-node
    group besides the transport's own ranks."""

    WORLD = 0
    NODE = 1
    CROSS = 2


class Names(enum.IntEnum):
    """gc_name_list (ABI 2.10): the lists of names :func:`names` reads from
    the library."""

    STRATEGY = 0
    DECISION = 1
    ORIGIN = 2
    CAUTION = 3
    GUARD = 4
    OUTER_OPTIMIZER = 5  # ABI 2.11: the outer loop's optimizers, "nesterov", "sgd", "none"


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
        #: The library's message, without the status name.
        self.message = message
        super().__init__("%s [GC_ERR_%s]" % (message or "%s failed without a message" % function, status.name))


class InvalidArgumentError(Error, ValueError):
    """The library refused an argument: GC_ERR_SPEC, GC_ERR_INVALID or GC_ERR_SIZE."""


class LibraryError(Error, RuntimeError):
    """Any other failure status (corrupt input, mismatch, state, handle, internal)."""


class NonFiniteError(LibraryError, FloatingPointError):
    """GC_ERR_NONFINITE: a gradient held a NaN or an Inf (a FloatingPointError
    as well as a LibraryError). From gc_compress: nothing was written and
    error-feedback memory is untouched. From gc_engine_wait (an engine made
    with fail_on_nonfinite): the message names the buckets and the ranks;
    the engine stays usable."""


class ConfigError(Error, ValueError):
    """GC_ERR_CONFIG: the ranks' engine configurations differ (the message
    names the field and both values), or one rank's is invalid. Raised on
    every rank by gc_engine_create."""


class CommError(LibraryError):
    """GC_ERR_COMM: a collective failed or did not finish in time (an error
    in the host's communicator, a dead peer, a post nobody took): the engine
    is broken; every error-feedback memory of a host engine holds e + g
    (a device engine's keeps e)."""


class ClosedError(LibraryError):
    """GC_ERR_CLOSED: the hosted transport or the engine is closed."""


class BrokenError(LibraryError):
    """GC_ERR_BROKEN: an earlier step of the engine failed; destroy the
    engine and its transport."""


class OutOfMemoryError(LibraryError, MemoryError):
    """GC_ERR_NOMEM (ABI 2.3): the engine's buffers would not fit in the
    memory the machine can give; nothing was allocated (a MemoryError as
    well as a LibraryError)."""


class DeviceError(LibraryError):
    """A device call failed for want of CUDA (GC_ERR_NOCUDA: the CPU library
    is loaded; GC_ERR_NODEVICE: the driver sees no such GPU) or in the CUDA
    driver (GC_ERR_CUDA)."""


_DEVICE_STATUSES = (Status.NOCUDA, Status.NODEVICE, Status.CUDA)


class NCCLError(LibraryError):
    """GC_ERR_NCCL (ABI 2.9): libnccl.so.2 did not load (the message lists
    where it looked) or an NCCL call failed (the message names it)."""


class LibraryNotFoundError(OSError):
    """The shared library could not be loaded (or is an incompatible ABI)."""


_VALUE_STATUSES = (Status.SPEC, Status.INVALID, Status.SIZE)
_CLASSES = {
    Status.NONFINITE: NonFiniteError,
    Status.CONFIG: ConfigError,
    Status.COMM: CommError,
    Status.CLOSED: ClosedError,
    Status.BROKEN: BrokenError,
    Status.NOMEM: OutOfMemoryError,
    Status.NCCL: NCCLError,
}

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
_u64 = ctypes.c_uint64
_u64_p = ctypes.POINTER(ctypes.c_uint64)
_int_p = ctypes.POINTER(ctypes.c_int)
_double_p = ctypes.POINTER(ctypes.c_double)


class Op(ctypes.Structure):
    """gc_op: one collective a hosted transport posted (see gradcomp.h)."""

    _fields_ = [
        ("id", ctypes.c_uint64),
        ("kind", ctypes.c_int32),
        ("root", ctypes.c_int32),
        ("device", ctypes.c_int32),
        ("group", ctypes.c_int32),  # since ABI 2.4 (reserved, 0, before): a Group
        ("count", ctypes.c_uint64),
        ("send", ctypes.c_size_t),
        ("recv", ctypes.c_size_t),
        ("send_bytes", ctypes.c_uint64),
        ("recv_bytes", ctypes.c_uint64),
        ("stream", ctypes.c_size_t),
    ]


#: gc_launch_fn (ABI 2.7): void (*)(void *ctx, const gc_op *op).
LAUNCH_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(Op))


class EngineConfig(ctypes.Structure):
    """gc_engine_config (size must be sizeof(gc_engine_config))."""

    _fields_ = [
        ("size", ctypes.c_uint32),
        ("error_feedback", ctypes.c_int32),
        ("spec", ctypes.c_char_p),
        ("strategy", ctypes.c_char_p),
        ("decision", ctypes.c_char_p),
        ("fail_on_nonfinite", ctypes.c_int32),
        ("warmup", ctypes.c_int32),
        ("timeout_seconds", ctypes.c_double),
        ("workers", ctypes.c_int32),
        ("device", ctypes.c_int32),
        ("momentum", ctypes.c_double),  # since ABI 2.1
        ("schedule", ctypes.c_char_p),  # since ABI 2.1
        ("guard", ctypes.c_double),  # since ABI 2.2
        ("momentum_masking", ctypes.c_int32),  # since ABI 2.2
        ("node", ctypes.c_int32),  # since ABI 2.4: this rank's place among the nodes (all 0: unknown)
        ("nodes", ctypes.c_int32),
        ("local_rank", ctypes.c_int32),
        ("local_size", ctypes.c_int32),
        ("node_spec", ctypes.c_char_p),  # since ABI 2.5: the codec of "hier"'s node stages (None: float32)
        ("tensor_counts", ctypes.POINTER(ctypes.c_uint64)),  # since ABI 2.7: tensors per bucket (NULL: none)
        ("shapes", ctypes.POINTER(ctypes.c_uint64)),  # since ABI 2.7: their (rows, cols) pairs
        ("feedback_decay", ctypes.c_double),  # since ABI 2.11: β of decayed error feedback (0: none)
    ]

    @classmethod
    def size_for(cls, minor):
        """The size field for a library of ABI 2.``minor``: this struct's
        sizeof, or for a library older than 2.11 the 2.7 size it reads
        (without feedback_decay)."""
        return ctypes.sizeof(cls) if minor >= 11 else cls.feedback_decay.offset


class OuterConfig(ctypes.Structure):
    """gc_outer_config (ABI 2.11; size must be sizeof(gc_outer_config))."""

    _fields_ = [
        ("size", ctypes.c_uint32),
        ("sync_every", ctypes.c_int32),
        ("fragments", ctypes.c_int32),
        ("delay", ctypes.c_int32),
        ("alpha", ctypes.c_double),
        ("optimizer", ctypes.c_int32),  # a gc_outer_optimizer: names(Names.OUTER_OPTIMIZER).index(name)
        ("on_nonfinite", ctypes.c_int32),  # OUTER_SKIP or OUTER_FAIL
        ("lr", ctypes.c_double),
        ("momentum", ctypes.c_double),
        ("bucket_elements", ctypes.c_uint64),
        ("fragment_of", ctypes.POINTER(ctypes.c_int32)),
        ("shapes", ctypes.POINTER(ctypes.c_uint64)),
    ]


#: gc_outer_nonfinite (ABI 2.11): a non-finite average skips its sync;
#: GC_OUTER_FAIL also makes gc_outer_step return GC_ERR_NONFINITE.
OUTER_SKIP, OUTER_FAIL = 0, 1


class OuterReport(ctypes.Structure):
    """gc_outer_report (ABI 2.11): what one gc_outer_step did (set size,
    capacity and the arrays; the library writes the rest)."""

    _fields_ = [
        ("size", ctypes.c_uint32),
        ("capacity", ctypes.c_uint32),
        ("started", ctypes.POINTER(ctypes.c_int32)),
        ("finished", ctypes.POINTER(ctypes.c_int32)),
        ("skipped", ctypes.POINTER(ctypes.c_int32)),
        ("step", ctypes.c_uint64),
        ("bytes_sent", ctypes.c_uint64),
        ("nstarted", ctypes.c_uint32),
        ("nfinished", ctypes.c_uint32),
        ("nskipped", ctypes.c_uint32),
        ("first_skipped", ctypes.c_int32),
    ]


class BucketStatsC(ctypes.Structure):
    """gc_bucket_stats: one bucket in the last waited step."""

    _fields_ = [
        ("elements", ctypes.c_uint64),
        ("bytes_sent", ctypes.c_uint64),
        ("compressed", ctypes.c_int32),
        ("nonfinite", ctypes.c_int32),
        ("trial", ctypes.c_int32),
        ("switched", ctypes.c_int32),
        ("decided_compressed", ctypes.c_int32),
        ("guarded", ctypes.c_int32),  # since ABI 2.2 (0 before)
        ("compress_seconds", ctypes.c_double),
        ("exchange_seconds", ctypes.c_double),
        ("decompress_seconds", ctypes.c_double),
        ("predicted_dense_seconds", ctypes.c_double),
        ("predicted_compressed_seconds", ctypes.c_double),
        ("measured_dense_seconds", ctypes.c_double),
        ("measured_compressed_seconds", ctypes.c_double),
        ("strategy", ctypes.c_char * 32),
        ("reason", ctypes.c_char * 512),
    ]


class BucketVerdictC(ctypes.Structure):
    """gc_bucket_verdict (ABI 2.10): what chose one bucket's path in the
    last waited step, the caution and the accuracy guard's state, as
    values (set size to its sizeof)."""

    _fields_ = [
        ("size", ctypes.c_uint32),
        ("origin", ctypes.c_int32),  # a gc_origin: names(Names.ORIGIN)[origin]
        ("caution", ctypes.c_int32),  # a gc_caution
        ("guard", ctypes.c_int32),  # a gc_guard_state
        ("held_back", ctypes.c_double),
        ("guard_threshold", ctypes.c_double),
    ]


_PROTOTYPES.update({
    # ABI 1.1 and 1.2, part of every 2.x library.
    "gc_live_handles": (ctypes.c_int, [_size_p]),
    "gc_features": (ctypes.c_uint32, []),
    "gc_device_info": (
        ctypes.c_int,
        [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, _int_p, _int_p, _u64_p],
    ),
    "gc_compress_device": (
        ctypes.c_int,
        [_u64, _u64, _u64, ctypes.c_uint32, _devptr, ctypes.c_size_t, _devptr, ctypes.c_size_t, _stream, _size_p],
    ),
    "gc_decompress_device": (ctypes.c_int, [_u64, _devptr, ctypes.c_size_t, _devptr, ctypes.c_size_t, _stream]),
    "gc_decompress_add_device": (ctypes.c_int, [_u64, _devptr, ctypes.c_size_t, _devptr, ctypes.c_size_t, _stream]),
    "gc_decompress_slots_device": (
        ctypes.c_int,
        [_u64, _devptr, ctypes.c_size_t, ctypes.c_size_t, _devptr, ctypes.c_size_t, ctypes.c_int, _stream],
    ),
    # ABI 2.0: the hosted transport and the engine.
    "gc_hosted_create": (ctypes.c_int, [ctypes.c_int, ctypes.c_int, _u64_p]),
    "gc_hosted_destroy": (ctypes.c_int, [_u64]),
    "gc_hosted_take": (ctypes.c_int, [_u64, ctypes.c_double, ctypes.POINTER(Op)]),
    "gc_hosted_complete": (ctypes.c_int, [_u64, _u64, ctypes.c_int, ctypes.c_char_p, _u64]),
    "gc_engine_create": (
        ctypes.c_int, [_u64, ctypes.POINTER(EngineConfig), _u64_p, ctypes.c_size_t, _u64_p],
    ),
    "gc_engine_destroy": (ctypes.c_int, [_u64]),
    "gc_engine_step": (ctypes.c_int, [_u64]),
    "gc_engine_ready": (ctypes.c_int, [_u64, ctypes.c_size_t, _float_p, ctypes.c_size_t]),
    "gc_engine_delegable": (ctypes.c_int, [_u64, ctypes.c_size_t, ctypes.POINTER(ctypes.c_int)]),
    "gc_engine_delegate": (ctypes.c_int, [_u64, ctypes.c_size_t]),
    "gc_engine_delegate_done": (ctypes.c_int, [_u64, ctypes.c_size_t]),
    "gc_engine_ready_device": (ctypes.c_int, [_u64, ctypes.c_size_t, _devptr, ctypes.c_size_t, _stream]),
    "gc_engine_done": (ctypes.c_int, [_u64, _stream]),
    "gc_engine_wait": (ctypes.c_int, [_u64, ctypes.c_double]),
    "gc_engine_stats": (
        ctypes.c_int,
        [_u64, ctypes.c_size_t, ctypes.POINTER(BucketStatsC), _u64_p, _u64_p, _double_p, _double_p],
    ),
    "gc_engine_state_size": (ctypes.c_int, [_u64, _size_p]),
    "gc_engine_state_save": (ctypes.c_int, [_u64, _byte_p, ctypes.c_size_t, _size_p]),
    "gc_engine_state_load": (ctypes.c_int, [_u64, _byte_p, ctypes.c_size_t]),
    "gc_engine_state_info": (
        ctypes.c_int,
        [_byte_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t,
         _int_p, _int_p, _u64_p, _size_p, _u64_p, ctypes.c_size_t],
    ),
})

# Functions added after ABI 2.0: name -> (minor version, restype, argtypes).
_OPTIONAL = {
    "gc_engine_held_back": (2, ctypes.c_int, [_u64, ctypes.c_size_t, _double_p]),
    "gc_hosted_take_group": (4, ctypes.c_int, [_u64, ctypes.c_int, ctypes.c_double, ctypes.POINTER(Op)]),
    "gc_engine_state_check": (
        3, ctypes.c_int, [_byte_p, ctypes.c_size_t, ctypes.POINTER(EngineConfig), _u64_p, ctypes.c_size_t, ctypes.c_int],
    ),
    "gc_engine_state_load_reshaped": (5, ctypes.c_int, [_u64, _byte_p, ctypes.c_size_t]),
    "gc_engine_state_layout": (5, ctypes.c_int, [_byte_p, ctypes.c_size_t] + [ctypes.POINTER(ctypes.c_int)] * 4),
    "gc_hosted_set_launcher": (7, ctypes.c_int, [_u64, ctypes.c_int, LAUNCH_FN, ctypes.c_void_p]),
    "gc_nccl_unique_id": (9, ctypes.c_int, [ctypes.c_char_p]),
    "gc_engine_create_nccl": (
        9, ctypes.c_int,
        [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.POINTER(EngineConfig), _u64_p, ctypes.c_size_t, _u64_p],
    ),
    "gc_spec_canonical": (8, ctypes.c_int, [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)]),
    "gc_engine_verdict": (10, ctypes.c_int, [_u64, ctypes.c_size_t, ctypes.POINTER(BucketVerdictC)]),
    "gc_name": (10, ctypes.c_char_p, [ctypes.c_int, ctypes.c_int]),
    # ABI 2.11: the outer loop.
    "gc_outer_create": (
        11, ctypes.c_int,
        [_u64, ctypes.POINTER(OuterConfig), ctypes.POINTER(EngineConfig), ctypes.c_void_p, _u64_p, ctypes.c_size_t,
         _u64_p],
    ),
    "gc_outer_destroy": (11, ctypes.c_int, [_u64]),
    "gc_outer_step": (11, ctypes.c_int, [_u64, ctypes.POINTER(OuterReport)]),
    "gc_outer_due": (
        11, ctypes.c_int,
        [_u64, ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_int32), ctypes.c_size_t, _size_p, _size_p],
    ),
    "gc_outer_layout": (11, ctypes.c_int, [_u64, ctypes.POINTER(ctypes.c_int32), ctypes.c_size_t, _size_p]),
    "gc_outer_global": (11, ctypes.c_int, [_u64, ctypes.c_size_t, _float_p, ctypes.c_size_t]),
    "gc_outer_state_size": (11, ctypes.c_int, [_u64, _size_p]),
    "gc_outer_state_save": (11, ctypes.c_int, [_u64, _byte_p, ctypes.c_size_t, _size_p]),
    "gc_outer_state_load": (11, ctypes.c_int, [_u64, _byte_p, ctypes.c_size_t]),
}

_lock = threading.Lock()
_lib = None
_path = None
_names = {}  # Names -> its names, read once: the process loads one library


def torch_sees_gpu():
    """Whether torch is imported (this package never imports it) and sees a
    CUDA device."""
    torch = sys.modules.get("torch")
    try:
        return torch is not None and bool(torch.cuda.is_available())
    except Exception:  # a torch without CUDA support, or a broken install
        return False


def fake_device():
    """Whether the fake-device test mode is on (``GRADCOMP_FAKE_DEVICE=1``):
    the package loads :data:`FAKE_LIB_NAME`, whose engine runs on a fake
    device in host memory, and the DDP and FSDP2 hooks take their CUDA
    branch for CPU tensors (a tensor's address is its "device pointer",
    the fake device's default stream its stream). It is for testing the
    CUDA path on machines without a GPU, never for training."""
    return os.environ.get(ENV_FAKE_DEVICE, "") not in ("", "0")


def candidates():
    """The paths tried, in order: $GRADCOMP_LIB if set (only it); else, in
    the fake-device test mode, the fake library next to this package (only
    it); else the CUDA library next to it when torch sees a GPU, then the
    CPU library."""
    env = os.environ.get(ENV_LIB)
    if env:
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    if fake_device():
        return [os.path.join(here, FAKE_LIB_NAME)]
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


def names(which):
    """The library's names of list ``which`` (a :class:`Names`), in value
    order, as a tuple of str (gc_name, ABI 2.10): the one list of the
    strategies, decisions, origins, cautions or guard states there is.
    LibraryError when the loaded library is older."""
    got = _names.get(which)
    if got is None:
        fn, out = function("gc_name"), []
        while True:
            name = fn(int(which), len(out))
            if name is None:
                break
            out.append(name.decode("utf-8"))
        got = _names[which] = tuple(out)
    return got


def cstring(what, value):
    """``value`` (a str) as the NUL-terminated UTF-8 bytes a ``const char *``
    argument takes. TypeError if it is not a str; ValueError if it holds a
    NUL, which C would read as its end (``"int8\\0garbage"`` would reach
    the library as ``"int8"``)."""
    if not isinstance(value, str):
        raise TypeError("gradcomp: %s must be a str, got %s" % (what, type(value).__name__))
    if "\0" in value:
        raise ValueError("gradcomp: %s %r holds a NUL character at index %d" % (what, value, value.index("\0")))
    return value.encode("utf-8")


def last_error():
    """The calling thread's last error message from the library, or ""."""
    msg = lib().gc_last_error()
    return msg.decode("utf-8", "replace") if msg else ""


def call(name, *args):
    """Calls the library's function ``name`` with ``args``; a status other
    than GC_OK raises, with gc_last_error's message: InvalidArgumentError
    (ValueError) for GC_ERR_SPEC, GC_ERR_INVALID and GC_ERR_SIZE;
    ConfigError (ValueError) for GC_ERR_CONFIG; NonFiniteError (a
    FloatingPointError) for GC_ERR_NONFINITE; CommError, ClosedError and
    BrokenError for GC_ERR_COMM, GC_ERR_CLOSED and GC_ERR_BROKEN;
    DeviceError for GC_ERR_NOCUDA, GC_ERR_NODEVICE and GC_ERR_CUDA; and
    LibraryError (RuntimeError) for the rest.
    """
    check(name, function(name)(*args))


def check(name, status):
    """Raises what :func:`call` raises for ``status``, returned by the
    library's function ``name`` (nothing for GC_OK): for a caller that has
    work to do between the call and the exception."""
    if status == Status.OK:
        return
    try:
        status = Status(status)
    except ValueError:
        raise LibraryError(name, Status.INTERNAL, "unknown status %d; %s" % (status, last_error()))
    raise error(name, status, last_error())


def saved_state(handle, size_name, save_name):
    """A handle's state as bytes: ``size_name`` (gc_*_state_size) for its
    length, then ``save_name`` (gc_*_state_save) into a buffer of that
    length, again with the length the save asks for if the state grew in
    between (GC_ERR_SIZE)."""
    size = ctypes.c_size_t()
    call(size_name, handle, ctypes.byref(size))
    while True:
        buf = ctypes.create_string_buffer(max(size.value, 1))
        written = ctypes.c_size_t()
        try:
            call(save_name, handle, buf, size.value, ctypes.byref(written))
        except InvalidArgumentError as e:
            if e.status == Status.SIZE and written.value > size.value:
                size.value = written.value
                continue
            raise
        return buf.raw[: written.value]


def error(name, status, message):
    """The exception call raises for ``status`` returned by function ``name``
    with gc_last_error's ``message``."""
    status = Status(status)
    if status in _VALUE_STATUSES:
        return InvalidArgumentError(name, status, message)
    if status in _CLASSES:
        return _CLASSES[status](name, status, message)
    if status in _DEVICE_STATUSES:
        return DeviceError(name, status, message)
    return LibraryError(name, status, message)
