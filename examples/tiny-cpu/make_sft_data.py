"""Write the SFT warm-start data for the CPU demo: reverse-text prompts with correct replies.

Uses the environment's own `sft_examples` (system + user prompt, the reversed string as the
assistant reply) with the string lengths of train.toml and a seed disjoint from its data. The
system prompt is the short one train.toml gives the environment: with a tiny model most SFT
compute should go to the reply tokens, not to a long instruction.

    python examples/tiny-cpu/make_sft_data.py OUT.jsonl [--n 4000]
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from rlkit.envs import load_environment

SYSTEM_PROMPT = "Reverse the text."  # keep equal to env.args.system_prompt in train.toml


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out", type=Path)
    parser.add_argument("--n", type=int, default=4000)
    parser.add_argument("--min-len", type=int, default=3)
    parser.add_argument("--max-len", type=int, default=6)
    parser.add_argument("--system-prompt", default=SYSTEM_PROMPT)
    args = parser.parse_args()
    load_environment("reverse-text")  # makes the environment's module importable
    from reverse_text import sft_examples

    rows = sft_examples(args.n, seed=1234, min_len=args.min_len, max_len=args.max_len)
    for row in rows:
        row["prompt"][0]["content"] = args.system_prompt
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(f".{args.out.name}.tmp")
    tmp.write_text("".join(json.dumps(row) + "\n" for row in rows))
    os.replace(tmp, args.out)
    print(f"wrote {len(rows)} SFT rows to {args.out}")


if __name__ == "__main__":
    main()
