from pathlib import Path
from typing import Any
import json
from rlkit.envs import MultiTurnEnv, load_environment
from rlkit.inference import InferenceClient


class Echo(MultiTurnEnv):
    async def env_response(self, messages, state):
        return [{"role": "user", "content": "again"}]


async def test_probe(vllm_server: Any, tiny_model_dir: Path) -> None:
    base = load_environment("reverse-text", num_train_examples=8, num_eval_examples=1)
    env = Echo(dataset=base.get_dataset(), rubric=base.rubric, max_turns=3)
    stats = {"pairs": 0, "prefix_ok": 0, "stop": 0, "length": 0}
    async with InferenceClient(vllm_server.url) as client:
        for i in range(8):
            r = await env.rollout(env.get_dataset()[i], client, str(tiny_model_dir), {"max_tokens": 24, "temperature": 1.0})
            assert r.error is None, r.error
            for t in r.turns:
                stats[t.finish_reason] = stats.get(t.finish_reason, 0) + 1
            for a, b in zip(r.turns, r.turns[1:]):
                stats["pairs"] += 1
                prev = a.prompt_token_ids + a.completion_token_ids
                stats["prefix_ok"] += b.prompt_token_ids[: len(prev)] == prev
                if b.prompt_token_ids[: len(prev)] != prev:
                    k = next(i for i, (x, y) in enumerate(zip(prev, b.prompt_token_ids)) if x != y) if any(x != y for x, y in zip(prev, b.prompt_token_ids)) else min(len(prev), len(b.prompt_token_ids))
                    stats.setdefault("diverge", []).append((len(a.prompt_token_ids), k, len(prev)))
    Path("/tmp/probe_stats.json").write_text(json.dumps(stats))
