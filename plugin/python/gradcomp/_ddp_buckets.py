"""What gradcomp.torch.State knows of DDP's buckets: their parameters in
its first step (DDP's initial buckets, the same in every process for the
same model and DDP arguments), DDP's final buckets as a plain step after
the first saw them, and the parameters of the engine's buckets as a
"signature" (each parameter's place among the first step's and its shape),
which a checkpoint records and a resumed State lines DDP's buckets up
against."""

import math

import torch

from ._engine import matrix_shape

__all__ = ["BucketsSeen", "bucket_params", "line_up", "signature_shapes", "valid_signature"]


def bucket_params(bucket):
    """A DDP bucket's parameters, in its order (None for a bucket that does
    not say: GradBucket.parameters() missing or empty)."""
    try:
        params = bucket.parameters()
    except AttributeError:
        return None
    return list(params) or None


def _numel(shape):
    n = 1
    for d in shape:
        n *= int(d)
    return n


def signature_shapes(sig, sizes):
    """The engine buckets' shapes (matrix_shape) from a signature of the
    parameters in the engine's bucket order, cut at ``sizes``; None when
    there is none or a parameter straddles two buckets."""
    if not sig:
        return None
    out, left, i = [[] for _ in sizes], list(sizes), 0
    for _, shape in sig:
        n = _numel(shape)
        while i < len(sizes) and left[i] == 0 and n > 0:
            i += 1
        if i == len(sizes) or n > left[i]:
            return None
        out[i].append(matrix_shape(shape))
        left[i] -= n
    return out if not any(left) else None


def valid_signature(sig, layout):
    """Whether sig is a list of [index, shape] pairs (ints) whose shapes
    hold sum(layout) elements."""
    if not isinstance(sig, list) or layout is None:
        return False
    for p in sig:
        if not (isinstance(p, list) and len(p) == 2 and isinstance(p[0], int) and isinstance(p[1], list)
                and all(isinstance(d, int) and d >= 0 for d in p[1])):
            return False
    return sum(_numel(shape) for _, shape in sig) == sum(layout)


def _shapes_text(sig, limit=6):
    """A short text of a signature's shapes."""
    shown = ["x".join(map(str, shape)) or "scalar" for _, shape in sig[:limit]]
    return "[%s%s]" % (", ".join(shown), ", ..." if len(sig) > limit else "")


class BucketsSeen:
    """DDP's buckets as a State saw them: ``first`` (bucket index -> its
    parameters, in the State's first step) and ``final`` (bucket index ->
    (elements, parameters), from a plain step after the first)."""

    def __init__(self):
        self.first = {}
        self.final = {}

    def sizes(self):
        """The final buckets' sizes, once every bucket 0..n-1 was seen (else
        None)."""
        if not self.final or sorted(self.final) != list(range(len(self.final))):
            return None
        return [self.final[i][0] for i in range(len(self.final))]

    def params(self):
        """The parameters of the final buckets, in bucket order, as a
        signature (None when unknown)."""
        params = [self.final[i][1] for i in range(len(self.final))]
        if any(p is None for p in params):
            return None
        return self.signature([p for ps in params for p in ps])

    def signature(self, params):
        """Parameters as [position, shape] pairs, position being the
        parameter's place among the first step's parameters (None when
        either is unknown)."""
        positions = self._positions()
        if params is None or positions is None:
            return None
        return [[positions.get(id(p), -1), list(p.shape)] for p in params]

    def _positions(self):
        """Each parameter's place (by id) in the concatenation of the first
        step's buckets (None when unknown)."""
        n = len(self.first)
        if not n or sorted(self.first) != list(range(n)) or any(self.first[i] is None for i in range(n)):
            return None
        params = [p for i in range(n) for p in self.first[i]]
        return {id(p): k for k, p in enumerate(params)}

    def powersgd_shapes(self, sizes, buckets=None):
        """PowerSGD's bucket shapes: each DDP bucket's parameters as
        matrices (matrix_shape), when the engine's buckets ``sizes`` are
        DDP's and DDP says which parameters each holds; else None (the
        engine then refuses powersgd, saying it needs them). ``buckets``:
        DDP's buckets as {index: (elements, parameters)} (default: the
        final ones)."""
        buckets = self.final if buckets is None else buckets
        if not buckets:
            return None
        layout = [buckets.get(i) for i in range(len(sizes))]
        if len(buckets) != len(sizes) or any(b is None or b[1] is None for b in layout) or \
                [b[0] for b in layout] != list(sizes):
            return None
        return [[matrix_shape(p.shape) for p in b[1]] for b in layout]


def line_up(number, sizes, engine_sizes, sig, want):
    """Where each element of the engine's buckets (``engine_sizes``, their
    parameters' signature ``want``) sits in DDP's buckets of step
    ``number`` (``sizes``, signature ``sig``): None when at the same place
    (the concatenations are equal), else a gather index (a LongTensor over
    DDP's concatenation). ValueError when they cannot line up (other
    totals, other parameters)."""
    if sum(sizes) != sum(engine_sizes):
        raise ValueError("gradcomp.torch: step %d: DDP's buckets %s hold %d elements, the engine's %s (from the "
                         "checkpoint or step 1) %d: not the model this State was made for"
                         % (number, sizes, sum(sizes), engine_sizes, sum(engine_sizes)))
    if sig is None or want is None or sig == want:
        return None
    if sorted(sig) != sorted(want) or len({p for p, _ in sig}) != len(sig) or min(p for p, _ in sig) < 0:
        raise ValueError("gradcomp.torch: step %d: DDP's buckets hold the parameters %s, the engine's buckets "
                         "(from the checkpoint) %s: their gradients do not line up"
                         % (number, _shapes_text(sig), _shapes_text(want)))
    where, start = {}, 0
    for pos, shape in sig:
        n = math.prod(shape)
        where[pos] = (start, n)
        start += n
    return torch.cat([torch.arange(where[pos][0], where[pos][0] + where[pos][1]) for pos, _ in want])
