#!/usr/bin/env bash
# The README's test command: set up (or refresh) .venv, then run the whole test suite.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -k sandbox`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
.venv/bin/ruff check .
.venv/bin/ruff format --check .
exec .venv/bin/pytest -q -ra --durations=15 "$@"
