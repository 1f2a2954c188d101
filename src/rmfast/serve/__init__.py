"""``rmfast serve``: the reward server RL frameworks call over HTTP, one sample per request, with each group's
prompt encoded once across requests and the same bits for a sample whatever it was batched with.

:mod:`.core` scores samples (the split rule, the prompt cache, batch invariance); :mod:`.scheduler` gathers
requests into waves; :mod:`.app` holds the routes (OpenRLHF's, vLLM's/verl's, rmfast's own); :mod:`.server` runs it
on uvicorn and drains on SIGTERM; :mod:`.ray_app` runs the same app on Ray Serve, replicas behind one address, with
:mod:`.router` / :mod:`.ray_router` keeping a group's samples on one replica. docs/serving.md says how to start it
and point each framework at it.
"""
