"""Prompt-affinity routing for ``rmfast serve --ray`` (:mod:`rmfast.serve.ray_app`): the N samples of a group reach
the replica that holds (or will hold) their prompt's encoding.

A scoring call carries a routing key (:func:`route_key`, a hash of the samples' prompt part as the split rule of
:func:`rmfast.serve.core.split_sample` finds it, computed by the ingress). The replica for a key is chosen by
rendezvous hashing over the live replicas (:func:`affine`: the replica whose hash with the key is highest), so a
replica that dies or joins moves only its own keys. Ray Serve's router takes the ranks :func:`ranks` gives: the
affine replica first; where its queue is full (``max_ongoing_requests``), the least loaded of the others.

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
import threading

#: the keyword argument of a scoring call that carries its routing key
ROUTE_KWARG = "route"

_lock = threading.Lock()
_counts: dict = {}


def route_key(prompt_ids) -> str:
    """A sample's routing key: a hash of its prompt part's ids, the same in every process (not Python's ``hash``).

    >>> route_key((1, 2, 3)) == route_key([1, 2, 3]), len(route_key((1, 2, 3)))
    (True, 16)
    """
    return hashlib.blake2b(",".join(str(int(i)) for i in prompt_ids).encode(), digest_size=8).hexdigest()


def affine(key: str, replica_ids: list[str]) -> str | None:
    """The replica for ``key`` among ``replica_ids`` (rendezvous hashing), or None where there is none."""
    if not replica_ids:
        return None
    return max(replica_ids, key=lambda r: hashlib.blake2b(f"{key}|{r}".encode(), digest_size=8).digest())


def ranks(key: str, replicas: list, rid=str) -> list[list]:
    """Ray's ranks for a keyed call: ``[[the affine replica], [the others]]`` (``rid``: a replica's id string).

    >>> ranks(route_key((5,)), ["a", "b"]) in ([["a"], ["b"]], [["b"], ["a"]])
    True
    """
    ids = [rid(r) for r in replicas]
    first = affine(key, ids)
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
