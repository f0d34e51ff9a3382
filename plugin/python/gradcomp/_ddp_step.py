"""One step of gradcomp.torch.State's DDP hook: what it holds while its
buckets come (DDPStep), the thread that waits for the engine's steps
(Finisher), the completion of DDP's futures after torch's own
all-reduces, and where a step's time went (split)."""

import logging
import queue
import threading
import time

from ._state import Step

__all__ = ["DDPStep", "Finisher", "complete", "delegate_done", "split"]

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


class Finisher:
    """A daemon thread that runs the functions submitted to it, one at a
    time, in order: the State's step finisher. One thread for every step,
    where a thread started per step would cost DDP's autograd thread up to
    milliseconds on a loaded host (Thread.start waits until the new thread
    runs)."""

    def __init__(self, name):
        self._jobs = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn, *args):
        """Queues ``fn(*args)``; returns at once."""
        self._jobs.put((fn, args))

    def drain(self):
        """Waits until every submitted function has returned."""
        self._jobs.join()

    def running_here(self):
        """Whether the caller is the finisher's thread."""
        return threading.current_thread() is self._thread

    def close(self):
        """Runs what was submitted, then ends the thread."""
        self._jobs.put(None)
        self._thread.join()

    def _run(self):
        while True:
            job = self._jobs.get()
            try:
                if job is None:
                    return
                job[0](*job[1])
            except Exception:  # a finisher records its own failures; this is a bug
                logger.exception("gradcomp: the step finisher failed")
            finally:
                job = None  # not held while waiting for the next: a State dropped unclosed can go
                self._jobs.task_done()


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

