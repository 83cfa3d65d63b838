"""The installed copy of an environment evaluates with the same defaults as its folder (issue 45:
temperature 1.0 installed vs 0.7 local): `rlkit env build` carries `[tool.rlkit.eval]` in the
wheel, and the resolver reads it back from the installed distribution."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.helpers.cli import RLKIT

pytestmark = [pytest.mark.slow, pytest.mark.venv]  # builds a wheel, pip-installs it

# what `rlkit eval ENV_ID` would run with: the package's defaults over the config, the
# package's sampling over the environment's
RESOLVE = """
import json, sys
from rlkit.envs.loader import load_resolved
from rlkit.envs.resolve import resolve_env_id
from rlkit.eval.config import EvalConfig
from rlkit.eval.package_defaults import apply_package_defaults, package_eval_defaults

resolved = resolve_env_id(sys.argv[1])
config, sampling = apply_package_defaults(
    EvalConfig(env_id=sys.argv[1]), *package_eval_defaults(resolved)
)
env = load_resolved(resolved)
print(json.dumps({
    "source": resolved.source,
    "defaults": dict(resolved.eval_defaults),
    "num_examples": config.num_examples,
    "rollouts_per_example": config.rollouts_per_example,
    "sampling": config.sampling_args(env.sampling_defaults, sampling),
}))
"""


def resolve(env_id: str, cwd: Path, pythonpath: list[str]) -> dict:
    inherited = [os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*pythonpath, *inherited])}
    env.pop("RLKIT_ENV_PATH", None)
    done = subprocess.run(
        [sys.executable, "-c", RESOLVE, env_id], cwd=cwd, capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_installed_wheel_evaluates_like_its_folder(tmp_path: Path) -> None:
    work, elsewhere, target = tmp_path / "work", tmp_path / "elsewhere", tmp_path / "site"
    work.mkdir()
    elsewhere.mkdir()
    subprocess.run([RLKIT, "env", "init", "my-env"], cwd=work, check=True, capture_output=True)
    pyproject = work / "my-env" / "pyproject.toml"  # defaults unlike the environment's own
    text = pyproject.read_text().replace("temperature = 0.7", "temperature = 0.3")
    pyproject.write_text(text.replace("num_examples = 5", "num_examples = 7"))
    built = subprocess.run(
        [RLKIT, "env", "build", "./my-env", "--no-isolation"],
        cwd=work,
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = (work / "my-env" / "dist").glob("*.whl")
    with zipfile.ZipFile(wheel) as zf:
        assert "pyproject.toml" not in " ".join(zf.namelist())  # only the metadata carries them
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
         "--target", str(target), str(wheel)],
        check=True,
    )  # fmt: skip

    folder = resolve("./my-env", work, [])
    installed = resolve("my-env", elsewhere, [str(target)])
    assert folder["source"] == "local" and installed["source"] == "installed"
    assert installed["defaults"] == folder["defaults"] != {}
    assert installed["sampling"] == folder["sampling"] == {"temperature": 0.3, "max_tokens": 32}
    assert installed["num_examples"] == folder["num_examples"] == 7
    assert installed["rollouts_per_example"] == folder["rollouts_per_example"] == 3
