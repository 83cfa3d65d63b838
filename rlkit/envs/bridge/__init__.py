"""Run environments written for verifiers unmodified, each in a worker inside its own venv.

rlkit's process never imports verifiers. `BridgeEnv` (env.py) is an rlkit `Environment` backed
by a worker process (process.py, worker/vf_worker.py) running in a cached venv with one exact,
tested verifiers version (venvs.py, versions.py), speaking the JSON-lines protocol in
PROTOCOL.md. One shim per verifiers era lives in worker/; `rlkit env doctor` is `rlkit.envs.doctor`.
"""

from rlkit.envs.bridge.env import BridgeEnv
from rlkit.envs.bridge.source import VfSource, find_verifiers_source

__all__ = ["BridgeEnv", "VfSource", "find_verifiers_source"]
