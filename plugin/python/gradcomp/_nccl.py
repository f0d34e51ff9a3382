"""The engine's own NCCL communicator: its unique id, spread through
torch.distributed's store.

Rank 0 of a process group makes the id (gc_nccl_unique_id) and sets it
under a key of the store that every rank of the group computes alike (the
group's global ranks and how many communicators this process has made
for them before); the others wait for the key up to the engine's timeout.
This works whatever the group's backend is (``nccl``, ``gloo``,
``cpu:gloo,cuda:nccl``): the store is torch's rendezvous, not a
collective. A rank 0 that cannot make the id sets its error instead, so
no rank waits for an id that never comes.
"""

import ctypes
import datetime
import threading

from . import _lib

_ID = b"id:"
_ERR = b"error:"

_lock = threading.Lock()
_made = {}  # global ranks of a group -> how many ids were spread for it


def _store_and_ranks(group):
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    ranks = tuple(range(dist.get_world_size())) if group is None else tuple(c10d.get_process_group_ranks(group))
    return c10d._get_default_store(), ranks


def _key(ranks):
    with _lock:
        n = _made.get(ranks, 0)
        _made[ranks] = n + 1
    return "gradcomp/nccl/%s/%d" % (",".join(map(str, ranks)), n)


def unique_id(group, rank, timeout):
    """The unique id of a new communicator of ``group`` (this process's
    ``rank`` in it), made by its rank 0 and spread through the store. Every
    rank of the group calls it once per communicator, in the same order.
    Raises :class:`gradcomp._lib.NCCLError` on rank 0 when it cannot make
    the id and on the others when it said so, and :class:`TimeoutError`
    when nothing comes within ``timeout`` seconds."""
    store, ranks = _store_and_ranks(group)
    key = _key(ranks)
    if rank == 0:
        buf = ctypes.create_string_buffer(_lib.NCCL_UNIQUE_ID_BYTES)
        try:
            _lib.call("gc_nccl_unique_id", buf)
        except _lib.Error as e:
            store.set(key, _ERR + str(e).encode("utf-8", "replace"))
            raise
        store.set(key, _ID + buf.raw)
        return buf.raw
    try:
        store.wait([key], datetime.timedelta(seconds=timeout))
    except RuntimeError as e:  # torch's store raises RuntimeError (DistStoreError) on a timeout
        raise TimeoutError(
            "gradcomp: rank %d of the group of global ranks %s: no NCCL unique id from its rank 0 within %gs "
            "(store key %r): did rank 0 create its State and engine? (%s)" % (rank, list(ranks), timeout, key, e)
        ) from e
    value = store.get(key)
    if value.startswith(_ERR):
        raise _lib.NCCLError("gc_nccl_unique_id", _lib.Status.NCCL, "rank 0 could not make the NCCL unique id: %s"
                             % value[len(_ERR):].decode("utf-8", "replace"))
    if not value.startswith(_ID) or len(value) != len(_ID) + _lib.NCCL_UNIQUE_ID_BYTES:
        raise _lib.NCCLError("gc_nccl_unique_id", _lib.Status.NCCL, "store key %r holds %d bytes that are not a unique "
                             "id (another program's key?)" % (key, len(value)))
    return value[len(_ID):]
