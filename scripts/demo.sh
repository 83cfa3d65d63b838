#!/usr/bin/env bash
# The CPU demo, end to end: set up .venv, build a tiny Qwen3, SFT warm-start it on reverse-text,
# then RL it with IcePop and C3PO++ (`rlkit train examples/tiny-cpu/train.toml`), printing the
# held-out eval's reward and exact match (with 95% intervals) before and after (from
# `rlkit runs show`) and writing the plot to runs/tiny-cpu/rl/metrics.png.
# DEMO=tiny-moe-cpu runs the same with a tiny Qwen3-MoE and routing replay
# (examples/tiny-moe-cpu). Extra arguments go to `rlkit train` (e.g. --orchestrator.max_steps 5).
# RUN=dir changes the output folder (default runs/$DEMO); an existing run folder is replaced.
# SKIP_SETUP=1 skips scripts/setup.sh (an existing .venv is used as is).
set -euo pipefail
cd "$(dirname "$0")/.."
DEMO=${DEMO:-tiny-cpu}
case "$DEMO" in
  tiny-cpu) ARCH=qwen3 ;;
  tiny-moe-cpu) ARCH=qwen3-moe ;;
  *) echo "DEMO must be tiny-cpu or tiny-moe-cpu, got '$DEMO'" >&2; exit 2 ;;
esac
RUN=${RUN:-runs/$DEMO}

[ "${SKIP_SETUP:-0}" = 1 ] || bash scripts/setup.sh
rm -rf "$RUN"
mkdir -p "$RUN"
start=$(date +%s)

echo "[demo] 1/4 building a tiny $ARCH model"
.venv/bin/rlkit model init-tiny --out "$RUN/base" --arch "$ARCH" --size tiny --seed 0

echo "[demo] 2/4 writing SFT data (reverse-text prompts with correct replies)"
.venv/bin/python examples/tiny-cpu/make_sft_data.py "$RUN/sft.jsonl"

echo "[demo] 3/4 SFT warm start"
# one thread: the 0.6 M-parameter model gains little from a second one, and on a shared 2-core
# machine two threads made each step 10-40x slower (0.12 s a step with one, loaded)
OMP_NUM_THREADS=1 .venv/bin/rlkit sft "examples/$DEMO/sft.toml" \
  --run_dir "$RUN/sft" --model.path "$RUN/base" --data.path "$RUN/sft.jsonl"

echo "[demo] 4/4 RL with IcePop + C3PO++ (eval before and after)"
.venv/bin/rlkit train "examples/$DEMO/train.toml" \
  --model.path "$RUN/sft/final" --log.run_dir "$RUN/rl" "$@"

echo "[demo] done in $(( $(date +%s) - start ))s; metrics: $RUN/rl/metrics.jsonl, plot: $RUN/rl/metrics.png"
echo "[demo] held-out eval before and after RL (report: .venv/bin/rlkit runs show $RUN/rl):"
.venv/bin/rlkit runs show "$RUN/rl" | grep -E '^(eval|WARNING) ' || true
