#!/usr/bin/env bash
# The CPU demo, end to end: set up .venv, build a tiny Qwen3, SFT warm-start it on reverse-text,
# then RL it with IcePop and C3PO++ (`rlkit train examples/tiny-cpu/train.toml`), printing the
# eval reward before and after and writing the plot to runs/tiny-cpu/rl/metrics.png.
# Extra arguments go to `rlkit train` (e.g. --orchestrator.max_steps 5). RUN=dir changes the
# output folder (default runs/tiny-cpu); an existing run folder is replaced. SKIP_SETUP=1 skips
# scripts/setup.sh (an existing .venv is used as is).
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${RUN:-runs/tiny-cpu}

[ "${SKIP_SETUP:-0}" = 1 ] || bash scripts/setup.sh
rm -rf "$RUN"
mkdir -p "$RUN"
start=$(date +%s)

echo "[demo] 1/4 building a tiny Qwen3 model"
.venv/bin/rlkit model init-tiny --out "$RUN/base" --arch qwen3 --size tiny --seed 0

echo "[demo] 2/4 writing SFT data (reverse-text prompts with correct replies)"
.venv/bin/python examples/tiny-cpu/make_sft_data.py "$RUN/sft.jsonl"

echo "[demo] 3/4 SFT warm start"
.venv/bin/rlkit sft examples/tiny-cpu/sft.toml \
  --run_dir "$RUN/sft" --model.path "$RUN/base" --data.path "$RUN/sft.jsonl"

echo "[demo] 4/4 RL with IcePop + C3PO++ (eval before and after)"
.venv/bin/rlkit train examples/tiny-cpu/train.toml \
  --model.path "$RUN/sft/final" --log.run_dir "$RUN/rl" "$@"

echo "[demo] done in $(( $(date +%s) - start ))s; metrics: $RUN/rl/metrics.jsonl, plot: $RUN/rl/metrics.png"
