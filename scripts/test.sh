#!/usr/bin/env bash
# The README's test command: set up (or refresh) .venv, then lint and run the whole test suite.
#   bash scripts/test.sh          everything (what CI runs: `.ci/run`)
#   bash scripts/test.sh --fast   lint + the unit tier: deselects the tests marked slow (vLLM
#                                 server, trainer processes, `rlkit train`, CLI runs over ~5 s), venv
#                                 (builds venvs, runs pip/uv) and system (bubblewrap, chromium,
#                                 PostgreSQL, SLURM, the package index), on every core (xdist)
# Further arguments go to pytest, e.g. `bash scripts/test.sh --fast -k sandbox`.
set -euo pipefail
cd "$(dirname "$0")/.."
select=()
if [ "${1:-}" = --fast ]; then
  shift
  # the unit tier's tests share no server, so they spread over the cores; the full suite stays
  # serial (its tests share session vLLM servers and time-bound kill/resume runs)
  select=(-m "not slow and not venv and not system" -n auto)
fi
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
.venv/bin/ruff check .
.venv/bin/ruff format --check .
# --durations: the 40 slowest tests in every log, CI's included (where the suite's time goes)
exec .venv/bin/pytest -q -ra --durations=40 "${select[@]}" "$@"
