"""One step of gradcomp.torch.State's DDP hook: what it holds while its
buckets come (DDPStep), the completion of DDP's futures after torch's own
all-reduces, and where a step's time went (split)."""

import logging
import time

from ._state import Step

__all__ = ["DDPStep", "complete", "delegate_done", "split"]

logger = logging.getLogger("gradcomp")


def complete(out, f, buf, divide=1, then=None):
    """Completes the future ``out`` with ``buf`` (divided by ``divide``)
    once the collective of future ``f`` ended, or with its error; calls
    ``then()`` before, either way."""
    err = None
    try:
        f.wait()
        if divide != 1:
            buf.div_(divide)
    except Exception as e:
        err = e
    if then is not None:
        then()
    if err is not None:
        out.set_exception(err)
    else:
        out.set_result(buf)


def delegate_done(eng, index, st):
    """Tells ``eng`` that DDP's all-reduce of its delegated bucket ``index``
    ended (its Wait waits for it), and step ``st`` when. An engine closed
    or failed meanwhile has no use for it."""
    st.ended = time.perf_counter()
    try:
        eng.delegate_done(index)
    except Exception as e:
        logger.debug("gradcomp: delegate_done(%d): %s", index, e)


def split(st, stats, wire, done):
    """Where an engine step's time went, in milliseconds: "backward" from
    DDP's first bucket to its last (the step's buckets arriving, gradients
    still being computed), "encode" and "decode" the engine's compression
    and decompression summed over buckets, "wire" the collectives
    themselves as the host ran them, "handoff" the rest of the engine's
    exchange time (posting, queueing, copying: the engine's exchange
    minus the wire, at least 0), and "exposed" from the last bucket to the
    averages (what backward did not hide). Encode, wire, handoff and decode
    run on several threads at once and overlap backward and each other:
    they do not add up to the step."""
    buckets = stats.buckets
    exchange = sum(b.exchange_seconds for b in buckets)
    return {
        "backward": 1e3 * (st.last - st.first),
        "encode": 1e3 * sum(b.compress_seconds for b in buckets),
        "wire": 1e3 * wire,
        "handoff": 1e3 * max(0.0, exchange - wire),
        "decode": 1e3 * sum(b.decompress_seconds for b in buckets),
        "exposed": 1e3 * (done - st.last),
    }


class DDPStep(Step):
    """One step of the DDP hook: its buckets, futures and timings."""

    def __init__(self, number, in_backward):
        super().__init__(number)
        self.in_backward = in_backward
        self.mode = None  # "plain", "staged" or "direct", chosen at the step's first bucket
        self.buckets = {}  # staged and plain: bucket index -> (buffer, its parameters, future), until used
        self.launched = 0  # plain: buckets 0..launched-1 are on the wire
        self.unpermute = None  # staged: (DDP's concatenation, gather index, the engine's) to scatter back
        self.native = {}  # direct: delegated bucket index -> (bucket buffer, its future), until launched
        self.delegated = 0  # direct: the buckets delegated
        self.arrived = set()  # direct: the buckets come so far
        self.native_next = 0  # direct: buckets below it are come, the delegated ones launched
        self.pending = []  # (future, bucket buffer, staged float32 buffer)
        self.readied = set()
        self.stream = None  # CUDA: the stream of the buckets
        self.plain_buckets = 0
        self.first = self.last = time.perf_counter()  # the step's first and latest bucket from DDP
        self.ended = None  # direct: when the latest of its delegated all-reduces ended
        self.wire0 = 0.0  # the host's wire seconds when the engine's step began

