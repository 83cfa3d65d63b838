"""How `bash scripts/test.sh` hands tests to its xdist workers: whole files, as `--dist loadfile`
does (a file's module fixtures stay on one worker), except that the files marked with one
`xdist_group` go to one worker together; the longest first.

The files on the session's LoRA server (`lora_server`, group "lora-server") share a worker: each
worker that ran one of them would otherwise keep a LoRA engine (three processes) of its own
until the suite ends (tests/unit/test_test_tiers.py checks the files carry the mark).

Longest first: xdist's own order (most tests first) left the files of one or two long
`rlkit train` tests to the end, where one worker ran them while the other had nothing left.
Handed out longest first (by `tests/durations.json`, each file's or group's seconds in a
recorded run), the last files to start are short ones and the workers finish together.
Refresh the record with `bash scripts/test.sh --record-durations tests/durations.json`; a file
not in it counts as `UNRECORDED_SECONDS`.
"""

from __future__ import annotations

import json
from collections import OrderedDict, defaultdict
from pathlib import Path

from xdist.scheduler import LoadScopeScheduling

DURATIONS = Path(__file__).parents[1] / "durations.json"
UNRECORDED_SECONDS = 30.0  # a new file: after the long recorded ones, before the short ones


def scope_of(nodeid: str) -> str:
    """A test's unit of scheduling: its `xdist_group` (xdist suffixes a marked test's id with
    "@GROUP"), else its file."""
    if nodeid.rfind("@") > nodeid.rfind("]"):  # a parameter may hold an "@"
        return nodeid.rsplit("@", 1)[1]
    return nodeid.split("::", 1)[0]


def recorded_durations(path: Path = DURATIONS) -> dict[str, float]:
    return json.loads(path.read_text()) if path.exists() else {}


def longest_first(units: dict[str, dict[str, bool]], seconds: dict[str, float]) -> OrderedDict:
    """The work queue's units by recorded seconds, longest first (ties keep xdist's order)."""
    ranked = sorted(units.items(), key=lambda unit: -seconds.get(unit[0], UNRECORDED_SECONDS))
    return OrderedDict(ranked)


class FilesAndGroups(LoadScopeScheduling):
    """`--dist loadgroup`'s groups and every other test with the rest of its file, handed out
    longest first."""

    ordered = False

    def _split_scope(self, nodeid: str) -> str:
        return scope_of(nodeid)

    def _assign_work_unit(self, node: object) -> None:
        if not self.ordered:  # the queue is complete before the first unit is handed out
            self.workqueue = longest_first(self.workqueue, recorded_durations())
            self.ordered = True
        super()._assign_work_unit(node)


class DurationRecorder:
    """Sums every test's setup, call and teardown time by scheduling unit (on the controller,
    which sees every worker's reports) and writes them, longest first, at the session's end."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seconds: defaultdict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: object) -> None:
        self.seconds[scope_of(report.nodeid)] += report.duration  # type: ignore[attr-defined]

    def pytest_sessionfinish(self) -> None:
        ordered = sorted(self.seconds.items(), key=lambda unit: -unit[1])
        text = json.dumps({scope: round(s, 1) for scope, s in ordered}, indent=1) + "\n"
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(self.path)
