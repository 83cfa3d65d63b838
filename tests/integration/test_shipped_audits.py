"""Issue 61: every shipped environment passes `rlkit env audit`, through the CLI a user runs.

The rows are the eval split's first N (N per environment keeps the suite's time: an SWE row
plays each exploit as a sandboxed pytest run, math-verify times long replies out). The families'
own exploit tests live beside each package (environments/*/tests); this is the end-to-end gate
that the generic battery and every family exploit together stay at the floor.
"""

from __future__ import annotations

import json

import pytest

from tests.helpers.cli import run_cli

ROWS = {
    "reverse-text": 20,
    "logic": 60,
    "deep-research": 8,
    "math": 6,
    "math-python": 3,
    "code": 4,
    "swe": 2,
}


@pytest.mark.slow
@pytest.mark.system  # code, math-python and swe run programs in the bubblewrap sandbox
@pytest.mark.parametrize("env_id", sorted(ROWS))
def test_shipped_environment_passes_its_audit(
    env_id: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    code, out = run_cli(
        monkeypatch, capsys, "env", "audit", env_id, "-n", str(ROWS[env_id]), "--json"
    )
    report = json.loads(out[out.index("{") :])
    failing = [row for row in report["table"] if row["verdict"] != "ok"]
    assert code == 0 and report["ok"], failing
    assert report["gold_mean"] == pytest.approx(report["max_reward"])
    families = {row["family"] for row in report["table"]}
    assert families - {"generic"}, f"{env_id} registers no exploits of its own"
