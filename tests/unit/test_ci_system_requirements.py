"""In CI (`CI=true`) a missing system component fails the run instead of skipping its tests.

A machine without chromium is simulated with a PATH holding links to every system command
except chromium and the package tools (so nothing can be installed, and nothing is)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.system import require_system

ROOT = Path(__file__).resolve().parents[2]
HIDDEN = {"chromium", "chromium-browser", "apt-get", "apt", "sudo"}


@pytest.fixture
def path_without_chromium(tmp_path: Path) -> str:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for directory in ("/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin"):
        if not Path(directory).is_dir():
            continue
        for tool in Path(directory).iterdir():
            link = bindir / tool.name
            if tool.name not in HIDDEN and not link.exists():
                link.symlink_to(tool)
    return str(bindir)


def test_require_system_skips_locally_and_fails_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    require_system("bubblewrap", True, "unused")  # present: nothing happens
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="apt-get install chromium"):
        require_system("chromium", False, "apt-get install chromium")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true: a missing system component"):
        require_system("chromium", False, "apt-get install chromium")


def test_ci_test_script_without_chromium_fails_with_a_clear_message(
    path_without_chromium: str,
) -> None:
    env = {**os.environ, "CI": "true", "PATH": path_without_chromium}
    proc = subprocess.run(
        ["bash", "scripts/test.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "required system packages are missing" in proc.stderr
    assert "chromium" in proc.stderr.split("missing")[1]
    assert "passed" not in proc.stdout  # no test ran


@pytest.mark.slow  # a pytest subprocess (~8 s)
def test_ci_browser_test_without_chromium_fails_instead_of_skipping(
    path_without_chromium: str,
) -> None:
    env = {**os.environ, "CI": "true", "PATH": path_without_chromium}
    test = "tests/integration/test_hub_server.py::test_web_pages_in_headless_chromium"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout
    assert "1 failed" in proc.stdout and "skipped" not in proc.stdout
    assert "chromium is not available on this machine" in proc.stdout
