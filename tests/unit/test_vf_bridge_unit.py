"""The verifiers bridge without venvs: version selection, source detection, worker failures."""

from __future__ import annotations

import asyncio
import importlib.metadata
import shutil
import sys
import textwrap
from pathlib import Path

import pytest
from packaging.version import Version

from rlkit.envs.bridge.process import WorkerFailed, WorkerProcess
from rlkit.envs.bridge.source import find_verifiers_source, split_requirements
from rlkit.envs.bridge.versions import select_version, versions_tested
from rlkit.errors import UsageError

ENVS = Path(__file__).resolve().parents[1] / "integration" / "envs"


def test_newest_tested_version_inside_the_declared_range() -> None:
    assert select_version("e", ">=0.1.3,<0.1.4") == "0.1.3.post0"
    assert select_version("e", ">=0.1.3,<0.2") == "0.1.9.post3"
    assert select_version("e", None) == max(versions_tested(), key=Version)
    assert select_version("e", ">=0.1.3,<0.1.4", override="0.1.9.post3") == "0.1.9.post3"


def test_what_an_environment_exports_picks_the_era() -> None:
    """0.4 packages export a Taskset; older ones define load_environment: neither runs on the
    other's versions, whatever the declared range allows."""
    assert select_version("e", None, api="taskset") == "0.4.0"
    assert select_version("e", None, api="load_environment") == "0.3.1"
    assert select_version("e", "<0.3", api="load_environment") == "0.2.0"
    with pytest.raises(UsageError, match="no tested verifiers version fits"):
        select_version("e", ">=0.4", api="load_environment")
    with pytest.raises(UsageError, match=r"0.2.0 \(0.1.10-0.2.x client layer\) cannot load"):
        select_version("e", None, override="0.2.0", api="taskset")
    v04 = find_verifiers_source("vf-calc-v04", [ENVS], ["vf_calc_v04"])
    v02 = find_verifiers_source("vf-calc-v02", [ENVS], ["vf_calc_v02"])
    assert v04 is not None and v04.api == "taskset" and v04.module == "vf_calc_v04"
    assert v02 is not None and v02.api == "load_environment"


def test_no_fitting_version_names_required_tested_and_installed() -> None:
    with pytest.raises(UsageError) as info:
        select_version("catapult", ">=0.5,<0.6")
    message = str(info.value)
    assert "requires verifiers >=0.5,<0.6" in message and "0.1.3.post0" in message
    assert "installed beside rlkit" in message and "--verifiers-version" in message
    with pytest.raises(UsageError, match="no supported era"):
        select_version("e", None, override="0.5.0")
    with pytest.raises(UsageError, match="not a version"):
        select_version("e", None, override="latest")


def test_verifiers_envs_are_recognised_without_importing_them() -> None:
    spec, others = split_requirements(["verifiers>=0.1.9,<0.2", "datasets>=3", "rlkit"])
    assert spec == "<0.2,>=0.1.9" and others == ["datasets>=3"]
    source = find_verifiers_source("vf-calc-state", [ENVS], ["vf_calc_state"])
    assert source is not None and source.module == "vf_calc_state"
    assert source.sys_path == [str(ENVS / "vf-calc-state")]
    assert source.requirements == ["datasets>=3.0"]
    assert find_verifiers_source("flaky-reverse", [ENVS], ["flaky_reverse"]) is None
    assert "verifiers" not in sys.modules


FAKE_WORKER = """
import json, os, sys
first_life = not os.path.exists(sys.argv[1])
open(sys.argv[1], "a").close()
print(json.dumps({"id": 0, "ok": True, "result": {"splits": {}}}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    if first_life and req["op"] == "rollout":
        print("Traceback (most recent call last): not a protocol line", flush=True)
        continue
    print(json.dumps({"id": req["id"], "ok": True, "result": req["op"]}), flush=True)
"""


def test_garbage_on_the_channel_fails_in_flight_requests_and_restarts(tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent(FAKE_WORKER))
    marker = tmp_path / "started-once"
    worker = WorkerProcess(sys.executable, {}, argv=[sys.executable, str(script), str(marker)])

    async def run() -> None:
        with pytest.raises(WorkerFailed, match="wrote garbage"):
            await worker.acall("rollout", 10)
        assert await worker.acall("rollout", 10) == "rollout"  # a fresh worker answers

    try:
        asyncio.run(run())
        assert worker.restarts == 1
    finally:
        worker.close()


def test_a_worker_that_cannot_start_fails_fast(tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(
        "import sys; sys.stderr.write('boom: no module named verifiers\\n'); sys.exit(1)"
    )
    worker = WorkerProcess(sys.executable, {}, argv=[sys.executable, str(script)])
    with pytest.raises(WorkerFailed, match="exited with code 1") as info:
        worker.describe()
    assert "boom" in str(info.value)
    worker.close()


def test_hub_install_keeps_verifiers_out_of_rlkits_venv(tmp_path: Path) -> None:
    """A wheel requiring verifiers is pip-installed without dependencies (its venv gets them)."""
    from rlkit.hub.install import _requirements, is_verifiers_env
    from tests.helpers.hub_dists import make_wheel, metadata

    def wheel(requires: list[str]) -> list:
        lines = "".join(f"Requires-Dist: {r}\n" for r in requires)
        meta = metadata("vf-e", "0.1.0").replace("Requires-Python", f"{lines}Requires-Python")
        name, data = make_wheel(
            "vf-e", "0.1.0", extra={"vf_e-0.1.0.dist-info/METADATA": meta.encode()}
        )
        (tmp_path / name).write_bytes(data)
        return _requirements(tmp_path / name)

    assert is_verifiers_env(wheel(["datasets>=3", "verifiers>=0.1.9,<0.2"]))
    assert not is_verifiers_env(wheel(["rlkit", "verifiers; extra == 'vf'"]))


def _fake_install(site: Path, where: str) -> importlib.metadata.Distribution:
    info = site / "pkg-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: pkg\nVersion: 1.0\n")
    (info / "RECORD").write_text("pkg.py,,\npkg-1.0.dist-info/METADATA,,\n")
    (site / "pkg.py").write_text(f"WHERE = {where!r}\n")
    return importlib.metadata.Distribution.at(info)


def test_installed_sources_link_to_their_own_installation(tmp_path, monkeypatch) -> None:
    """The same release installed in two venvs, the first one since deleted, is imported from
    the second one's files (not through the first one's dangling links)."""
    from rlkit.envs.bridge.source import _linked_sources

    monkeypatch.setenv("RLKIT_BRIDGE_VENVS", str(tmp_path / "bridge" / "venvs"))
    first = _linked_sources(_fake_install(tmp_path / "a", "a"))
    shutil.rmtree(tmp_path / "a")
    second = _linked_sources(_fake_install(tmp_path / "b", "b"))
    assert first != second and (second / "pkg.py").read_text() == "WHERE = 'b'\n"
