"""`python -m deep_research --split eval --out DIR`: write a generated world's files."""

from __future__ import annotations

import argparse
from pathlib import Path

from deep_research.world import SPLITS, write_world


def main() -> None:
    parser = argparse.ArgumentParser(description="Write a generated world's corpus and questions.")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--split", choices=SPLITS, default="eval")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--questions", type=int, default=500)
    args = parser.parse_args()
    write_world(args.out, args.seed, args.split, args.scale, args.questions)


if __name__ == "__main__":
    main()
