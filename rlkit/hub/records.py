"""Wire and storage records of the hub: the environment card and its parts.

The same pydantic models are the JSON API's responses, the local directory hub's on-disk
records and what the CLI prints, so both hub kinds look identical to their users.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Visibility = Literal["public", "private"]


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class FileRecord(BaseModel):
    """One distribution file of a version; `sha256` is recorded at push, checked on install."""

    filename: str
    sha256: str
    size: int
    packagetype: str
    requires_python: str = ""
    upload_time: str = Field(default_factory=utc_now)


MAX_AUDIT_EXPLOITS = 200
MAX_AUDIT_BYTES = 256 * 1024  # the largest audit a hub server accepts (JSON body)
AuditVerdict = Literal["passed", "failed", "not run"]


def finite(value: float | None, digits: int = 4) -> float | None:
    """`value` rounded, or None when it is missing or not finite (JSON has no NaN)."""
    if value is None or not math.isfinite(value):
        return None
    return round(float(value), digits)


class AuditRow(BaseModel):
    """One exploit's line of a published audit (`rlkit.envs.audit.AuditReport.table`).

    Exploit names, families and variants come from the environment's package: untrusted text,
    bounded here and escaped wherever it is shown.
    """

    model_config = ConfigDict(allow_inf_nan=False)

    exploit: str = Field(max_length=200)
    family: str = Field("generic", max_length=100)
    best_variant: str = Field("-", max_length=200)
    mean: float | None = Field(None, description="the best variant's mean reward")
    rows: int = Field(0, ge=0, description="rows the exploit was played on")
    full_reward_rows: int = Field(
        0, ge=0, description="rows where a variant reached the maximum (two-way: 0)"
    )
    errors: int = Field(0, ge=0)
    two_way: bool = False
    two_way_balance: float | None = None
    verdict: str = Field("ok", max_length=1000, description="'ok' or 'FAIL: why'")


class AuditRecord(BaseModel):
    """What the hub keeps of `rlkit env audit` for one version: the run's figures and its table.

    `rlkit env push` runs the audit and attaches this record to the version it publishes
    (`ran` False: pushed with `--skip-check`, shown as "not run"). `exploits_allowed`: an
    exploit earned full reward and the owner published anyway (`--allow-exploits`). The record
    is the publisher's own report; the hub validates its shape, not its truth.
    """

    model_config = ConfigDict(allow_inf_nan=False)

    ran: bool = True
    date: str = Field(default_factory=utc_now, max_length=40)
    rows: int = Field(0, ge=0)
    split: str = Field("", max_length=20)
    min_reward: float | None = None
    max_reward: float | None = None
    gold_mean: float | None = None
    empty_mean: float | None = None
    floor: float | None = Field(None, description="the mean no exploit may exceed")
    ok: bool = Field(False, description="no exploit failed the audit")
    exploits_allowed: bool = False
    table: list[AuditRow] = Field([], max_length=MAX_AUDIT_EXPLOITS)

    @model_validator(mode="after")
    def _not_run_is_not_ok(self) -> AuditRecord:
        if not self.ran and (self.ok or self.table):
            raise ValueError("an audit that did not run has no table and is not ok")
        return self

    @property
    def verdict(self) -> AuditVerdict:
        if not self.ran:
            return "not run"
        return "passed" if self.ok else "failed"

    @classmethod
    def not_run(cls) -> AuditRecord:
        return cls(ran=False)


def clip_text(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


class VersionRecord(BaseModel):
    version: str
    files: list[FileRecord] = []
    created: str = Field(default_factory=utc_now)
    audit: AuditRecord | None = Field(
        None, description="`rlkit env audit` as pushed with this version (None: not audited)"
    )


MAX_ROLLOUT_SAMPLE = 16
EvalStatus = Literal["claimed", "verified", "disputed"]


class ReproductionRecord(BaseModel):
    """A re-run of a leaderboard result by the environment's owner or a trusted runner.

    `agrees` is the hub's verdict: |mean_reward - claimed mean_reward| <= `tolerance`.
    """

    model: str
    mean_reward: float
    n: int = Field(description="number of scored rollouts")
    date: str = Field(default_factory=utc_now)
    metadata: dict = {}
    runner: str = Field("", description="set by the hub: who re-ran it")
    tolerance: float = Field(0.0, description="set by the hub")
    agrees: bool = Field(False, description="set by the hub")


def eval_status(reproductions: list[ReproductionRecord]) -> EvalStatus:
    """verified if any reproduction agrees, disputed if some exist and none does."""
    if any(r.agrees for r in reproductions):
        return "verified"
    return "disputed" if reproductions else "claimed"


class EvalRecord(BaseModel):
    """One evaluation run's summary, attached to an environment version (leaderboard row).

    A result is `claimed` when posted; the hub alone sets `id`, `submitted_by`, `status` and
    `reproductions` (values a client sends for them are ignored): `verified` once a
    reproduction agrees, `disputed` while reproductions exist and none agrees.
    """

    id: int | None = None
    version: str = ""
    model: str
    mean_reward: float
    pass_at_k: dict[str, float] = {}
    n: int = Field(description="number of scored rollouts")
    num_examples: int = 0
    rollouts_per_example: int = 0
    date: str = Field(default_factory=utc_now)
    submitted_by: str = ""
    metadata: dict = {}
    rollouts: list[dict] = Field(
        [], max_length=MAX_ROLLOUT_SAMPLE, description="a sample of the run's rollouts"
    )
    status: EvalStatus = "claimed"
    reproductions: list[ReproductionRecord] = []


class EnvSummary(BaseModel):
    """A row of the environment list."""

    owner: str
    name: str
    summary: str = ""
    tags: list[str] = []
    latest_version: str = ""
    visibility: Visibility = "public"


class EnvCard(EnvSummary):
    """Everything the hub knows about one environment."""

    readme: str = ""
    readme_content_type: str = "text/markdown"
    license: str = ""
    versions: list[VersionRecord] = []
    evals: list[EvalRecord] = []

    def get_version(self, version: str | None) -> VersionRecord | None:
        """The given version, or the latest one when `version` is None."""
        wanted = version or self.latest_version
        return next((v for v in self.versions if v.version == wanted), None)

    @property
    def latest_audit(self) -> AuditRecord | None:
        """The latest version's audit (None: that version was not audited)."""
        latest = self.get_version(None)
        return latest.audit if latest else None
