"""Wire and storage records of the hub: the environment card and its parts.

The same pydantic models are the JSON API's responses, the local directory hub's on-disk
records and what the CLI prints, so both hub kinds look identical to their users.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, Field

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


class VersionRecord(BaseModel):
    version: str
    files: list[FileRecord] = []
    created: str = Field(default_factory=utc_now)


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
