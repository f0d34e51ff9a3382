"""Which node each rank is on, and the process groups of the hierarchical
exchange (strategy "hier", and "auto" when it may choose it): a rank's
node comes from GRADCOMP_RANKS_PER_NODE, torchrun's LOCAL_RANK and
LOCAL_WORLD_SIZE, or its host name, the same on every rank."""

import collections
import datetime
import os
import socket

import torch.distributed as dist

__all__ = ["ENV_RANKS_PER_NODE", "find_nodes", "hier_layout", "make_groups"]


#: The environment variable that places rank r on node r // k (tests of the
#: hierarchical exchange on one machine).
ENV_RANKS_PER_NODE = "GRADCOMP_RANKS_PER_NODE"


def _node_of(claims):
    """The node id of every rank from what each rank claimed (its
    GRADCOMP_RANKS_PER_NODE, torchrun's LOCAL_RANK and LOCAL_WORLD_SIZE,
    its host name), and how it was found. The same on every rank (every
    rank has every claim); ValueError when the claims disagree."""
    world = len(claims)

    def disagree(what, key):
        values = collections.OrderedDict()
        for r, c in enumerate(claims):
            values.setdefault(c[key], r)
        (a, ra), (b, rb) = list(values.items())[:2]
        return ValueError("gradcomp.torch.State(strategy='hier'): ranks disagree on %s: rank %d has %r, rank %d has %r"
                          % (what, ra, a, rb, b))

    ks = set(c["k"] for c in claims)
    if ks != {None}:
        if len(ks) > 1:
            raise disagree(ENV_RANKS_PER_NODE, "k")
        raw = ks.pop()
        try:
            k = int(raw)
        except ValueError:
            k = 0
        if k < 1:
            raise ValueError("gradcomp.torch.State(strategy='hier'): %s=%r: want a number of ranks ≥ 1"
                             % (ENV_RANKS_PER_NODE, raw))
        return [r // k for r in range(world)], "%s=%d" % (ENV_RANKS_PER_NODE, k)
    lws = set(c["local_world_size"] for c in claims)
    if None not in lws and all(c["local_rank"] is not None for c in claims):
        if len(lws) > 1:
            raise disagree("LOCAL_WORLD_SIZE (every node must hold the same number of ranks)", "local_world_size")
        size = int(lws.pop())
        if size < 1 or world % size:
            raise ValueError("gradcomp.torch.State(strategy='hier'): LOCAL_WORLD_SIZE=%d does not divide the %d ranks: "
                             "every node must hold the same number of ranks" % (size, world))
        for r, c in enumerate(claims):
            if int(c["local_rank"]) != r % size:
                raise ValueError("gradcomp.torch.State(strategy='hier'): rank %d has LOCAL_RANK=%s, LOCAL_WORLD_SIZE=%d: "
                                 "want torchrun's placement, rank r on node r // LOCAL_WORLD_SIZE (set %s otherwise)"
                                 % (r, c["local_rank"], size, ENV_RANKS_PER_NODE))
        return [r // size for r in range(world)], "LOCAL_WORLD_SIZE=%d" % size
    names = {}
    return [names.setdefault(c["host"], len(names)) for c in claims], "host names"


def find_nodes(process_group):
    """The ranks of every node, in node order, and how they were found.
    Collective over the default group: every rank all-gathers its claim
    (GRADCOMP_RANKS_PER_NODE=k: rank r on node r // k; else torchrun's
    LOCAL_RANK and LOCAL_WORLD_SIZE; else socket.gethostname()).
    ValueError on every rank when the claims disagree, the nodes hold
    different numbers of ranks, or process_group is not every rank."""
    world = dist.get_world_size()
    if dist.get_world_size(process_group) != world:
        raise ValueError("gradcomp.torch.State(strategy='hier'): process_group holds %d of the job's %d ranks: the "
                         "hierarchical exchange runs over every rank" % (dist.get_world_size(process_group), world))
    env = os.environ
    claim = {"k": env.get(ENV_RANKS_PER_NODE) or None, "local_rank": env.get("LOCAL_RANK"),
             "local_world_size": env.get("LOCAL_WORLD_SIZE"), "host": socket.gethostname()}
    claims = [None] * world
    dist.all_gather_object(claims, claim)
    node_of, how = _node_of(claims)
    members = collections.OrderedDict()
    for r, n in enumerate(node_of):
        members.setdefault(n, []).append(r)
    nodes = list(members.values())
    sizes = [len(m) for m in nodes]
    if len(set(sizes)) > 1:
        raise ValueError("gradcomp.torch.State(strategy='hier'): the nodes (from %s) hold %s ranks: every node must "
                         "hold the same number (nodes: %s)" % (how, sizes, nodes))
    return nodes, how


def make_groups(nodes, process_group, timeout):
    """This rank's place among ``nodes`` (find_nodes's) and its groups:
    ((node, nodes, local_rank, local_size), node group, cross group). It
    makes every node's group and every local rank's cross-node group with
    dist.new_group, in the same order on every rank."""
    rank, local_size = dist.get_rank(), len(nodes[0])
    kw = dict(timeout=datetime.timedelta(seconds=timeout), backend=dist.get_backend(process_group))
    mine_node = mine_cross = None
    for n, m in enumerate(nodes):
        g = dist.new_group(ranks=m, **kw)
        if rank in m:
            mine_node, node, local_rank = g, n, m.index(rank)
    for l in range(local_size):
        g = dist.new_group(ranks=[m[l] for m in nodes], **kw)
        if l == local_rank:
            mine_cross = g
    return (node, len(nodes), local_rank, local_size), mine_node, mine_cross


def hier_layout(process_group=None, timeout=60.0):
    """This rank's place among the nodes and its groups for strategy
    "hier": ((node, nodes, local_rank, local_size), node group, cross
    group). Collective over the default group: every rank all-gathers its
    claim (GRADCOMP_RANKS_PER_NODE=k: rank r on node r // k; else torchrun's
    LOCAL_RANK and LOCAL_WORLD_SIZE; else socket.gethostname()), then makes
    every node's group and every local rank's cross-node group with
    dist.new_group, in the same order on every rank. ValueError on every
    rank when the claims disagree or the nodes hold different numbers of
    ranks."""
    nodes, _ = find_nodes(process_group)
    return make_groups(nodes, process_group, timeout)

