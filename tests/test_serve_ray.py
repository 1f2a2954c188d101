"""``rmfast serve --ray`` (issue 53): two CPU replicas of a tiny reward model on a local Ray Serve behind one
address; each group's prompt is encoded once, on one replica, from single requests in random order; the scores are
the single-process server's bits; a replica killed mid-load costs no request; a replica that cannot load the model
stops the deployment with one line.

One deployment for the module (Ray's start and the replicas' loads are most of the time).
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import random
import sys
import threading
import time
from functools import partial

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")

from rmfast.cli import build_parser, main  # noqa: E402
from rmfast.cli.serve import make_core  # noqa: E402
from rmfast.errors import UserError  # noqa: E402
from rmfast.serve.metrics import parse  # noqa: E402
from rmfast.serve.ray_app import LOAD_FAILED, build, deploy, routing_for  # noqa: E402
from rmfast.serve.server import ServeOptions, free_port, make_app, serve_config, serving  # noqa: E402

WORDS = ["apple", "river", "blue", "quantum", "seven", "honest", "tree", "the", "is", "answer", "maybe", "why"]


def _texts(tok, groups: int, per: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for g in range(groups):
        msgs = [{"role": "user", "content": f"Q{seed}-{g}: " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 40)))}]
        for _ in range(per):
            resp = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 30)))
            out.append({"group": g, "text": tok.apply_chat_template(msgs + [{"role": "assistant", "content": resp}],
                                                                    tokenize=False)})
    rng.shuffle(out)
    return out


def _send(url: str, data: list[dict]) -> list[float]:
    """Each text as its own /get_reward request from 16 threads; the scores in ``data``'s order."""

    def one(d):
        r = httpx.post(f"{url}/get_reward", json={"query": [d["text"]]}, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()["rewards"][0]

    with cf.ThreadPoolExecutor(16) as pool:
        return list(pool.map(one, data))


def _args(tiny_dir, *more):
    return build_parser().parse_args(["serve", str(tiny_dir), "--dtype", "float32", "--device", "cpu", *more])


@pytest.fixture(scope="module")
def cluster(tiny_dir, smol_tokenizer):
    """(Ray Serve URL, single-process server URL, its core): the same model folder and options in both."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    try:
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        opts = ServeOptions(max_wait_ms=500)  # a request waits for its wave in its replica: a kill finds it there
        args = _args(tiny_dir)
        deploy(build(partial(make_core, args, opts), opts, serve_config(opts, name="tiny-rm"), replicas=2,
                     actor_options={"num_cpus": 1}))
        core = make_core(args, opts)
        app, _ = make_app(core, opts, name="tiny-rm")
        with serving(app) as single:
            yield f"http://127.0.0.1:{port}", single, core
    finally:
        serve.shutdown()
        ray.shutdown()


def _metrics(url: str) -> dict:
    return parse(httpx.get(f"{url}/metrics", timeout=30).text)


def test_groups_are_encoded_once_on_one_replica_with_the_single_servers_bits(cluster, smol_tokenizer):
    url, single, core = cluster
    data = _texts(smol_tokenizer, 8, 8, seed=11)
    before = _metrics(url)
    got = _send(url, data)
    m = _metrics(url)
    d = {k: m[k] - before.get(k, 0) for k in m}
    assert d["rmfast_samples_total"] == 64
    models = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]
    assert {"gemm_rows", "split", "waves"} <= set(models["decisions"])
    rs = models["ray_serve"]
    assert rs["replicas"] == 2 and rs["routing"] == routing_for("affinity", ray.__version__)[0] and rs["routing_reason"]
    if rs["routing"] == "affinity":  # (a Ray older than AFFINITY_RAY runs its own router: run by hand on 2.55)
        # every group's prompt encoded exactly once across both replicas: one replica per group
        assert d["rmfast_prompt_encodings_total"] == 8 and d["rmfast_prompt_hits_total"] == 56
        per = {k.split('"')[1]: v for k, v in m.items() if k.startswith("rmfast_replica_prompt_encodings_total{")}
        assert sorted(per.values()) in ([4, 4], [3, 5])  # the groups spread with bounded loads (router.assign)
        # each replica's linger count is on the ingress's /metrics (its own scheduler's)
        assert len([k for k in m if k.startswith("rmfast_replica_waves_lingered_total{")]) == 2
        assert d['rmfast_routed_total{choice="affinity"}'] == 64 and d['rmfast_routed_total{choice="fallback"}'] == 0
    assert got == _send(single, data)  # the single-process server's bits (JSON floats: exact)
    body = {"prompt": [{"role": "user", "content": "Hi"}], "response": "Hello!", "label": None}  # slime's, same route
    one = [httpx.post(f"{u}/reward", json=body, timeout=60).json() for u in (url, single)]
    assert type(one[0]) is float and one[0] == one[1]


def test_one_request_of_several_prompts_is_answered_with_the_single_servers_bits(cluster, smol_tokenizer):
    """OpenRLHF's remote_rm_fn and /v1/score send several prompts in one request: its groups go to their replicas
    (two, here) and come back in the request's order (it hung until --timeout-s, then a 500)."""
    url, single, _ = cluster
    texts = [d["text"] for d in _texts(smol_tokenizer, 6, 2, seed=12)]
    got = [httpx.post(f"{u}/get_reward", json={"query": texts}, timeout=120) for u in (url, single)]
    assert [r.status_code for r in got] == [200, 200], got[0].text
    assert got[0].json()["rewards"] == got[1].json()["rewards"]
    conv = {"conversations": [{"prompt": "What is 2+2?", "responses": ["4", "5"]},
                              {"prompt": "Name a colour.", "responses": ["Blue"]}]}
    got = [httpx.post(f"{u}/v1/score", json=conv, timeout=120) for u in (url, single)]
    assert [r.status_code for r in got] == [200, 200], got[0].text
    assert got[0].json()["scores"] == got[1].json()["scores"]


def test_the_start_line_names_the_running_proxys_address(cluster):
    """Where a Serve ran on the cluster already, Ray keeps its proxy's options: the line says that address."""
    from rmfast.cli.serve_ray import serve_address

    url, _, _ = cluster
    port = int(url.rsplit(":", 1)[1])
    assert serve_address(ServeOptions(port=port)) == (url, "")
    got, note = serve_address(ServeOptions(port=port + 1))
    assert got == url and f"--port {port + 1}" in note


def test_a_client_that_disconnects_costs_nobody_their_result(cluster, smol_tokenizer):
    """Behind Ray's proxy too: a client gone while its sample waits in a replica for its wave (--max-wait-ms 500)
    costs the next client nothing (its own bits, answered); Ray cancels the gone request."""
    import json
    import socket

    url, single, _ = cluster
    data = [d["text"] for d in _texts(smol_tokenizer, 2, 1, seed=13)]
    port = int(url.rsplit(":", 1)[1])
    before = _metrics(url)
    body = json.dumps({"query": [data[0]]}).encode()
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"POST /get_reward HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
              + str(len(body)).encode() + b"\r\n\r\n" + body)
    t0, routed = time.monotonic(), lambda m: sum(v - before.get(k, 0) for k, v in m.items()
                                                  if k.startswith("rmfast_routed_total"))
    while time.monotonic() - t0 < 0.3 and not routed(_metrics(url)):  # until it waits in a replica's queue
        time.sleep(0.01)
    waited = time.monotonic() - t0
    s.close()  # gone before its wave runs
    got = httpx.post(f"{url}/get_reward", json={"query": [data[1]]}, timeout=120).json()["rewards"][0]
    time.sleep(1.0)  # the gone sample's wave would have run by now
    m = _metrics(url)
    assert got == httpx.post(f"{single}/get_reward", json={"query": [data[1]]}, timeout=120).json()["rewards"][0]
    # Ray's cancel travels proxy -> ingress -> replica: it leaves the queue where it arrives before the wave runs
    # (alone on this machine: 1 scored), else its wave scores it and the result is dropped (seen in the full module:
    # 2); either way nobody else's result or bits change
    assert m["rmfast_samples_total"] - before["rmfast_samples_total"] in (1, 2), m
    assert waited >= 0.3 or routed(m) == 2, m  # the gone request had reached a replica


def _scorer_replicas() -> list[str]:
    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
            if a["name"].startswith("SERVE_REPLICA::") and "#Scorer#" in a["name"]]


def test_a_replica_killed_mid_load_costs_no_request_and_ray_restarts_it(cluster, smol_tokenizer):
    url, single, core = cluster
    data = _texts(smol_tokenizer, 8, 8, seed=12)
    name = sorted(_scorer_replicas())[0]  # the groups spread over both (bounded loads): this one gets some
    victim = ray.get_actor(name, namespace="serve")
    killed = []

    def kill_once_it_holds_a_request():  # its calls wait for their wave (--max-wait-ms 500): one is there
        deadline, held = time.monotonic() + 60, 0
        while time.monotonic() < deadline and not held:
            held = ray.get(victim.get_num_ongoing_requests.remote())
            time.sleep(0 if held else 0.01)
        ray.kill(victim, no_restart=True)
        killed.append((name, held))

    killer = threading.Thread(target=kill_once_it_holds_a_request, daemon=True)
    before = _metrics(url)
    killer.start()
    got = _send(url, data)
    killer.join()
    d = {k: v - before.get(k, 0) for k, v in _metrics(url).items()}
    assert d["rmfast_samples_total"] >= 64  # every sample scored (a retried call's samples count again)
    assert killed and killed[0][1] > 0  # killed while it held requests (waiting for their wave)
    assert len(got) == 64 and got == _send(single, data)  # every request answered once, with the same bits
    # the victim's calls were answered elsewhere: sent again by the ingress (rmfast_retries_total) or re-routed by
    # Ray's own router before they reached it; which of the two varies with the timing (both seen), so not asserted
    name = killed[0][0]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        names = _scorer_replicas()
        st = serve.status().applications["rmfast"].deployments["Scorer"]
        if name not in names and st.replica_states.get("RUNNING", 0) == 2:
            break
        time.sleep(0.5)
    else:
        pytest.fail(f"Ray did not start a new replica in place of {name}")
    assert len(_send(url, data[:8])) == 8


def test_a_replica_that_cannot_load_stops_the_deployment_with_one_line(cluster, tmp_path):
    opts = ServeOptions()
    make = partial(make_core, _args(tmp_path / "nowhere"), opts)
    t0 = time.monotonic()
    with pytest.raises(UserError) as e:
        deploy(build(make, opts, serve_config(opts, name="broken"), replicas=1, actor_options={"num_cpus": 0}),
               name="broken", route_prefix="/broken")
    line = str(e.value)
    assert line.startswith(LOAD_FAILED) and "nowhere" in line and "\n" not in line and "Traceback" not in line, line
    assert time.monotonic() - t0 < 60 and "broken" not in serve.status().applications


def test_without_ray_the_flag_is_one_line(tiny_dir, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    monkeypatch.setitem(sys.modules, "ray.serve", None)
    assert main(["serve", str(tiny_dir), "--ray", "--replicas", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "needs Ray Serve: pip install 'rmfast[serve-ray]'" in err and len(err.splitlines()) == 1
    assert main(["serve", str(tiny_dir), "--replicas", "2"]) == 2  # replicas need Ray: one line too
    err = capsys.readouterr().err.strip()
    assert "--replicas" in err and "--ray" in err and len(err.splitlines()) == 1


def test_a_replicas_load_error_names_the_cli_options():
    """A replica's UserError reached the CLI in the Python caller's words ("load this one with random_head_seed"),
    the same error without --ray in the CLI's ("--random-head-seed"): the replica keeps the message as written,
    and the UserError made of Ray's deploy error names each reader's options."""
    from rmfast.errors import read_by_cli
    from rmfast.serve.ray_app import ScorerReplica, deploy_error_line

    def make_core():
        raise UserError("this model has no score head: load it with --random-head-seed N for a test server")

    with pytest.raises(RuntimeError) as e:
        ScorerReplica(make_core, ServeOptions())
    err = UserError(deploy_error_line(f"Deploying failed\nTraceback ...\nRuntimeError: {e.value}\n"))
    with read_by_cli():
        assert str(err).endswith("load it with --random-head-seed N for a test server"), str(err)
    assert "random_head_seed N" in str(err)  # a Python caller's reading of the same error
