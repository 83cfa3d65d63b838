"""Weight updates by every built-in transport (filesystem, broadcast, ipc) against a raw copy of
the same bytes, tiny and small models and the largest shape the scale benchmark trains
(`qwen3-0.6b`: its real shapes), side by side in one run.

    python tests/benchmarks/bench_weight_update.py [--repeats 5] [--sizes tiny,small,qwen3-0.6b]

Per model size, this process plays the trainer's exporting rank and the orchestrator against
one running vLLM CPU server: two versions (the model's tensors and the same with one bit of
each flipped: `Versions`, their tensor tables made beforehand: every transport's trainer computes
the same one) are published
alternately through each transport's trainer side (`publish_s`: files written, a broadcast
planned, a shared buffer filled, the record signed and written; a broadcast then starts sending)
and delivered through its orchestrator side (`deliver_s`: the server checks the caller's token,
the path and the signature, pauses, receives, checks the tensor table, reloads in place, bumps
its version, resumes). `update_s` = publish + deliver; the server reports its worker's split
(receive / verify / vLLM's reload), from which the reload share is given. The raw baseline
copies every tensor of the same version into a preallocated tensor of the same shape and dtype
(with torch's thread count and with one thread: the faster median), before the server starts
(`raw_copy_s`) and in every round after the three updates (`raw_copy_beside_s`: the same
conditions as the updates on a shared machine, whose load moves within a run; the ratios
divide by it; before OpenMP's threads waited passively, copies timed right after an update took
20-60x longer). The broadcast's trainer side reports its group set-up apart from its
transfer: `broadcast_setup_s_first` (the first update: the group is created),
`broadcast_setup_s_kept` (the median of the later ones: the group is kept) and
`broadcast_transfer_s` (their median bucket transfer, up to every worker's confirmation).

Baselines and columns in the same run, per size: `raw_copy_s` (above), `plain_broadcast_s` (the
same bytes as one buffer in one gloo broadcast from this process to a spawned one, nothing else),
`digest_s` / `digest_gb_s` (the tensor table of one version: the digest
`rlkit.protocol.weights.PublishedVersion.build` computes), and with `--e2e` (default on every size;
on a fresh engine, after the transports' versions are let go: at qwen3-1.7b the machine's 24 GiB
then hold it) `e2e_s`: an FSDP2 `Trainer` (one rank, in a process of its own as in `rlkit train`)
holding the model, its `export` through the ipc transport (gather, cast, tensor table, shared
buffer, signed record) and the server's delivery, until the engine serves the version, while the
trainer scores the canary beside it as `rlkit train` does (it runs with `OMP_WAIT_POLICY=PASSIVE`,
as `rlkit train` runs a CPU trainer: with OpenMP's default spinning, the canary's forward took
4.4 s instead of 2.3 s at load 4); and `e2e_alone_s`, the same with the canary scored after the
engine serves the version, as where the trainer has cores (or a device) of its own. The two
alternate version by version, so both see the same machine; on shared cores their difference is
what the canary's scoring costs the delivery.
`ratios` lists what issue 63 asks for: the ipc update less vLLM's reload over the raw copy, end to
end (both) over the ipc update, the worker's check over the raw copy, broadcast over ipc, the
plain broadcast's seconds over the broadcast's transfer (the fraction of a plain broadcast's speed
it reaches), and vLLM's reload share.
`peak_rss_gb` is this process's and its children's (the server's, the end-to-end phase's
trainer) high-water marks, summed; `load`: the 1-minute load average at the start and after each
size. Prints one JSON line (and each size's transport figures on stderr before its end-to-end
phase, which needs the most memory).

    python tests/benchmarks/bench_weight_update.py --repeats 3 --sizes qwen3-0.6b
    python tests/benchmarks/bench_weight_update.py --repeats 2 --sizes qwen3-1.7b

    python tests/benchmarks/bench_weight_update.py --base REF [--rounds 2] [--sizes tiny,small]

Old code against new in one run: this script as it is at REF (extracted with `git archive`, its
own rlkit, server included) and in this checkout, each in a process of its own, interleaved for
`--rounds` rounds. Compared is what every version of the script times: the server's delivery of
a version published as files (`filesystem.deliver_s`; `filesystem_s` in scripts before the
transports, which timed the update call alone). `--sizes` must be ones REF's script knows.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import resource
import socket
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from rlkit.inference import start_server
from rlkit.inference.admin import AdminClient
from rlkit.inference.client import InferenceClient
from rlkit.models import init_tiny
from rlkit.protocol import credentials, handoff
from rlkit.protocol.weights import PublishedVersion, iter_safetensors, raw_bytes
from rlkit.weights import TransportSettings, transport_class
from rlkit.weights.transport import TimeoutParams

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.helpers.bench_children import (  # noqa: E402
    children,
    descendants,
    high_water_kb,
    json_line_of,
)
from tests.helpers.bench_copy import copies_s, plain_copy_s  # noqa: E402

TRANSPORTS = ("filesystem", "broadcast", "ipc")
SIZES = "tiny,small,qwen3-0.6b"  # and qwen3-1.7b (3.4 GB of bf16, 19-20 GB of the machine)
# the server serves only the canary here: half rlkit's 1 GiB KV cache (memory for qwen3-1.7b)
SMALL_KV = ["--max-model-len", "2048", "--kv-cache-memory-bytes", "512M"]


def tabled(tensors: list[tuple[str, torch.Tensor]], token: str | None) -> PublishedVersion:
    """A record of `tensors` with its tensor table as the trainer makes one (a fresh nonce, a
    tag per tensor under the run's digest key); the transports' records copy its nonce and table
    (the same bytes published again under one nonce: the same one-time key for the same
    message, so nothing is given away)."""
    return PublishedVersion.build(0, "filesystem", tensors, credentials.digest_key(token))


def digest_s(tensors: list[tuple[str, torch.Tensor]], token: str, repeats: int) -> float:
    """Median seconds of one version's tensor table (the tag of every tensor)."""
    times = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        tabled(tensors, token)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def _plain_receiver(port: int, nbytes: int, rounds: int) -> None:
    store = dist.TCPStore("127.0.0.1", port, 2, False, timeout=timedelta(seconds=300))
    group = dist.ProcessGroupGloo(dist.PrefixStore("plain/", store), 1, 2, timedelta(seconds=300))
    buffer = torch.empty(nbytes, dtype=torch.uint8)
    for _ in range(rounds):
        group.barrier().wait()
        group.broadcast(buffer, 0).wait()


def plain_broadcast_s(nbytes: int, repeats: int) -> float:
    """Median seconds of one gloo broadcast of `nbytes` (one buffer, one collective) from this
    process to a spawned one: what the wire and gloo give, the baseline of the transport's."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rounds = repeats + 1
    child = mp.get_context("spawn").Process(target=_plain_receiver, args=(port, nbytes, rounds))
    child.start()
    try:
        store = dist.TCPStore("127.0.0.1", port, 2, True, timeout=timedelta(seconds=300))
        prefixed = dist.PrefixStore("plain/", store)
        group = dist.ProcessGroupGloo(prefixed, 0, 2, timedelta(seconds=300))
        buffer = torch.ones(nbytes, dtype=torch.uint8)
        times = []
        for _ in range(rounds):
            group.barrier().wait()
            t0 = time.perf_counter()
            group.broadcast(buffer, 0).wait()
            times.append(time.perf_counter() - t0)
    finally:
        child.join(120)
    return statistics.median(times[1:])


def tree_hwm_gb(pid: int) -> float:
    """The high-water resident memory of `pid` and its descendants, summed (an upper bound of
    their peak together), GiB."""
    return sum(high_water_kb(p) for p in descendants(pid, children())) / 2**20


def peak_rss_gb(server_pid: int | None = None) -> float:
    """This process's high-water resident memory plus the server's tree's, GiB."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return own + (tree_hwm_gb(server_pid) if server_pid else 0.0)


class Versions:
    """Two versions of the model's tensors in one copy of them (at qwen3-1.7b two copies beside
    the engine's took the machine's memory): `versions[k]` is the tensors in version k % 2,
    which differs from the other in the lowest bit of every tensor's first byte, flipped in
    place (so a version's tensors must not be in use when the other is asked for: every update
    settles before the next)."""

    def __init__(self, model: Path) -> None:
        self.tensors = list(iter_safetensors(model))
        self.state = 0

    def __getitem__(self, k: int) -> list[tuple[str, torch.Tensor]]:
        if k % 2 != self.state:
            for _, tensor in self.tensors:
                tensor.reshape(-1).view(torch.uint8)[0] ^= 1
            self.state = k % 2
        return self.tensors

    def __iter__(self):
        return (self[k] for k in range(2))


def versions(model: Path) -> Versions:
    return Versions(model)


def resident(tensors: list[tuple[str, torch.Tensor]]) -> None:
    """Fault in every page of `tensors` (a trainer's gathered tensors are in memory): the bench
    maps them from the model's file, and at qwen3-1.7b the engine's receive copies pushed them
    out of the page cache, so the next publish read them back from disk (1.4-2.1 s for 3.3 GB
    where a copy takes 0.25-0.36)."""
    for _, tensor in tensors:
        raw_bytes(tensor)[::4096].max()


async def one_update(
    name: str, transport, admin: AdminClient, root: Path, version: int, tensors, tabled
) -> tuple[float, float, dict]:
    """(publish seconds, deliver seconds, the worker's split) of one version through
    `transport`; its tensor table (the same for every transport) is made beforehand."""
    out = root / f"{name}-{version}"
    out.mkdir()
    resident(tensors)
    t0 = time.perf_counter()
    record = tabled.model_copy(update={"version": version, "transport": name})
    record = transport.publish(out, record, tensors).signed(admin.token)  # the run's token
    record.write(out)
    handoff.mark_published(out)
    transport.published(out, record, tensors)
    t1 = time.perf_counter()
    split: dict = {}
    original = admin.update_weights

    async def keep_split(*args, **kwargs) -> int:  # the worker's split from the response
        resp = await admin.client.request(
            "POST",
            "/rlkit/update_weights",
            retries=0,
            json={"path": args[0], "version": args[1], "rank": kwargs.get("rank", 0)},
        )
        split.update(resp.json().get("worker_seconds") or {})
        server = resp.json().get("server_seconds") or {}
        split.update({f"server_{phase}": seconds for phase, seconds in server.items()})
        return int(resp.json()["policy_version"])

    admin.update_weights = keep_split  # type: ignore[method-assign]
    try:
        outcomes = await type(transport).deliver([admin], str(out), record)
    finally:
        admin.update_weights = original  # type: ignore[method-assign]
    assert all(o.loaded for o in outcomes), outcomes
    transport.settle()
    return t1 - t0, time.perf_counter() - t1, split


async def measure_server(
    server, root: Path, pair, repeats: int, targets: dict[str, torch.Tensor]
) -> dict[str, dict]:
    settings = TransportSettings(
        TimeoutParams(timeout_s=300), token=server.token
    )  # the run's, as a trainer
    transports = {name: transport_class(name)(settings, None) for name in TRANSPORTS}
    tables = [tabled(tensors, server.token) for tensors in pair]
    publish: dict[str, list[float]] = {name: [] for name in TRANSPORTS}
    deliver: dict[str, list[float]] = {name: [] for name in TRANSPORTS}
    splits: dict[str, list[dict]] = {name: [] for name in TRANSPORTS}
    setup: list[float] = []  # the broadcast's group set-up of every update, the first included
    transfer: list[float] = []
    copies: dict[int, list[float]] = {n: [] for n in {torch.get_num_threads(), 1}}
    async with server.client(timeout=600) as client:
        admin = AdminClient(client)
        version = 0
        for i in range(repeats + 1):  # the first round warms caches
            for name, transport in transports.items():  # interleaved: same conditions
                version += 1
                p, d, split = await one_update(
                    name, transport, admin, root, version, pair[version % 2], tables[version % 2]
                )
                if name == "broadcast":
                    setup.append(transport.sender.setup_s)
                    transfer.append(transport.sender.transfer_s)
                if i:
                    publish[name].append(p)
                    deliver[name].append(d)
                    splits[name].append(split)
            # the raw copy beside them, each round: the same conditions
            for n, seconds in copies_s(pair[version % 2], targets).items():
                if i:
                    copies[n] += seconds
    for transport in transports.values():  # nothing of theirs held through the e2e phase
        transport.settle()
        spare = getattr(transport, "spare", None)
        if spare is not None:  # ipc's settled buffer (1.1 GiB at qwen3-0.6b)
            spare.close()
            transport.spare = None
    out: dict = {"raw_copy_beside_s": min(statistics.median(ts) for ts in copies.values())}
    for name in TRANSPORTS:
        load = statistics.median(s["load"] for s in splits[name])
        out[name] = {
            "update_s": statistics.median(
                p + d for p, d in zip(publish[name], deliver[name], strict=True)
            ),
            "publish_s": statistics.median(publish[name]),
            "deliver_s": statistics.median(deliver[name]),
            "worker_receive_s": statistics.median(s["receive"] for s in splits[name]),
            "worker_verify_s": statistics.median(s["verify"] for s in splits[name]),
            "worker_reload_s": load,
            # each update's own time less its own reload (the medians above come from
            # different rounds: their difference swung 2.8-3.9x the copy between runs)
            "update_less_reload_s": statistics.median(
                p + d - split["load"]
                for p, d, split in zip(publish[name], deliver[name], splits[name], strict=True)
            ),
            **{  # the server's phases: record checks, pause, workers (the three above), resume
                f"{phase}_s": statistics.median(s[phase] for s in splits[name])
                for phase in splits[name][0]
                if phase.startswith("server_")
            },
        }
        out[name]["reload_share"] = load / out[name]["update_s"]
    out["broadcast"].update(
        broadcast_setup_s_first=setup[0],
        broadcast_setup_s_kept=statistics.median(setup[1:]),
        broadcast_transfer_s=statistics.median(transfer[1:]),
    )
    return out


def e2e_in_a_process_of_its_own(
    url: str, token: str, work: Path, model: Path, repeats: int
) -> dict[str, float]:
    """`measure_e2e` in a spawned process, as `rlkit train`'s trainer is one: not in this one,
    which has held the baselines' and the transports' tensors."""
    with mp.get_context("spawn").Pool(1) as pool:
        return pool.apply(e2e_child, (url, token, work, model, repeats))


def e2e_child(url: str, token: str, work: Path, model: Path, repeats: int) -> dict[str, float]:
    """`measure_e2e`'s figures and this trainer process's high-water memory."""
    out = asyncio.run(measure_e2e(url, token, work, model, repeats))
    out["e2e_trainer_peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return out


async def measure_e2e(
    url: str, token: str, work: Path, model: Path, repeats: int
) -> dict[str, float]:
    """Median seconds from an FSDP2 trainer's sharded state to the engine serving the version:
    `Trainer.export` through the ipc transport (`e2e_export_s`), then the server's delivery,
    while the trainer scores the version's canary as `rlkit train` does (`e2e_s`;
    `Trainer.publish_canary` on a thread; `e2e_canary_s`: from the export's end to the canary
    written) or after the delivery (`e2e_alone_s`), alternating."""
    from rlkit.protocol.model import ModelConfig
    from rlkit.trainer.config import TrainerConfig
    from rlkit.trainer.trainer import Trainer

    cfg = TrainerConfig(run_dir=str(work / "trainer"), model=ModelConfig(path=str(model)))
    trainer = Trainer(cfg, total_steps=1)
    settings = TransportSettings(TimeoutParams(timeout_s=300), token=token)
    transport = transport_class("ipc")(settings, trainer.model_files())
    names = ("e2e_s", "e2e_export_s", "e2e_canary_s", "e2e_alone_s")
    times: dict[str, list[float]] = {name: [] for name in names}
    try:
        async with InferenceClient(url, api_key=token, timeout=600) as client:
            admin = AdminClient(client)
            for i in range(repeats + 1):
                for beside in (True, False):
                    version = 10_000 + 2 * i + (not beside)
                    out = work / f"e2e-{version}"
                    t0 = time.perf_counter()
                    trainer.export(out, version=version, transport=transport)
                    t1 = time.perf_counter()
                    if beside:
                        canary = asyncio.create_task(asyncio.to_thread(trainer.publish_canary, out))
                    record = PublishedVersion.read(out)
                    assert record is not None
                    outcomes = await type(transport).deliver([admin], str(out), record)
                    t2 = time.perf_counter()
                    assert all(o.loaded for o in outcomes), outcomes
                    if beside:
                        await canary
                    else:
                        trainer.publish_canary(out)
                    t3 = time.perf_counter()
                    transport.settle()
                    if i == 0:  # the first of each: the trainer's and the engine's warm-up
                        continue
                    if beside:
                        times["e2e_s"].append(t2 - t0)
                        times["e2e_export_s"].append(t1 - t0)
                        times["e2e_canary_s"].append(t3 - t1)
                    else:
                        times["e2e_alone_s"].append(t2 - t0)
    finally:
        trainer.close()
    return {name: statistics.median(ts) for name, ts in times.items()}


def ratios(result: dict) -> dict[str, float]:
    """What issue 63 asks of each size (the targets in the comments)."""
    ipc, bc, raw = result["ipc"], result["broadcast"], result["raw_copy_beside_s"]
    out = {
        "ipc_less_reload_over_copy": ipc["update_less_reload_s"] / raw,  # <= 3
        "check_over_copy": ipc["worker_verify_s"] / raw,  # <= 1.5
        "broadcast_over_ipc": bc["update_s"] / ipc["update_s"],  # <= 2
        "broadcast_transfer_vs_plain": result["plain_broadcast_s"] / bc["broadcast_transfer_s"],
        **{f"reload_share_{t}": result[t]["reload_share"] for t in TRANSPORTS},
    }  # broadcast_transfer_vs_plain: >= 0.5
    if "e2e_s" in result:
        out["e2e_over_ipc"] = result["e2e_s"] / ipc["update_s"]  # <= 2
        out["e2e_alone_over_ipc"] = result["e2e_alone_s"] / ipc["update_s"]
    return out


def measure(size: str, root: Path, repeats: int, e2e: bool) -> dict[str, object]:
    root.mkdir(parents=True)
    token_file = root / "run.token"  # the run's credential: the server's and the trainer's
    credentials.ensure_token_file(token_file)
    os.environ[credentials.TOKEN_FILE_ENV] = str(token_file)
    model = init_tiny(root / size, size=size)  # type: ignore[arg-type]
    pair = versions(model)
    targets = {n: torch.empty_like(t) for n, t in pair[0]}
    nbytes = sum(t.numel() * t.element_size() for t in targets.values())
    raw = plain_copy_s(pair[0], targets, repeats)
    plain = plain_broadcast_s(nbytes, repeats)
    digest = digest_s(pair[0], credentials.read_token(token_file), repeats)
    work = root / f"{size}-versions"
    work.mkdir()

    def serve(log: str):
        server = start_server(
            str(model), log_path=root / log, weights_roots=[work], extra_args=SMALL_KV
        )
        server.wait_ready(timeout=900)
        return server

    server = serve(f"{size}.log")
    try:
        result = asyncio.run(measure_server(server, work, pair, repeats, targets))
        del targets
        if e2e:
            del pair
            # on stderr first: what was measured survives an end-to-end phase that dies (the
            # engine killed for memory on a shared machine)
            print(json.dumps({size: rounded(result)}), file=sys.stderr, flush=True)
            # a fresh engine: after the files' and the broadcast's received copies the first one
            # keeps ~3.5 GB more at qwen3-1.7b (freed, not given back), which the trainer needs
            server.stop()
            server = serve(f"{size}-e2e.log")
            result.update(
                e2e_in_a_process_of_its_own(server.url, server.token, work, model, repeats)
            )
        peak = peak_rss_gb(server.pid) + result.get("e2e_trainer_peak_rss_gb", 0.0)
    finally:
        server.stop()
    fs = result["filesystem"]["update_s"]
    for r in result.values():
        if isinstance(r, dict):
            r["over_filesystem"] = r["update_s"] / fs
            r["over_raw_copy"] = r["update_s"] / result["raw_copy_beside_s"]
    out = {
        "mbytes": round(nbytes / 2**20, 1),
        "raw_copy_s": raw,
        "plain_broadcast_s": plain,
        "digest_s": digest,
        "digest_gb_s": nbytes / digest / 1e9,
        **result,
        "peak_rss_gb": peak,
    }
    out["ratios"] = ratios(out)
    return out


def rounded(value: object) -> object:
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [rounded(v) for v in value]
    return round(value, 4) if isinstance(value, float) else value


def run_tree(tree: Path, repeats: int, sizes: str) -> dict:
    """This benchmark's JSON line from the script and code of `tree`, in a process of its own."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(tree / "cli")])}
    script = tree / "tests" / "benchmarks" / "bench_weight_update.py"
    args = ["--repeats", str(repeats), "--sizes", sizes]
    return json_line_of([sys.executable, str(script), *args], tree, env)


def files_deliver_s(size_result: dict) -> float:
    """The server's delivery of a files version, in any version of this script's output."""
    if "filesystem" in size_result:
        return size_result["filesystem"]["deliver_s"]
    return size_result["filesystem_s"]


def compare(base_ref: str, rounds: int, repeats: int, sizes: str) -> dict[str, object]:
    """Old (`base_ref`) and new (this checkout) runs, interleaved; new over old per size."""
    from tests.helpers.git_tree import extract

    seconds: dict[str, dict[str, list[float]]] = {
        size: {"base": [], "new": []} for size in sizes.split(",")
    }
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"base": extract(base_ref, Path(tmp) / "base"), "new": ROOT}
        for _ in range(rounds):
            for name, tree in trees.items():
                result = run_tree(tree, repeats, sizes)
                for size, per_variant in seconds.items():
                    per_variant[name].append(files_deliver_s(result[size]))
    return {
        "bench": "weight_update_base_vs_new",
        "base": base_ref,
        "repeats": repeats,
        "files_deliver_s": seconds,
        "new_over_base": {
            size: statistics.median(v["new"]) / statistics.median(v["base"])
            for size, v in seconds.items()
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sizes", default=SIZES)
    parser.add_argument("--base", default="", help="git ref whose code runs beside this one")
    parser.add_argument("--rounds", type=int, default=2, help="with --base: old/new rounds")
    parser.add_argument(
        "--e2e",
        default="",
        help="sizes with the end-to-end column (default: every size)",
    )
    args = parser.parse_args()
    if "OMP_WAIT_POLICY" not in os.environ and not torch.cuda.is_available():
        # the end-to-end column's trainer runs here: with OpenMP's threads waiting passively,
        # as `rlkit train` starts a CPU trainer (`rlkit.launch.launcher.trainer_env`); read by
        # OpenMP when it starts, so this process starts again with it
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
        os.execv(sys.executable, [sys.executable, *sys.argv])
    if args.base:
        print(json.dumps(rounded(compare(args.base, args.rounds, args.repeats, args.sizes))))
        return
    sizes = args.sizes.split(",")
    e2e = args.e2e.split(",") if args.e2e else sizes
    out: dict[str, object] = {"bench": "weight_update", "repeats": args.repeats, "load": []}
    out["load"].append(os.getloadavg()[0])  # type: ignore[union-attr]
    with tempfile.TemporaryDirectory() as tmp:
        for size in sizes:
            out[size] = rounded(measure(size, Path(tmp) / size, args.repeats, size in e2e))
            out["load"].append(os.getloadavg()[0])  # type: ignore[union-attr]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
