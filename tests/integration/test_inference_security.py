"""The real vLLM CPU server, attacked as another user of the host would: without the token, with
a wrong one, as another run (tenant) of a shared server, with paths outside its weight roots.
Each attack is refused (401/403/404) and changes nothing: the served version, the engine's
logprobs, the adapters, the files on disk. The run's own credential still works."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from rlkit.inference import InferenceClient, InferenceError, ServerProcess, start_server
from rlkit.inference.admin import AdminClient
from rlkit.inference.engine_args import lora_server_args
from rlkit.inference.tenancy import request_tag
from rlkit.models import init_tiny
from rlkit.protocol.credentials import write_token_file
from tests.helpers.adapters import make_adapter
from tests.helpers.cli import TEST_SERVER_ARGS, run_cli

pytestmark = pytest.mark.slow
PROMPT_IDS = [5, 6, 7, 8, 9, 10, 11, 12]
GREEDY = {"max_tokens": 8, "temperature": 0.0}
# what VLLM_SERVER_DEV_MODE would add: any worker method by name, pause, sleep, the config
DEV_ROUTES = [
    ("POST", "/collective_rpc"),
    ("POST", "/pause"),
    ("POST", "/resume"),
    ("GET", "/is_paused"),
    ("POST", "/sleep"),
    ("GET", "/server_info"),
    ("POST", "/reset_prefix_cache"),
]


@dataclass
class Secured:
    server: ServerProcess
    model: str
    weights: Path  # the only root the server loads from
    outside: Path  # a complete, compatible checkpoint outside it (an attacker's copy)
    adapter: Path
    alice: str  # tenants' tokens
    bob: str
    alice_file: Path


@pytest.fixture(scope="module")
def secured(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    """A LoRA server with an owner, two tenants and one weight root, started with the dev-mode
    and runtime-LoRA variables set as a user's shell might have them."""
    root = tmp_path_factory.mktemp("secured")
    weights, tenants = root / "weights", root / "tenants"
    adapter = make_adapter(tiny_model_dir, weights / "adapter")
    outside = init_tiny(root / "attacker", seed=7)
    alice = write_token_file(tenants / "alice.token")
    bob = write_token_file(tenants / "bob.token")
    env = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    args = [*lora_server_args(8, max_loras=2), "--enforce-eager", *TEST_SERVER_ARGS]
    server = start_server(
        str(tiny_model_dir),
        log_path=root / "vllm.log",
        extra_args=args,
        env=env,
        weights_roots=[weights],
        tenants_dir=tenants,
    )
    try:
        server.wait_ready(timeout=600)
        yield Secured(
            server, str(tiny_model_dir), weights, outside, adapter, alice, bob,
            tenants / "alice.token",
        )  # fmt: skip
    finally:
        server.stop()


def snapshot(*folders: Path) -> dict[str, float]:
    return {
        str(p): p.stat().st_mtime_ns for folder in folders for p in [folder, *folder.rglob("*")]
    }


async def served(client: InferenceClient, model: str) -> tuple[int, list[int], list[float]]:
    gen = await client.completion(PROMPT_IDS, model=model, sampling=GREEDY)
    version = int((await AdminClient(client).status())["policy_version"])
    return version, gen.completion_token_ids, gen.completion_logprobs


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_no_or_wrong_credential_changes_nothing(secured: Secured) -> None:
    url, server = secured.server.url, secured.server
    files = snapshot(secured.weights, secured.outside)
    async with server.client(max_retries=0) as owner:
        before = await served(owner, secured.model)
        attacks = [
            ("/rlkit/update_weights", {"path": str(secured.outside)}),
            ("/rlkit/update_weights", {"path": str(secured.weights / "adapter")}),
            ("/rlkit/update_weights", {"path": str(secured.outside), "rank": 1}),
            ("/rlkit/load_adapter", {"name": "x", "path": str(secured.adapter), "version": 1}),
            ("/rlkit/unload_adapter", {"name": "x"}),
            ("/rlkit/pause", None),
        ]
        with httpx.Client(base_url=url, timeout=30) as http:
            for path, body in attacks:
                for headers, status in (({}, 401), (bearer("x" * 43), 403)):
                    headers = {**headers, "X-Policy-Version": "999999"}
                    resp = http.post(path, json=body, headers=headers)
                    assert resp.status_code == status, (path, resp.text)
                    assert "x-adapter-versions" not in resp.headers
            # the OpenAI routes too, and every other route but liveness
            for method, path in [("GET", "/v1/models"), ("POST", "/v1/completions"),
                                 ("GET", "/rlkit/status"), ("GET", "/metrics"),
                                 ("GET", "/openapi.json"), ("GET", "/version")]:  # fmt: skip
                body = {"model": secured.model, "prompt": "hi", "max_tokens": 2}
                resp = http.request(method, path, json=body if method == "POST" else None)
                assert resp.status_code == 401, (path, resp.text)
                assert secured.model not in resp.text
            assert http.get("/health").status_code == 200
        assert await served(owner, secured.model) == before
        assert not (await AdminClient(owner).status())["paused"]
    assert snapshot(secured.weights, secured.outside) == files


async def test_no_development_routes_even_for_the_owner(secured: Secured) -> None:
    with httpx.Client(base_url=secured.server.url, timeout=30) as http:
        for method, path in DEV_ROUTES:
            assert http.request(method, path).status_code == 401, path
            owner = http.request(method, path, headers=secured.server.headers)
            assert owner.status_code in (404, 405), (path, owner.status_code, owner.text)
        # vLLM's runtime LoRA routes (any name, any path, no owner check): closed to everyone
        body = {"lora_name": "x", "lora_path": str(secured.adapter)}
        for path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
            assert http.post(path, json=body, headers=secured.server.headers).status_code == 404
    async with secured.server.client() as owner:
        assert "x" not in (await AdminClient(owner).status())["adapters"]


async def test_paths_outside_the_weight_roots_are_refused_alike(secured: Secured) -> None:
    outside = secured.outside
    escapes = [
        outside,  # exists, compatible
        outside.parent / "does-not-exist",
        secured.weights / ".." / outside.name,  # `..`
        secured.weights / "link",  # a symlink out of the root
        "/etc",
    ]
    (secured.weights / "link").symlink_to(outside)
    async with secured.server.client(max_retries=0) as owner:
        before = await served(owner, secured.model)
        answers = set()
        with httpx.Client(base_url=secured.server.url, timeout=30) as http:
            for path in escapes:
                for route, body in (
                    ("/rlkit/update_weights", {"path": str(path), "version": 999999}),
                    ("/rlkit/update_weights", {"path": str(path), "rank": 1}),
                    ("/rlkit/load_adapter", {"name": "evil", "path": str(path), "version": 9}),
                ):
                    resp = http.post(route, json=body, headers=secured.server.headers)
                    answers.add((resp.status_code, resp.text))
        (secured.weights / "link").unlink()
        assert len(answers) == 1, answers  # one answer: whether a path exists is not told
        status, text = answers.pop()
        assert status == 403 and "not inside" in text and str(outside) not in text
        assert await served(owner, secured.model) == before
        assert "evil" not in (await AdminClient(owner).status())["adapters"]


async def test_runs_sharing_a_server_touch_only_their_own_adapters(secured: Secured) -> None:
    url = secured.server.url
    async with (
        InferenceClient(url, api_key=secured.alice, adapter="run-a", max_retries=0) as a,
        InferenceClient(url, api_key=secured.bob, adapter="run-b", max_retries=0) as b,
        InferenceClient(url, api_key=secured.bob, adapter="run-a", max_retries=0) as b_as_a,
        secured.server.client() as owner,
    ):
        assert await AdminClient(a).load_adapter(str(secured.adapter), 3) == 3
        assert await AdminClient(b).load_adapter(str(secured.adapter), 5) == 5
        before = await a.completion(PROMPT_IDS, "run-a", GREEDY)
        with pytest.raises(InferenceError) as replaced:
            await AdminClient(b_as_a).load_adapter(str(secured.adapter), 99)
        assert replaced.value.status == 404
        with pytest.raises(InferenceError) as unloaded:
            await AdminClient(b_as_a).unload_adapter()
        assert unloaded.value.status == 404  # as for an adapter that does not exist
        with httpx.Client(base_url=url, timeout=60, headers=bearer(secured.bob)) as http:
            load = {"name": "run-a", "path": str(secured.adapter), "version": 9}
            held = [
                http.post("/rlkit/load_adapter", json=load),
                http.post("/rlkit/unload_adapter", json={"name": "run-a"}),
            ]
            nobody = http.post("/rlkit/unload_adapter", json={"name": "nobody"})
            assert nobody.status_code == 404
            for resp in held:  # the same answer as for a name nobody holds: no name is told
                assert resp.status_code == 404
                assert resp.text == nobody.text.replace("nobody", "run-a")
        for tenant in (a, b):  # full weights and the engine are the owner's
            with pytest.raises(InferenceError) as update:
                await AdminClient(tenant).update_weights(str(secured.weights / "adapter"))
            assert update.value.status == 403
            with pytest.raises(InferenceError) as pause:
                await AdminClient(tenant).pause()
            assert pause.value.status == 403

        assert (await AdminClient(a).status())["adapters"] == {"run-a": 3}  # each sees its own only
        assert (await AdminClient(b).status())["adapters"] == {"run-b": 5}
        assert (await AdminClient(owner).status())["adapters"] == {"run-a": 3, "run-b": 5}
        after = await a.completion(PROMPT_IDS, "run-a", GREEDY)
        assert after.completion_token_ids == before.completion_token_ids
        assert after.completion_logprobs == before.completion_logprobs
        with httpx.Client(base_url=url, timeout=30) as http:
            listed = http.get("/v1/models", headers=bearer(secured.bob)).json()["data"]
            assert [c["id"] for c in listed] == [secured.model, "run-b"]
            assert str(secured.adapter) not in str(listed)  # a tenant sees no adapter's path
            resp = http.post(
                "/v1/completions",
                json={"model": secured.model, "prompt": "hi", "max_tokens": 2},
                headers=bearer(secured.bob),
            )
            assert resp.status_code == 200
            assert resp.headers["x-adapter-versions"] == '{"run-b":5}'
            generate_with_own_adapters_only(http, secured)
            for tenant_token in (secured.alice, secured.bob):
                metrics = http.get("/metrics", headers=bearer(tenant_token))
                assert metrics.status_code == 403 and "run-a" not in metrics.text
            owners = http.get("/metrics", headers=secured.server.headers)
            assert owners.status_code == 200 and "vllm:" in owners.text
        assert (await a.completion(PROMPT_IDS, "run-a", GREEDY)).completion_token_ids
        await AdminClient(b).unload_adapter()
        await AdminClient(a).unload_adapter()
        assert (await AdminClient(owner).status())["adapters"] == {}


def generate_with_own_adapters_only(http: httpx.Client, secured: Secured) -> None:
    """Bob generates with the base model and his adapter, not with alice's (whose name gets
    vLLM's own answer for a model that does not exist); the owner with any. Each of bob's
    responses is named with his tag, so routing captured for it is his alone."""
    routes = {
        "/v1/completions": {"prompt": "hi", "max_tokens": 2},
        "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    }
    for path, body in routes.items():
        bob, owner = bearer(secured.bob), secured.server.headers
        unknown = http.post(path, json={**body, "model": "no-such-model"}, headers=bob)
        assert unknown.status_code == 404, unknown.text
        refused = http.post(path, json={**body, "model": "run-a"}, headers=bob)
        assert refused.status_code == 404
        assert refused.json() == json.loads(unknown.text.replace("no-such-model", "run-a"))
        for model in (secured.model, "run-b"):
            resp = http.post(path, json={**body, "model": model}, headers=bob)
            assert resp.status_code == 200, resp.text
            assert resp.json()["id"].split("-", 1)[1].startswith(request_tag("bob"))
        for model in ("run-a", "run-b"):
            assert http.post(path, json={**body, "model": model}, headers=owner).is_success
    # any other route that takes a model: the same refusal
    tokenize = http.post("/tokenize", json={"model": "run-a", "prompt": "hi"},
                         headers=bearer(secured.bob))  # fmt: skip
    assert tokenize.status_code == 404 and "does not exist" in tokenize.text


async def test_the_owner_pauses_and_resumes_through_rlkit(secured: Secured) -> None:
    async with secured.server.client() as owner:
        await AdminClient(owner).pause(mode="keep")
        assert (await AdminClient(owner).status())["paused"]
        await AdminClient(owner).resume()
        assert not (await AdminClient(owner).status())["paused"]


def test_rlkit_eval_sends_the_token_file(
    secured: Secured, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    base = ["eval", "reverse-text", "-m", secured.model, "-b", f"{secured.server.url}/v1"]
    base += ["-n", "2", "-r", "1", "-t", "8", "-o", str(tmp_path)]
    code, out = run_cli(monkeypatch, capsys, *base)
    assert code == 2 and "HTTP 401" in out and "--token-file" in out
    code, out = run_cli(monkeypatch, capsys, *base, "--token-file", str(secured.server.token_file))
    assert code in (0, None), out
    assert os.listdir(tmp_path)
    # a tenant's file works too (the OpenAI routes take any of the server's tokens)
    code, out = run_cli(monkeypatch, capsys, *base, "--token-file", str(secured.alice_file))
    assert code in (0, None), out
