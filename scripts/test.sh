#!/usr/bin/env bash
# The README's test command: set up (or refresh) .venv, then lint and run the whole test suite.
#   bash scripts/test.sh          everything (what CI runs: `.ci/run`)
#   bash scripts/test.sh --fast   lint + the unit tier: deselects the tests marked slow (vLLM
#                                 server, trainer processes, `rlkit train`, CLI runs over ~5 s), venv
#                                 (builds venvs, runs pip/uv) and system (bubblewrap, chromium,
#                                 PostgreSQL, SLURM, the package index)
# Further arguments go to pytest, e.g. `bash scripts/test.sh --fast -k sandbox`.
set -euo pipefail
cd "$(dirname "$0")/.."
# Both tiers spread over the cores (pytest-xdist). The full suite uses at most 4 workers (each
# starts its own session vLLM servers, conftest.py) and hands out whole files: a file's module
# fixtures (shared reference runs) stay on one worker, and the files marked with one
# `xdist_group` go to one worker together (`loadgroup`, read as files plus groups by
# tests/helpers/scheduling.py).
select=(-n auto --maxprocesses 4 --dist loadgroup)
if command -v nvidia-smi > /dev/null; then
  select=()  # one GPU: every server takes a fifth of its memory; two workers' servers would not fit
fi
if [ "${1:-}" = --fast ]; then
  shift
  select=(-m "not slow and not venv and not system" -n auto)
fi
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
.venv/bin/ruff check .
.venv/bin/ruff format --check .
# --durations: the 40 slowest tests in every log, CI's included (where the suite's time goes)
# (`--record-durations tests/durations.json` refreshes the order files are handed out in, longest
# first: tests/helpers/scheduling.py)
exec .venv/bin/pytest -q -ra --durations=40 "${select[@]}" "$@"
