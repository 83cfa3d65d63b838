"""Weight updates by filesystem and by broadcast against a raw copy of the same bytes, tiny and
small models, side by side.

    python tests/benchmarks/bench_weight_update.py [--repeats 5] [--sizes tiny,small]

Per model size: two weight directories (the model and a perturbed copy, with their fingerprints,
as the trainer exports them) are loaded alternately into one running vLLM CPU server, by
``filesystem`` (`/rlkit/update_weights`: validation, pause, read + verify + in-place reload on
the worker, version bump, resume) and by ``broadcast`` (this process plays the trainer: a
`Sender` thread sends the same tensors over gloo while `/rlkit/receive_weights` joins, receives,
verifies and reloads). The broadcast's transfer share is the sender's time (group set-up, every
bucket, the peers' confirmation); the rest of the update is pause, verification and vLLM's
reload. The raw baseline reads the same safetensors files and copies every tensor into a
preallocated tensor of the same shape and dtype. All reads come from the page cache.
The raw copies run before the server starts: timed right after an update, with vLLM's processes
still busy, they took 12 ms (tiny) and 459 ms (small) instead of 0.6 and 7 ms, which made the
update look cheaper than a copy. Prints one JSON line with the median seconds of each and the
ratios broadcast / filesystem, filesystem / raw and broadcast / raw, and the broadcast's
transfer share.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx
import torch
from safetensors.torch import load_file, save_file

from rlkit.inference import start_server
from rlkit.inference.broadcast import Sender, announce_peers, write_manifest
from rlkit.inference.fingerprint import FINGERPRINT_FILE, write_fingerprint
from rlkit.inference.weights import iter_safetensors
from rlkit.models import init_tiny

BUCKET_BYTES = 1024 * 2**20


def perturbed_copy(model: Path, out: Path) -> Path:
    shutil.copytree(model, out)
    for file in out.glob("*.safetensors"):
        tensors = load_file(file)
        save_file({k: v + 1e-3 * torch.randn_like(v) for k, v in tensors.items()}, file)
    return out


def raw_copy_s(directory: Path, targets: dict[str, torch.Tensor]) -> float:
    t0 = time.perf_counter()
    for file in sorted(directory.glob("*.safetensors")):
        for name, tensor in load_file(file).items():
            targets[name].copy_(tensor)
    return time.perf_counter() - t0


def broadcast_update(
    client: httpx.Client, sender: Sender, directory: Path, version: int
) -> tuple[float, float]:
    """(whole update s, sender's transfer s) of `directory`'s tensors sent as `version`."""
    tensors = list(iter_safetensors(directory))
    manifest = sender.manifest(version, tensors, BUCKET_BYTES)
    published = directory.with_name(directory.name + "-manifest")
    published.mkdir(exist_ok=True)
    shutil.copy(directory / FINGERPRINT_FILE, published / FINGERPRINT_FILE)
    write_manifest(published, manifest)
    announce_peers(manifest, [f"{client.base_url} worker 0"])
    sent: list[float] = []

    def send() -> None:
        t = time.perf_counter()
        sender.send(manifest, tensors)
        sent.append(time.perf_counter() - t)

    thread = threading.Thread(target=send)
    t0 = time.perf_counter()
    thread.start()
    body = {"path": str(published), "rank": 1, "version": version}
    client.post("/rlkit/receive_weights", json=body).raise_for_status()
    total = time.perf_counter() - t0
    thread.join()
    return total, sent[0]


def measure(size: str, root: Path, repeats: int) -> dict[str, float]:
    model = init_tiny(root / size, size=size)  # type: ignore[arg-type]
    dirs = [model, perturbed_copy(model, root / f"{size}-b")]
    for directory in dirs:
        write_fingerprint(directory, iter_safetensors(directory))
    targets = {
        k: torch.empty_like(v) for f in model.glob("*.safetensors") for k, v in load_file(f).items()
    }
    nbytes = sum(t.numel() * t.element_size() for t in targets.values())
    # the first round of each warms caches
    raw = [raw_copy_s(dirs[(i + 1) % 2], targets) for i in range(repeats + 1)][1:]
    server = start_server(str(model), log_path=root / f"{size}.log", weights_roots=[root])
    update, bcast, transfer = [], [], []
    try:
        server.wait_ready(timeout=900)
        sender = Sender("127.0.0.1", timeout_s=300)
        with httpx.Client(base_url=server.url, headers=server.headers, timeout=600) as client:
            for i in range(repeats + 1):  # the two transports alternate, same directories
                t0 = time.perf_counter()
                r = client.post("/rlkit/update_weights", json={"path": str(dirs[(i + 1) % 2])})
                r.raise_for_status()
                fs_s = time.perf_counter() - t0
                total, sent = broadcast_update(client, sender, dirs[i % 2], 1000 + i)
                if i:
                    update.append(fs_s)
                    bcast.append(total)
                    transfer.append(sent)
    finally:
        server.stop()
    u, b, c = statistics.median(update), statistics.median(bcast), statistics.median(raw)
    t = statistics.median(transfer)
    return {
        "mbytes": round(nbytes / 2**20, 1),
        "filesystem_s": u,
        "broadcast_s": b,
        "broadcast_transfer_s": t,
        "broadcast_reload_s": b - t,
        "raw_copy_s": c,
        "broadcast_over_filesystem": b / u,
        "filesystem_over_raw": u / c,
        "broadcast_over_raw": b / c,
        "broadcast_transfer_share": t / b,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sizes", default="tiny,small")
    args = parser.parse_args()
    out: dict[str, object] = {"bench": "weight_update", "repeats": args.repeats}
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes.split(","):
            r = measure(size, Path(tmp), args.repeats)
            out[size] = {k: round(v, 4) for k, v in r.items()}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
