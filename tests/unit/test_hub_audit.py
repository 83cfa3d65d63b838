"""The exploit audit on the hub: `AuditRecord` (what a version keeps of `rlkit env audit`), the
local directory hub storing one per version, `rlkit env push` refusing an environment an exploit
farms (unless --allow-exploits), and `rlkit env info` showing the table."""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path

import pytest
from pydantic import ValidationError
from sqlalchemy import inspect

from rlkit.envs.audit import AuditReport, ExploitResult, VariantResult, hub_record
from rlkit.hub import LocalHub
from rlkit.hub.names import EnvRef
from rlkit.hub.records import MAX_AUDIT_EXPLOITS, AuditRecord, AuditRow, EnvCard
from rlkit.hub.server.db import make_engine
from tests.helpers.audited_envs import BACKDOOR, PARTIAL, add_dists, audited_package
from tests.helpers.cli import run_cli
from tests.helpers.hub_dists import make_sdist, make_wheel


def sample_report() -> AuditReport:
    report = AuditReport(env_id="demo", rows=4, empty_mean=0.0, gold_mean=1.0)
    report.exploits = [
        ExploitResult(
            name="constant",
            variants=[
                VariantResult(name="yes", rewards=[1.0, 1.0, 0.0, 0.0], example_ids=[0, 1, 2, 3]),
                VariantResult(name="0", rewards=[0.0] * 4, example_ids=[0, 1, 2, 3]),
            ],
            full_reward_rows=["0 (yes)", "1 (yes)"],
            problem="full reward on 0 (yes), 1 (yes)",
        ),
        ExploitResult(
            name="knight or knave",
            family="logic",
            two_way=True,
            variants=[
                VariantResult(name="knight", rewards=[1.0, 0.0], example_ids=[0, 1]),
                VariantResult(name="knave", rewards=[0.0, 1.0], example_ids=[0, 1]),
            ],
        ),
        ExploitResult(name="echo", variants=[]),
    ]
    return report


def test_audit_record_from_a_report() -> None:
    record = hub_record(sample_report())
    assert (record.ran, record.ok, record.verdict) == (True, False, "failed")
    assert (record.rows, record.split, record.gold_mean, record.empty_mean) == (4, "eval", 1, 0)
    assert record.floor == pytest.approx(0.05)
    constant, two_way, echo = record.table
    assert (constant.exploit, constant.best_variant, constant.mean) == ("constant", "yes", 0.5)
    assert (constant.full_reward_rows, constant.rows) == (2, 4)
    assert constant.verdict.startswith("FAIL: full reward on 0 (yes)")
    assert (two_way.family, two_way.two_way, two_way.two_way_balance) == ("logic", True, 0.5)
    assert two_way.verdict == "ok" and two_way.full_reward_rows == 0
    assert (echo.best_variant, echo.rows, echo.verdict) == ("-", 0, "ok")
    again = AuditRecord.model_validate_json(record.model_dump_json())  # the wire round trip
    assert again == record


def test_audit_record_bounds() -> None:
    not_run = AuditRecord.not_run()
    assert (not_run.verdict, not_run.ok, not_run.table) == ("not run", False, [])
    with pytest.raises(ValidationError):
        AuditRecord(ran=False, ok=True)
    with pytest.raises(ValidationError):
        AuditRecord(table=[AuditRow(exploit="x")] * (MAX_AUDIT_EXPLOITS + 1))
    with pytest.raises(ValidationError):
        AuditRow(exploit="x" * 201)
    with pytest.raises(ValidationError):
        AuditRecord.model_validate_json('{"gold_mean": NaN}')
    with pytest.raises(ValidationError):
        AuditRow(exploit="x", rows=-1)
    report = sample_report()  # package-supplied names are clipped, a NaN mean dropped
    report.exploits[0].name = "n" * 500
    report.gold_mean = math.nan
    record = hub_record(report)
    assert len(record.table[0].exploit) == 200 and record.gold_mean is None


def test_local_hub_keeps_each_versions_audit(tmp_path: Path) -> None:
    hub = LocalHub(tmp_path / "hub", owner="alice")
    ref = EnvRef("alice", "audit-env")

    def files(version: str) -> list[Path]:
        out = []
        for filename, data in (make_wheel("audit-env", version), make_sdist("audit-env", version)):
            (tmp_path / filename).write_bytes(data)
            out.append(tmp_path / filename)
        return out

    first = hub_record(sample_report(), exploits_allowed=True)
    hub.push(files("0.1.0"), audit=first)
    hub.push(files("0.2.0"), audit=AuditRecord.not_run())
    hub.push(files("0.3.0"))  # a library push without an audit
    card = hub.card(ref)
    assert card.get_version("0.1.0").audit == first
    assert card.get_version("0.2.0").audit.verdict == "not run"
    assert card.get_version("0.3.0").audit is None and card.latest_audit is None
    # a card written before audits existed still loads
    path = hub.root / "projects" / "audit-env.json"
    old = json.loads(path.read_text())
    for version in old["versions"]:
        version.pop("audit")
    path.write_text(json.dumps(old))
    assert [v.audit for v in hub.card(ref).versions] == [None, None, None]
    assert EnvCard.model_validate(old).latest_audit is None


def test_push_audits_and_refuses_an_exploited_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setenv("RLKIT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("RLKIT_HUB_OWNER", "carol")
    hub_dir = tmp_path / "hub"
    hub = ["--hub", str(hub_dir)]
    package = audited_package(tmp_path, "backdoor-env", BACKDOOR)

    code, out = run_cli(monkeypatch, capsys, "env", "push", str(package), *hub, "--audit-rows", "4")
    assert code == 1, out
    assert "empty: 4/4 as expected" not in out  # the check ran on its own 10 rows
    assert "FAIL: full reward" in out  # the audit's table was printed
    assert "not published: exploit(s) constant earn full reward" in out
    assert "--allow-exploits" in out
    assert not (hub_dir / "projects").exists() and not (hub_dir / "files").exists()

    code, out = run_cli(
        monkeypatch, capsys, "env", "push", str(package), *hub, "--audit-rows", "4",
        "--allow-exploits",
    )  # fmt: skip
    assert code == 0 and "published carol/backdoor-env@0.1.0" in out, out
    audit = LocalHub(hub_dir).card(EnvRef("carol", "backdoor-env")).latest_audit
    assert audit is not None and (audit.ran, audit.ok, audit.exploits_allowed) == (
        True,
        False,
        True,
    )
    assert (audit.rows, audit.split, audit.gold_mean, audit.empty_mean) == (4, "eval", 1, 0)
    constant = next(row for row in audit.table if row.exploit == "constant")
    assert (constant.full_reward_rows, constant.rows, constant.mean) == (4, 4, 1.0)
    assert constant.best_variant.startswith("yes")
    assert {row.exploit for row in audit.table} >= {"echo", "format only", "judge bait"}

    code, out = run_cli(monkeypatch, capsys, "env", "info", "carol/backdoor-env", *hub)
    assert code in (0, None), out
    assert "audit of 0.1.0: failed (published with --allow-exploits)" in out
    assert "gold mean 1.000, empty mean 0.000, floor 0.050" in out
    assert "full-reward" in out and "4/4" in out and "FAIL: full reward" in out
    code, out = run_cli(monkeypatch, capsys, "env", "info", "carol/backdoor-env", *hub, "--json")
    card = json.loads(out)
    (version,) = card["versions"]
    assert version["audit"]["exploits_allowed"] is True
    assert any(r["exploit"] == "constant" for r in version["audit"]["table"])

    # --skip-check skips the audit too; the version records it as not run
    add_dists(package, "backdoor-env", "0.2.0")
    code, out = run_cli(monkeypatch, capsys, "env", "push", str(package), *hub, "--skip-check")
    assert code == 0 and "audit" not in out.split("published")[0], out
    code, out = run_cli(monkeypatch, capsys, "env", "info", "carol/backdoor-env", *hub)
    assert "audit of 0.2.0: not run (pushed with --skip-check)" in out


def test_push_publishes_a_floor_only_failure_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setenv("RLKIT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("RLKIT_HUB_OWNER", "carol")
    hub = ["--hub", str(tmp_path / "hub")]
    package = audited_package(tmp_path, "partial-env", PARTIAL)
    code, out = run_cli(monkeypatch, capsys, "env", "push", str(package), *hub, "--audit-rows", "3")
    assert code == 0, out
    assert "warning: publishing with a failed audit (constant)" in out
    assert "published carol/partial-env@0.1.0" in out
    audit = LocalHub(tmp_path / "hub").card(EnvRef("carol", "partial-env")).latest_audit
    assert audit is not None and (audit.ok, audit.exploits_allowed, audit.rows) == (False, False, 3)
    constant = next(row for row in audit.table if row.exploit == "constant")
    assert (constant.mean, constant.full_reward_rows) == (0.25, 0)
    assert "above the floor" in constant.verdict


def test_push_of_a_sound_environment_records_a_passed_audit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setenv("RLKIT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("RLKIT_HUB_OWNER", "carol")
    hub = ["--hub", str(tmp_path / "hub")]
    package = audited_package(tmp_path, "sound-env")
    code, out = run_cli(monkeypatch, capsys, "env", "push", str(package), *hub, "--audit-rows", "3")
    assert code == 0 and "OK: no exploit beats the floor" in out and "warning" not in out, out
    audit = LocalHub(tmp_path / "hub").card(EnvRef("carol", "sound-env")).latest_audit
    assert audit is not None and audit.verdict == "passed" and not audit.exploits_allowed
    assert all(row.verdict == "ok" and row.full_reward_rows == 0 for row in audit.table)
    code, out = run_cli(monkeypatch, capsys, "env", "info", "carol/sound-env", *hub)
    assert "audit of 0.1.0: passed; 3 eval rows" in out


def test_an_older_hub_database_gains_the_audit_column(tmp_path: Path) -> None:
    path = tmp_path / "hub.db"
    with sqlite3.connect(path) as conn:  # the releases table before audits
        conn.execute(
            "CREATE TABLE releases (id INTEGER PRIMARY KEY, project_id INTEGER, "
            "version VARCHAR(100), created DATETIME)"
        )
        conn.execute("INSERT INTO releases (project_id, version) VALUES (1, '0.1.0')")
    engine = make_engine(f"sqlite:///{path}")
    assert "audit" in {c["name"] for c in inspect(engine).get_columns("releases")}
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT audit FROM releases").fetchall() == [(None,)]
