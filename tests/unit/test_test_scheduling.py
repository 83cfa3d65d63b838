"""The suite's scheduling (tests/helpers/scheduling.py): units are files or xdist groups, handed
out longest first by the recorded durations, which `--record-durations` writes."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from tests.helpers.scheduling import (
    DURATIONS,
    UNRECORDED_SECONDS,
    DurationRecorder,
    longest_first,
    recorded_durations,
    scope_of,
)


def test_a_unit_is_the_group_else_the_file() -> None:
    assert scope_of("tests/unit/test_a.py::test_x") == "tests/unit/test_a.py"
    assert scope_of("tests/unit/test_a.py::test_x[p]@lora-server") == "lora-server"
    assert scope_of("tests/unit/test_a.py::test_x[user@host]") == "tests/unit/test_a.py"


def test_units_go_out_longest_first_and_unrecorded_ones_in_between() -> None:
    units = {name: {f"{name}::t": False} for name in ("short.py", "new.py", "long.py", "mid.py")}
    seconds = {"short.py": 1.0, "long.py": 300.0, "mid.py": UNRECORDED_SECONDS + 1}
    assert list(longest_first(units, seconds)) == ["long.py", "mid.py", "new.py", "short.py"]
    assert longest_first(units, seconds)["long.py"] == {"long.py::t": False}


def test_the_recorder_sums_each_units_phases(tmp_path: Path) -> None:
    out = tmp_path / "durations.json"
    recorder = DurationRecorder(out)
    for nodeid, duration in [
        ("a.py::t1", 1.0),
        ("a.py::t1", 2.5),  # its call after its setup
        ("b.py::t[x]@grp", 10.0),
        ("c.py::t@grp", 4.0),
    ]:
        recorder.pytest_runtest_logreport(SimpleNamespace(nodeid=nodeid, duration=duration))
    recorder.pytest_sessionfinish()
    text = out.read_text()
    assert json.loads(text) == {"grp": 14.0, "a.py": 3.5}
    assert list(json.loads(text)) == ["grp", "a.py"]  # longest first
    assert recorded_durations(out) == {"grp": 14.0, "a.py": 3.5}


def test_the_committed_record_names_files_that_exist() -> None:
    """A renamed or deleted file's entry would order nothing: refresh the record (see the
    scheduling module) when this fails."""
    root = DURATIONS.parents[1]
    seconds = recorded_durations()
    assert seconds, f"{DURATIONS} is missing or empty"
    files = [scope for scope in seconds if scope.endswith(".py")]
    assert [f for f in files if not (root / f).exists()] == []
