"""Prompt-affinity routing for ``rmfast serve --ray`` (:mod:`rmfast.serve.ray_app`): the N samples of a group reach
the replica that holds (or will hold) their prompt's encoding.

A scoring call carries a routing key (:func:`route_key`, a hash of the samples' prompt part as the split rule of
:func:`rmfast.serve.core.split_sample` finds it, computed by the ingress). A key is given a replica once
(:func:`assign`) and keeps it while that replica lives: the first of the key's rendezvous order over the live
replicas (:func:`affine`'s order: a replica that dies or joins moves only its own keys) that holds fewer than
(1 + :data:`BALANCE`) x its share of the active keys, those called within :data:`ACTIVE_S` seconds (consistent
hashing with bounded loads, Mirrokni, Thorup and Zadimoghaddam, 2018: plain rendezvous
hashing of the 8 groups of a step put 6 on one of 2 replicas, which then did three quarters of the work, measured in
``benchmarks/results/serve_ray_cpu_2026-11-29``). Ray Serve's router takes the ranks :func:`ranks` gives: the
key's replica first; where its queue is full (``max_ongoing_requests``), the least loaded of the others.

:class:`rmfast.serve.ray_router.PromptAffinityRouter` (Ray Serve's own extension point, a ``RequestRouter``) does
it with these functions, and counts its choices here (:func:`routed`: a call sent to its affine replica, or to
another because that one was full), which the ingress's ``/metrics`` shows. Ray copies the router's own module into
the process that routes (by value); this one it imports there, so the counts the router writes are the ones the
ingress reads.

>>> ids = ["r1", "r2", "r3"]
>>> key = route_key((1, 7, 8))
>>> affine(key, ids) == affine(key, list(reversed(ids)))      # the order of the replicas does not matter
True
>>> gone = affine(key, ids); rest = [r for r in ids if r != gone]
>>> all(affine(route_key((k,)), rest) == affine(route_key((k,)), ids)   # a replica leaving moves only its keys
...     for k in range(200) if affine(route_key((k,)), ids) != gone)
True
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
from collections import Counter, OrderedDict

#: the keyword argument of a scoring call that carries its routing key
ROUTE_KWARG = "route"
#: a replica takes a new key only while it holds fewer than (1 + BALANCE) x the mean of the active keys per replica,
#: rounded up (0: the mean: a step of 8 groups splits 4/4 over 2 replicas; 0.25 let it split 5/3, measured 0.97x
#: the default router's rate where 4/4 is 1.0x)
BALANCE = 0.0
#: a key is active (it counts in its replica's load) for this long after its last call: an RL step's groups are
#: scored within it, and the last step's are gone by the next (the policy's generation takes longer)
ACTIVE_S = 10.0
#: the keys remembered (their replicas), most recent last; an older key is assigned afresh when it comes back
RECENT_KEYS = 4096

_lock = threading.Lock()
_counts: dict = {}
_assigned: OrderedDict = OrderedDict()  # key -> [replica id, its last call (monotonic s)]


def route_key(prompt_ids) -> str:
    """A sample's routing key: a hash of its prompt part's ids, the same in every process (not Python's ``hash``).

    >>> route_key((1, 2, 3)) == route_key([1, 2, 3]), len(route_key((1, 2, 3)))
    (True, 16)
    """
    return hashlib.blake2b(",".join(str(int(i)) for i in prompt_ids).encode(), digest_size=8).hexdigest()


def _order(key: str, replica_ids: list[str]) -> list[str]:
    """The key's rendezvous order: replicas by the hash of (key, replica), highest first."""
    return sorted(replica_ids, key=lambda r: hashlib.blake2b(f"{key}|{r}".encode(), digest_size=8).digest(), reverse=True)


def affine(key: str, replica_ids: list[str]) -> str | None:
    """The first replica of ``key``'s rendezvous order among ``replica_ids``, or None where there is none."""
    return _order(key, replica_ids)[0] if replica_ids else None


def assign(key: str, replica_ids: list[str], now: float | None = None) -> str | None:
    """The replica ``key``'s calls go to: the one it was given while that one lives, else the first of its
    rendezvous order holding fewer than (1 + BALANCE) x the mean of the active keys (module doc); None: no replica.

    >>> _assigned.clear()
    >>> got = [assign(route_key((k,)), ["a", "b"]) for k in range(40)]
    >>> abs(got.count("a") - got.count("b")) <= 6, got == [assign(route_key((k,)), ["a", "b"]) for k in range(40)]
    (True, True)
    >>> [assign(route_key((k,)), ["b"]) for k in range(40)].count("b")      # "a" gone: its keys move to "b"
    40
    >>> later = time.monotonic() + ACTIVE_S                               # the keys above are no longer active
    >>> got = [assign(route_key((k, 1)), ["a", "b"], now=later) for k in range(8)]
    >>> sorted([got.count("a"), got.count("b")]) in ([4, 4], [3, 5])
    True
    """
    if not replica_ids:
        return None
    now = time.monotonic() if now is None else now
    with _lock:
        got = _assigned.get(key)
        if got is not None and got[0] in replica_ids:
            got[1] = now
            _assigned.move_to_end(key)
            return got[0]
        held = Counter(r for r, t in _assigned.values() if r in replica_ids and now - t < ACTIVE_S)
        cap = math.ceil((1 + BALANCE) * (sum(held.values()) + 1) / len(replica_ids))
        order = _order(key, replica_ids)
        pick = next((r for r in order if held[r] < cap), order[0])
        _assigned[key] = [pick, now]
        _assigned.move_to_end(key)
        while len(_assigned) > RECENT_KEYS:
            _assigned.popitem(last=False)
        return pick


def ranks(key: str, replicas: list, rid=str) -> list[list]:
    """Ray's ranks for a keyed call: ``[[the key's replica], [the others]]`` (``rid``: a replica's id string).

    >>> ranks(route_key((5,)), ["a", "b"]) in ([["a"], ["b"]], [["b"], ["a"]])
    True
    """
    ids = [rid(r) for r in replicas]
    first = assign(key, ids)
    if first is None:
        return []
    rest = [r for r, i in zip(replicas, ids) if i != first]
    return [[replicas[ids.index(first)]]] + ([rest] if rest else [])


def count(choice: str, n: int = 1) -> None:
    with _lock:
        _counts[choice] = _counts.get(choice, 0) + n


def routed() -> dict:
    """This process's routing choices so far: ``{"affinity": n, "fallback": n}`` (the ingress's router's)."""
    with _lock:
        return dict(_counts)


def key_of(pending_request) -> str | None:
    """The routing key of a Ray Serve pending request, or None (a call without one: ``describe``)."""
    kwargs = getattr(pending_request, "kwargs", None) or {}
    key = kwargs.get(ROUTE_KWARG)
    return key if isinstance(key, str) else None
