"""The logprob canary: after each weight update, does the engine compute what the trainer does?

The tensor table (`rlkit.protocol.weights`) proves each worker received the published bytes;
it cannot see a mistake in how they were loaded (a tensor under another layer's name, a stale
repacked copy). The canary checks the result: the trainer scores a fixed short token sequence
with the weights it publishes and writes the logprobs beside the version's record, signed and
bound to it (`rlkit.protocol.weights.Canary`, while the servers load the version); after the
update every server scores the same tokens (`prompt_logprobs` through the completions API) and
`canary_kl` compares the two: the median over the tokens of the k3 estimate exp(d) - 1 - d, with
d the trainer's minus the engine's logprob. The median, not the mean: a wrong update moves most
tokens' logprobs, while the engine's bf16 arithmetic against the trainer's fp32 can move one
token's by several nats (a policy with a large activation at an early position), which alone
put the mean above the limit on right weights (docs/benchmarks.md, `bench_canary.py`).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from rlkit.errors import RunStopped
from rlkit.inference.client import InferenceClient, InferenceError
from rlkit.inference.pool import ClientPool
from rlkit.protocol.weights import Canary, PublishedVersion

CANARY_TEXT = (
    "The canary checks that the engine serves the weights the trainer just published: "
    "12 + 30 = 42, reversed 'hello' is 'olleh'."
)


class CanaryMismatch(RunStopped):
    """The engine's logprobs of the canary differ from the trainer's beyond the limit: the
    run stops (after a resumable checkpoint of the last good step)."""


def canary_token_ids(tokenizer: Any) -> list[int]:
    """The canary's token ids under the policy's tokenizer (no special tokens)."""
    return list(tokenizer(CANARY_TEXT, add_special_tokens=False).input_ids)


def canary_kl(trainer: list[float], engine: list[float]) -> float:
    """Median per-token k3 KL estimate between the trainer's and the engine's logprobs of the
    same tokens (module doc: why the median)."""
    if len(trainer) != len(engine) or not trainer:
        raise ValueError(f"canary: {len(trainer)} trainer vs {len(engine)} engine logprobs")
    return statistics.median(
        math.expm1(t - e) - (t - e) for t, e in zip(trainer, engine, strict=True)
    )


async def engine_logprobs(client: InferenceClient, model: str, token_ids: list[int]) -> list[float]:
    """The server's logprob of each canary token after the first (temperature 1, raw logits)."""
    body = {
        "model": model,
        "prompt": token_ids,
        "max_tokens": 1,
        "temperature": 1.0,
        "prompt_logprobs": 0,
    }
    resp = await client.request("POST", "/v1/completions", json=body)
    positions = resp.json()["choices"][0].get("prompt_logprobs") or []
    out = []
    for token, entry in zip(token_ids[1:], positions[1:], strict=True):
        if not entry or str(token) not in entry:
            raise InferenceError(f"{client.base_url}: no prompt logprob for canary token {token}")
        out.append(float(entry[str(token)]["logprob"]))
    return out


async def pool_canary_kl(
    pool: ClientPool, model: str, directory: str | Path, max_kl: float, token: str | None
) -> float | None:
    """The largest canary KL over the pool's healthy servers after loading `directory`;
    CanaryMismatch naming the first server above `max_kl`, or when the canary is not the
    trainer's for this publication (signed with the run's `token`, bound to the record). A
    server that fails to answer is dropped from the pool (as a failed update would be). None
    when `directory` has no record (an adapter) or no server answered."""
    record = PublishedVersion.read(directory)
    if record is None:
        return None
    canary = Canary.read(directory)
    if canary is None or token is None or not canary.signed_by(token):
        raise CanaryMismatch(f"{directory}: no canary signed with the run's token")
    if not canary.belongs_to(record):
        raise CanaryMismatch(
            f"{directory}: the canary scores version {canary.version} (nonce {canary.nonce}), "
            f"not the one published there (version {record.version}, nonce {record.nonce})"
        )
    kls = []
    for i, client in enumerate(pool.clients):
        if not pool.healthy[i]:
            continue
        try:
            engine = await engine_logprobs(client, model, canary.token_ids)
        except InferenceError as exc:
            pool.mark_down(i, f"canary request failed: {exc}")
            continue
        kls.append(kl := canary_kl(canary.logprobs, engine))
        if kl > max_kl:
            raise CanaryMismatch(
                f"weight update check failed: server {client.base_url} scores the canary with "
                f"KL {kl:.3g} from the trainer's logprobs (inference.canary_max_kl = {max_kl}); "
                f"it does not serve the weights the trainer published in {directory}"
            )
    return max(kls, default=None)
