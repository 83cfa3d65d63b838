"""Weight updates by every built-in transport (filesystem, broadcast, ipc) against a raw copy of
the same bytes, tiny and small models and the largest shape the scale benchmark trains
(`qwen3-0.6b`: its real shapes), side by side in one run.

    python tests/benchmarks/bench_weight_update.py [--repeats 5] [--sizes tiny,small,qwen3-0.6b]

Per model size, this process plays the trainer's exporting rank and the orchestrator against
one running vLLM CPU server: two versions (the model's tensors and a perturbed copy, their tensor
tables made beforehand: every transport's trainer computes the same one) are published
alternately through each transport's trainer side (`publish_s`: files written, a broadcast
planned, a shared buffer filled, the record signed and written; a broadcast then starts sending)
and delivered through its orchestrator side (`deliver_s`: the server checks the caller's token,
the path and the signature, pauses, receives, checks the tensor table, reloads in place, bumps
its version, resumes). `update_s` = publish + deliver; the server reports its worker's split
(receive / verify / vLLM's reload), from which the reload share is given. The raw baseline
copies every tensor of the same version into a preallocated tensor of the same shape and dtype
(before the server starts: timed right after an update, with vLLM's processes busy, the copies
took 20-60x longer). The broadcast's trainer side reports its group set-up apart from its
transfer: `broadcast_setup_s_first` (the first update: the group is created),
`broadcast_setup_s_kept` (the median of the later ones: the group is kept) and
`broadcast_transfer_s` (their median bucket transfer, up to every worker's confirmation). Prints
one JSON line: per size and transport the median seconds, the worker's split, and the ratios to
filesystem and to the raw copy.

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
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from rlkit.inference import start_server
from rlkit.inference.admin import AdminClient
from rlkit.models import init_tiny
from rlkit.protocol import handoff
from rlkit.protocol.weights import PublishedVersion, iter_safetensors, tensor_table
from rlkit.weights import TransportSettings, transport_class
from rlkit.weights.transport import TimeoutParams

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.helpers.bench_children import json_line_of  # noqa: E402

TRANSPORTS = ("filesystem", "broadcast", "ipc")
SIZES = "tiny,small,qwen3-0.6b"


def versions(model: Path) -> list[list[tuple[str, torch.Tensor]]]:
    tensors = list(iter_safetensors(model))
    perturbed = [(n, t + 1e-3 * torch.randn_like(t)) for n, t in tensors]
    return [tensors, perturbed]


def raw_copy_s(tensors: list[tuple[str, torch.Tensor]], targets: dict[str, torch.Tensor]) -> float:
    t0 = time.perf_counter()
    for name, tensor in tensors:
        targets[name].copy_(tensor)
    return time.perf_counter() - t0


async def one_update(
    name: str, transport, admin: AdminClient, root: Path, version: int, tensors, table
) -> tuple[float, float, dict]:
    """(publish seconds, deliver seconds, the worker's split) of one version through
    `transport`; its tensor table (the same for every transport) is made beforehand."""
    out = root / f"{name}-{version}"
    out.mkdir()
    t0 = time.perf_counter()
    record = PublishedVersion(version=version, transport=name, tensors=table)
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
        return int(resp.json()["policy_version"])

    admin.update_weights = keep_split  # type: ignore[method-assign]
    try:
        outcomes = await type(transport).deliver([admin], str(out), record)
    finally:
        admin.update_weights = original  # type: ignore[method-assign]
    assert all(o.loaded for o in outcomes), outcomes
    transport.settle()
    return t1 - t0, time.perf_counter() - t1, split


async def measure_server(server, root: Path, pair, repeats: int) -> dict[str, dict]:
    settings = TransportSettings(
        TimeoutParams(timeout_s=300), token=server.token
    )  # the run's, as a trainer
    transports = {name: transport_class(name)(settings, None) for name in TRANSPORTS}
    tables = [tensor_table(tensors) for tensors in pair]
    publish: dict[str, list[float]] = {name: [] for name in TRANSPORTS}
    deliver: dict[str, list[float]] = {name: [] for name in TRANSPORTS}
    splits: dict[str, list[dict]] = {name: [] for name in TRANSPORTS}
    setup: list[float] = []  # the broadcast's group set-up of every update, the first included
    transfer: list[float] = []
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
    out = {}
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
        }
        out[name]["reload_share"] = load / out[name]["update_s"]
    out["broadcast"].update(
        broadcast_setup_s_first=setup[0],
        broadcast_setup_s_kept=statistics.median(setup[1:]),
        broadcast_transfer_s=statistics.median(transfer[1:]),
    )
    return out


def measure(size: str, root: Path, repeats: int) -> dict[str, object]:
    model = init_tiny(root / size, size=size)  # type: ignore[arg-type]
    pair = versions(model)
    targets = {n: torch.empty_like(t) for n, t in pair[0]}
    nbytes = sum(t.numel() * t.element_size() for t in targets.values())
    raw = statistics.median([raw_copy_s(pair[i % 2], targets) for i in range(repeats + 1)][1:])
    work = root / f"{size}-versions"
    work.mkdir()
    server = start_server(str(model), log_path=root / f"{size}.log", weights_roots=[work])
    try:
        server.wait_ready(timeout=900)
        result = asyncio.run(measure_server(server, work, pair, repeats))
    finally:
        server.stop()
    fs = result["filesystem"]["update_s"]
    for r in result.values():
        r["over_filesystem"] = r["update_s"] / fs
        r["over_raw_copy"] = r["update_s"] / raw
    return {"mbytes": round(nbytes / 2**20, 1), "raw_copy_s": raw, **result}


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
    args = parser.parse_args()
    if args.base:
        print(json.dumps(rounded(compare(args.base, args.rounds, args.repeats, args.sizes))))
        return
    out: dict[str, object] = {"bench": "weight_update", "repeats": args.repeats}
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes.split(","):
            out[size] = rounded(measure(size, Path(tmp), args.repeats))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
