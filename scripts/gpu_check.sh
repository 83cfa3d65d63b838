#!/usr/bin/env bash
# Check an NVIDIA GPU machine end to end in under 10 minutes, without downloads (pass --wheels DIR
# where there is no package index): installs the `gpu` extra, builds the small model, runs the
# inference and trainer tests on CUDA, the broadcast weight transfer, and the demo config on the
# GPU, then prints one table of results and figures. `--dry-run` prints the plan; `--help` the options.
# The logic is scripts/gpu_check.py (standard library only, so it runs before the install).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && PY=.venv/bin/python
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
exec "$PY" scripts/gpu_check.py --python "$PY" "$@"
