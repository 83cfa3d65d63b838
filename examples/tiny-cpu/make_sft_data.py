"""Write the SFT warm-start data for the CPU demo: reverse-text prompts with correct replies.

The environment is loaded with the `[[env]]` arguments of train.toml, and every one of its
training and evaluation strings is excluded from generation; the result is checked again before
anything is written, so the demo's RL prompts and its before/after eval are never memorised in
the warm start. The system prompt is the short one train.toml gives the environment: with a tiny
model most SFT compute should go to the reply tokens, not to a long instruction.

    python examples/tiny-cpu/make_sft_data.py OUT.jsonl [--n 4000] [--config train.toml]
"""

from __future__ import annotations

import argparse
import json
import os
import tomllib
from pathlib import Path
from typing import Any

from rlkit.envs import load_environment

HERE = Path(__file__).resolve().parent
ENV_ID = "reverse-text"


def env_args(config: Path) -> dict[str, Any]:
    """The reverse-text `[[env]]` arguments of a train config."""
    envs = tomllib.loads(config.read_text()).get("env", [])
    for spec in envs:
        if spec.get("id") == ENV_ID:
            return dict(spec.get("args", {}))
    raise SystemExit(f"{config}: no [[env]] with id = {ENV_ID!r}")


def environment_texts(args: dict[str, Any]) -> set[str]:
    """Every string the environment trains or evaluates on with these arguments."""
    env = load_environment(ENV_ID, **args)
    texts: set[str] = set()
    for dataset in (env.dataset, env.eval_dataset):
        if dataset is not None:
            texts.update(dataset["question"])
    return texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out", type=Path)
    parser.add_argument("--n", type=int, default=4000)
    parser.add_argument("--config", type=Path, default=HERE / "train.toml")
    parser.add_argument("--seed", type=int, default=1234)
    cli = parser.parse_args()
    args = env_args(cli.config)
    excluded = environment_texts(args)
    from reverse_text import DEFAULT_ALPHABET, sft_examples  # importable once the env loaded

    rows = sft_examples(
        cli.n,
        seed=cli.seed,
        min_len=args.get("min_len", 5),
        max_len=args.get("max_len", 10),
        alphabet=args.get("alphabet", DEFAULT_ALPHABET),
        exclude=excluded,
    )
    overlap = {row["prompt"][1]["content"] for row in rows} & excluded
    if overlap:  # cannot happen with `exclude`; checked so the claim holds for the file written
        raise SystemExit(f"SFT data overlaps the environment's rows: {sorted(overlap)[:5]}")
    system_prompt = args.get("system_prompt")
    for row in rows:
        if system_prompt:
            row["prompt"][0]["content"] = system_prompt
    cli.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = cli.out.with_name(f".{cli.out.name}.tmp")
    tmp.write_text("".join(json.dumps(row) + "\n" for row in rows))
    os.replace(tmp, cli.out)
    print(f"wrote {len(rows)} SFT rows to {cli.out} ({len(excluded)} environment strings excluded)")


if __name__ == "__main__":
    main()
