"""The prompt-affinity router of ``rmfast serve --ray``: a ``ray.serve.request_router.RequestRouter`` (Ray Serve's
extension point, named by path in the scorer deployment's ``RequestRouterConfig``) over the functions of
:mod:`rmfast.serve.router` (the rule, its counts). The class is made when first asked for, so that this module
imports without Ray.
"""

from __future__ import annotations

from .router import assign, count, key_of, ranks


def _router_class():
    from ray.serve.request_router import RequestRouter

    class PromptAffinityRouter(RequestRouter):
        """A keyed call (:mod:`rmfast.serve.router`) to its key's replica, else the least loaded of the others; a
        call without a key to the least loaded of all."""

        async def choose_replicas(self, candidate_replicas, pending_request=None):
            key = key_of(pending_request)
            if key is None:
                return [list(candidate_replicas)]
            if pending_request is not None:  # all ranks full: Ray backs off before trying them again
                pending_request.routing_context.should_backoff = True
            return ranks(key, list(candidate_replicas), lambda r: r.replica_id.to_full_id_str())

        def on_request_routed(self, pending_request, replica_id, result):
            key = key_of(pending_request)
            if key is not None:
                live = [r.to_full_id_str() for r in self._replicas]
                count("affinity" if assign(key, live) == replica_id.to_full_id_str() else "fallback")

    PromptAffinityRouter.__module__ = __name__
    PromptAffinityRouter.__qualname__ = "PromptAffinityRouter"
    return PromptAffinityRouter


def __getattr__(name: str):
    if name == "PromptAffinityRouter":  # Ray imports it by its path (RequestRouterConfig in ray_app)
        cls = globals()[name] = _router_class()
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
