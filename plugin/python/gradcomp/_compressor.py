"""The Compressor: one gc_compressor handle and the calls made on it."""

import collections
import ctypes
import threading

from . import _lib

#: A CUDA device as gc_device_info describes it: name, compute capability
#: (major, minor) and total memory in bytes.
DeviceInfo = collections.namedtuple("DeviceInfo", "name major minor memory")

#: The cost model's answer for one bucket (gc_decide): ``compress`` is True
#: when the compressed exchange is predicted faster than a dense all-reduce;
#: the two predictions are in seconds.
Decision = collections.namedtuple("Decision", "compress dense_seconds compressed_seconds")


def _address(obj, writable, float32):
    """(address, length, keepalive) of a C-contiguous buffer-protocol object.

    length counts float32 elements when float32 is set (the buffer's format
    must be 'f'), bytes otherwise. An empty buffer has address None (NULL).
    A read-only buffer that is not ``bytes`` is copied (only for inputs).
    """
    mv = memoryview(obj)
    if not mv.c_contiguous:
        raise ValueError("gradcomp: buffer is not C-contiguous (shape %s, strides %s)" % (mv.shape, mv.strides))
    if float32:
        if mv.format not in ("f", "<f", "=f") or mv.itemsize != 4:
            raise TypeError("gradcomp: want a float32 buffer (format 'f'), got format %r" % mv.format)
        length = mv.nbytes // 4
    else:
        length = mv.nbytes
    if mv.nbytes == 0:
        return None, 0, mv
    if not mv.readonly:
        cbuf = ctypes.c_char.from_buffer(mv.cast("B"))
        return ctypes.addressof(cbuf), length, (mv, cbuf)
    if writable:
        raise ValueError("gradcomp: destination buffer is read-only")
    if isinstance(obj, bytes):
        return ctypes.cast(ctypes.c_char_p(obj), ctypes.c_void_p).value, length, obj
    copy = (ctypes.c_char * mv.nbytes).from_buffer_copy(mv)
    return ctypes.addressof(copy), length, copy


def abi_version():
    """The loaded library's GRADCOMP_ABI_VERSION, as (major, minor)."""
    v = _lib.lib().gc_abi_version()
    return v >> 16, v & 0xFFFF


def version():
    """The loaded library's version string, e.g. "0.1.0"."""
    return _lib.function("gc_version")().decode("utf-8", "replace")


def live_handles():
    """How many compressors are live in this process (gc_live_handles, ABI
    1.1 or later; LibraryError on an ABI 1.0 library)."""
    out = ctypes.c_size_t()
    _lib.call("gc_live_handles", ctypes.byref(out))
    return out.value


def has_cuda():
    """Whether the loaded library runs the device calls (it is
    libgradcomp_cuda.so: gc_features has GC_FEATURE_CUDA). Touches no
    device."""
    return _lib.has("gc_features") and bool(_lib.function("gc_features")() & _lib.FEATURE_CUDA)


def device_info(device=0):
    """The :class:`DeviceInfo` of CUDA device ``device`` (gc_device_info:
    it opens the device's primary context). DeviceError (a LibraryError)
    when the library has no CUDA support or the driver sees no such
    device."""
    name = ctypes.create_string_buffer(256)
    major, minor, memory = ctypes.c_int(), ctypes.c_int(), ctypes.c_uint64()
    _lib.call("gc_device_info", int(device), name, len(name), ctypes.byref(major), ctypes.byref(minor),
              ctypes.byref(memory))
    return DeviceInfo(name.value.decode("utf-8", "replace"), major.value, minor.value, memory.value)


def _flags(feedback, defer):
    """gc_compress's flags for the keyword arguments of the compress methods."""
    if defer and not feedback:
        raise ValueError("gradcomp: defer needs feedback (GC_DEFER only applies with GC_FEEDBACK)")
    return (_lib.FEEDBACK if feedback else 0) | (_lib.DEFER if defer else 0)


def payload_len_raw(address, length):
    """The byte length of the payload starting at ``address`` (``length``
    readable bytes, at least the 56-byte header): gc_payload_len."""
    out = ctypes.c_size_t()
    _lib.call("gc_payload_len", address, length, ctypes.byref(out))
    return out.value


def payload_len(buf):
    """The byte length of the payload at the start of ``buf`` (a bytes-like
    object that may hold padding after it): gc_payload_len."""
    addr, n, keep = _address(buf, writable=False, float32=False)
    return payload_len_raw(addr, n)


def canonical_spec(spec):
    """The canonical form of ``spec``, any spec the engine takes
    ("powersgd:R" included, which no Compressor takes): equivalent specs
    have the same one. A spec that does not parse raises
    InvalidArgumentError (a ValueError) with the library's message.
    Needs ABI 2.8 (gc_spec_canonical)."""
    if not isinstance(spec, str):
        raise TypeError("gradcomp: spec must be a str, not %r" % (spec,))
    return _spec_call("gc_spec_canonical", spec.encode("utf-8"))


def _spec_call(name, *args):
    """Calls ``name(*args, buf, cap, &len)``, an ABI function that copies a
    spec into buf, again with the room it asks for when buf is too small,
    and returns the spec."""
    n = ctypes.c_size_t()
    buf = ctypes.create_string_buffer(128)
    try:
        _lib.call(name, *args, buf, len(buf), ctypes.byref(n))
    except _lib.InvalidArgumentError as e:
        if e.status != _lib.Status.SIZE:
            raise
        buf = ctypes.create_string_buffer(n.value + 1)
        _lib.call(name, *args, buf, len(buf), ctypes.byref(n))
    return buf.value.decode("utf-8")


class Compressor:
    """A compressor built from a spec such as "topk:0.01" or "int8", with its
    error-feedback memory (one residual per bucket id).

    Buffers passed to the methods without ``_raw`` are buffer-protocol
    objects (``array.array('f')``, a numpy float32 array, ``bytearray``);
    the ``_raw`` methods take addresses and lengths, for tensors. A
    Compressor may be used from several threads at once; calls for the same
    bucket are serialized by the library. ``close()`` (or a ``with`` block)
    destroys the handle; a closed Compressor raises ValueError.
    """

    def __init__(self, spec, workers=0):
        """Creates a compressor from ``spec`` with ``workers`` threads (≤ 0:
        all CPUs). A spec the library rejects raises ValueError with its
        message."""
        cspec = _lib.cstring("spec", spec)
        self._handle = 0
        self._close_lock = threading.Lock()
        h = ctypes.c_uint64()
        _lib.call("gc_compressor_create", cspec, int(workers), ctypes.byref(h))
        self._handle = h.value

    @property
    def handle(self):
        """The gc_compressor handle (an int); ValueError once closed."""
        if not self._handle:
            raise ValueError("gradcomp: compressor is closed")
        return self._handle

    def close(self):
        """Destroys the handle and its error-feedback memory. Idempotent."""
        with self._close_lock:
            h, self._handle = self._handle, 0
        if h:
            _lib.call("gc_compressor_destroy", h)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            if getattr(self, "_handle", 0):
                self.close()
        except Exception:  # interpreter shutdown: the library may be gone
            pass

    @property
    def spec(self):
        """The canonical spec string (the same on every rank that parsed an
        equivalent spec)."""
        return _spec_call("gc_compressor_spec", self.handle)

    def max_encoded_len(self, n):
        """The largest payload, in bytes, compressing n elements can produce."""
        out = ctypes.c_size_t()
        _lib.call("gc_max_encoded_len", self.handle, n, ctypes.byref(out))
        return out.value

    def compress_raw(self, grad, n, dst, cap, *, bucket=0, step=0, feedback=False, defer=False):
        """gc_compress on addresses: grad holds n float32, dst cap bytes.
        Returns the payload's length. ``feedback`` folds in and updates the
        bucket's residual; ``defer`` (with feedback) stages the update until
        :meth:`settle`. A NaN or Inf raises NonFiniteError and changes
        nothing."""
        written = ctypes.c_size_t()
        _lib.call("gc_compress", self.handle, bucket, step, _flags(feedback, defer), grad, n, dst, cap,
                  ctypes.byref(written))
        return written.value

    def compress_device(self, grad, n, dst, cap, stream, *, bucket=0, step=0, feedback=False, defer=False):
        """gc_compress_device: grad is the CUDA device address of n float32
        (``tensor.data_ptr()``), dst of cap bytes (at least
        max_encoded_len(n)), stream a CUstream (``torch.cuda.current_stream()
        .cuda_stream``). Returns the payload's length; the payload is
        byte-identical to compress_raw's. Keywords as compress_raw, the
        bucket's residual kept in device memory. It waits for the stream
        (the NaN status and the checksum are read on the host). Needs the
        CUDA library (DeviceError otherwise)."""
        written = ctypes.c_size_t()
        _lib.call("gc_compress_device", self.handle, bucket, step, _flags(feedback, defer), grad, n, dst, cap,
                  stream, ctypes.byref(written))
        return written.value

    def decompress_device(self, payload, length, dst, n, stream, *, add=False):
        """gc_decompress_device (gc_decompress_add_device with ``add``): the
        payload at device address ``payload`` (its exact length) into the n
        float32 at ``dst``. Waits for the stream to validate the payload on
        the host, then enqueues the decode on it and returns."""
        name = "gc_decompress_add_device" if add else "gc_decompress_device"
        _lib.call(name, self.handle, payload, length, dst, n, stream)

    def decompress_slots_device(self, slots, slot_len, count, dst, n, stream, *, add=False):
        """gc_decompress_slots_device: the sum of the ``count`` payloads at
        the start of each ``slot_len``-byte slot (a multiple of 4) from
        device address ``slots`` (an all-gather's output), in slot order,
        set into (or, with ``add``, added to) the n float32 at ``dst``.
        Waits for the stream to validate them, enqueues the decode and
        returns."""
        _lib.call("gc_decompress_slots_device", self.handle, slots, slot_len, count, dst, n, 1 if add else 0, stream)

    def compress(self, grad, dst, **kw):
        """Compresses the float32 buffer ``grad`` into the writable byte buffer
        ``dst`` and returns the payload's length; keywords as compress_raw."""
        g, n, keep_g = _address(grad, writable=False, float32=True)
        d, cap, keep_d = _address(dst, writable=True, float32=False)
        return self.compress_raw(g, n, d, cap, **kw)

    def settle(self, bucket, mode):
        """Settles the deferred compress of ``bucket`` with a :class:`Settle`
        mode (COMMIT, RETAIN or DISCARD)."""
        _lib.call("gc_settle", self.handle, bucket, int(_lib.Settle(mode)))

    def decompress_raw(self, payload, length, dst, n, *, add=False):
        """gc_decompress (or gc_decompress_add when ``add``) on addresses:
        dst = D(c) (or dst += D(c)) over n float32."""
        _lib.call("gc_decompress_add" if add else "gc_decompress", self.handle, payload, length, dst, n)

    def decompress(self, payload, dst, *, add=False):
        """Decodes the bytes-like ``payload`` into the writable float32 buffer
        ``dst`` (or adds to it when ``add``)."""
        p, length, keep_p = _address(payload, writable=False, float32=False)
        d, n, keep_d = _address(dst, writable=True, float32=True)
        self.decompress_raw(p, length, d, n, add=add)

    def save_state(self):
        """The error-feedback memory as bytes (versioned, checksummed)."""
        size = ctypes.c_size_t()
        _lib.call("gc_state_size", self.handle, ctypes.byref(size))
        buf = ctypes.create_string_buffer(max(size.value, 1))
        written = ctypes.c_size_t()
        _lib.call("gc_state_save", self.handle, buf, size.value, ctypes.byref(written))
        return buf.raw[: written.value]

    def load_state(self, data):
        """Replaces the error-feedback memory with one from save_state; the
        whole state is validated first (on error nothing changes)."""
        p, length, keep = _address(data, writable=False, float32=False)
        _lib.call("gc_state_load", self.handle, p, length)

    def decide(self, n, world, bandwidth, latency=0.0, strategy="allgather"):
        """The cost model's :class:`Decision` for a bucket of n elements among
        ``world`` ranks over a link of ``bandwidth`` bytes/s and ``latency``
        seconds, exchanged with ``strategy`` ("allgather": an all-gather
        of whole payloads; "auto": the codec's own strategy, as the engine
        uses it)."""
        flag = ctypes.c_int()
        dense = ctypes.c_double()
        comp = ctypes.c_double()
        _lib.call(
            "gc_decide", self.handle, _lib.cstring("strategy", strategy), n, world, float(bandwidth), float(latency),
            ctypes.byref(flag), ctypes.byref(dense), ctypes.byref(comp),
        )
        return Decision(bool(flag.value), dense.value, comp.value)
