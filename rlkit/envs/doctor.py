"""`rlkit env doctor`: will this verifiers environment run here? One command, one verdict.

The package comes from a local folder, an installed distribution or environment folder, or else
the package index (`NAME[@VERSION][:module]`, fetched without its dependencies into a scratch
folder that is deleted afterwards: nothing is installed beside rlkit). The doctor reads which
verifiers the package requires (also from an extra), which era and exact version the bridge
picks, and where its entry point is; builds the bridge venv (cached like any bridge venv), loads
the environment in a worker, and plays scripted replies (empty, garbage, and the gold replies
rows carry in `info["gold_completion"]`) through verifiers' own rollout loop and rubric. Each
stage is reported as it finishes; the first failing stage ends the run.
"""

from __future__ import annotations

import tarfile
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlkit.envs.bridge.source import VfSource, from_folder, from_unpacked_wheel
from rlkit.envs.bridge.versions import era_of, select_version
from rlkit.envs.check import check_environment_async
from rlkit.envs.resolve import module_names, resolve_env_id
from rlkit.errors import UsageError
from rlkit.hub.base import HubError
from rlkit.hub.names import parse_env_id


@dataclass
class Finding:
    stage: str
    ok: bool
    detail: str


def _fetched(name: str, version: str | None, scratch: Path, find_links: Path | None) -> Path:
    """The package from the index unpacked under `scratch`: a wheel's files, or an sdist's
    top folder."""
    from rlkit.hub.install import download_from_index

    (scratch / "download").mkdir()
    path = download_from_index(name, version, scratch / "download", find_links)
    unpacked = scratch / "unpacked"
    if path.name.endswith(".whl"):
        with zipfile.ZipFile(path) as wheel:
            wheel.extractall(unpacked)
        return unpacked
    with tarfile.open(path) as sdist:
        sdist.extractall(unpacked, filter="data")
    (top,) = unpacked.iterdir()
    return top


def _locate(env_id: str, scratch: Path, find_links: Path | None) -> tuple[VfSource | None, str]:
    """(the package's verifiers source or None, where the package was found): what
    `resolve_env_id` finds here, else the package fetched from the index."""
    try:
        resolved = resolve_env_id(env_id)
    except UsageError:  # not installed or local: fetched below
        resolved = None
    if resolved is not None:
        return resolved.bridge, resolved.describe()
    ref = parse_env_id(env_id, require_owner=False)
    candidates = [ref.module] if ref.module else module_names(ref.name)
    explicit = ref.module is not None
    where = f"folder {find_links}" if find_links else "package index"
    try:
        root = _fetched(ref.name, ref.version, scratch, find_links)
    except HubError as exc:
        raise UsageError(f"{ref.name!r} is not installed or local, and {exc}") from exc
    if root.name == "unpacked":
        source = from_unpacked_wheel(root, ref.name, candidates, explicit)
        return source, f"wheel from the {where} (unpacked in a scratch folder)"
    source = from_folder(root, ref.name, candidates, explicit)
    return source, f"sdist {root.name} from the {where} (unpacked in a scratch folder)"


async def _rollouts(env: Any, num_rows: int, report: Callable[[Finding], None]) -> bool:
    """Scripted replies through the worker: a stage fails when a rollout does not run; a
    reward other than `rlkit env check` expects (the minimum for empty and garbage replies,
    the maximum for gold ones) is reported, not failed (the rubric's design, not the bridge)."""
    rows = env.get_eval_dataset(num_rows)
    gold = any((row.get("info") or {}).get("gold_completion") for row in rows)
    checked = await check_environment_async(env, num_rows=num_rows, gold=gold)
    ok = True
    for kind in checked.summary():
        cases = [c for c in checked.cases if c.kind == kind]
        broken = [c for c in cases if c.problem and not c.problem.startswith("reward ")]
        off = [c for c in cases if c.problem and c.problem.startswith("reward ")]
        detail = f"{len(cases) - len(broken)}/{len(cases)} ran"
        detail += (
            f", {len(cases) - len(broken) - len(off)} scored the expected {cases[0].expected:g}"
        )
        first = (broken or off or [None])[0]
        if first is not None:
            detail += f"; row {first.example_id}: {first.problem}"
        if off and not broken:
            detail += " (the rubric's design; `rlkit env check` fails it)"
        report(Finding(f"scripted {kind} replies", not broken, detail))
        ok = ok and not broken
    if not gold:
        report(Finding("gold replies", True, "none: no row has info['gold_completion']"))
    return ok


def doctor(
    env_id: str,
    report: Callable[[Finding], None],
    *,
    verifiers_version: str | None = None,
    env_args: dict[str, Any] | None = None,
    num_rows: int = 3,
    find_links: Path | None = None,
) -> bool:
    """Run every stage (see the module docstring), reporting each; True when all pass."""
    import asyncio

    from rlkit.envs.bridge.env import BridgeEnv

    with tempfile.TemporaryDirectory(prefix="rlkit-doctor-") as tmp:
        try:
            source, where = _locate(env_id, Path(tmp), find_links)
        except UsageError as exc:
            report(Finding("package", False, str(exc)))
            return False
        report(Finding("package", True, where))
        if source is None:
            detail = (
                "declares no verifiers requirement (base or extra): not a verifiers package; "
                f"an rlkit environment needs no bridge: rlkit env check {env_id} --gold"
            )
            report(Finding("verifiers requirement", False, detail))
            return False
        report(Finding("verifiers requirement", True, f"verifiers{source.verifiers_spec or ''}"))
        try:
            version = select_version(
                source.name, source.verifiers_spec, verifiers_version, api=source.api
            )
        except UsageError as exc:
            report(Finding("era", False, str(exc)))
            return False
        era = era_of(version)
        report(Finding("era", True, f"{era.name if era else '?'}: runs with verifiers {version}"))
        entry = "load_environment" if source.api == "load_environment" else "a Taskset (__all__)"
        report(Finding("entry point", True, f"module {source.module}: {entry}"))
        try:
            env = BridgeEnv(source, dict(env_args or {}), verifiers_version)
        except UsageError as exc:
            report(Finding("load", False, str(exc)))
            return False
        try:
            d = env.description
            sizes = ", ".join(f"{split} {n}" for split, n in (d.get("splits") or {}).items())
            turns = "multi-turn" if d.get("multi_turn") else "single-turn"
            report(Finding("load", True, f"{d.get('env_class')} ({turns}); rows: {sizes}"))
            return asyncio.run(_rollouts(env, num_rows, report))
        finally:
            env.close()
