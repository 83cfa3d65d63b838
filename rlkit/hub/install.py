"""Installing and pulling environments from a hub, trusting no file name or hash it serves;
installing them from the package index.

Every file name from a card is checked with the server's own rule (a bare wheel/sdist name), the
card's sha256 must equal the one the hub's simple index lists (its PEP 503 ``#sha256=``
fragment), and the download (into a private 0700 temp dir) must match it before pip or tar sees
it. Pull unpacks the sdist after the same checks.

Dependency confusion: pip installs the environment with the hub as its only index
(``--index-url``, with pip's own configuration and ``PIP_*`` variables shut out), so a package the
hub publishes can only ever come from the hub. Dependencies the hub does not publish come from
pip's configured (public) index only when the user allows it (``--public-deps``,
``$RLKIT_HUB_PUBLIC_DEPS=1`` or ``[hub] public_dependencies = true``): they are resolved first,
the resolution is refused if it contains any name the hub publishes, and exactly the resolved
files (pinned by hash) are installed before the environment itself.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

from rlkit.hub.artifacts import ArtifactError, inspect_artifact
from rlkit.hub.base import Hub, HubError, download_path
from rlkit.hub.client import hub_config, open_hub
from rlkit.hub.names import EnvRef, normalize, parse_env_id
from rlkit.hub.records import EnvCard, FileRecord, VersionRecord


def _release(card: EnvCard, ref: EnvRef) -> VersionRecord:
    release = card.get_version(ref.version)
    if release is None:
        known = ", ".join(v.version for v in card.versions) or "none"
        raise HubError(
            f"{ref.owner}/{ref.name} has no version {ref.version} (versions: {known})", 404
        )
    return release


def _file(release: VersionRecord, packagetype: str, ref: EnvRef) -> FileRecord:
    for file in release.files:
        download_path(Path("."), file.filename)  # a card with one unsafe name is refused whole
    for file in release.files:
        if file.packagetype == packagetype:
            return file
    raise HubError(f"{ref.owner}/{ref.name}@{release.version} has no {packagetype} file", 404)


def verified_download(hub: Hub, ref: EnvRef, file: FileRecord, dest_dir: Path) -> Path:
    """Download `file` into `dest_dir` after checking the card's hash against the index's."""
    listed = (hub.index_hashes(ref.name) or {}).get(file.filename)
    if listed != file.sha256:
        raise HubError(
            f"{file.filename}: the hub's index lists sha256 {listed} but its card says "
            f"{file.sha256}; refusing a file the hub does not vouch for consistently",
            400,
        )
    return hub.download(ref, file, dest_dir)


def public_deps_allowed(flag: bool | None = None) -> bool:
    """Whether dependencies may come from the public index: the flag, else
    ``$RLKIT_HUB_PUBLIC_DEPS``, else ``[hub] public_dependencies``; off by default."""
    if flag is not None:
        return flag
    env = os.environ.get("RLKIT_HUB_PUBLIC_DEPS")
    if env is not None:
        return env.strip().lower() in ("1", "true", "yes")
    value = hub_config().get("public_dependencies", False)
    if not isinstance(value, bool):
        raise HubError("[hub] public_dependencies must be true or false", 400)
    return value


def _pip(python: str, args: list[str], env: dict[str, str] | None = None) -> str:
    """Run pip; HubError with the tail of its output when it fails."""
    cmd = [python, "-m", "pip", *args, "--disable-pip-version-check", "--no-input"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise HubError(f"pip {args[0]} failed:\n{tail}")
    return proc.stdout


def _hub_only_env() -> dict[str, str]:
    """The environment for pip runs that must see the hub and nothing else: no pip config
    file, no ``PIP_*`` variable (an ``extra-index-url`` there would reopen the public index)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    return env | {"PIP_CONFIG_FILE": os.devnull}


def _requirements(wheel: Path) -> list[Requirement]:
    """The wheel's own dependencies that apply on this platform."""
    try:
        info = inspect_artifact(wheel.read_bytes(), wheel.name)
        reqs = [Requirement(r) for r in info.requires_dist]
    except (ArtifactError, InvalidRequirement) as exc:
        raise HubError(f"{wheel.name}: unreadable dependencies: {exc}", 400) from exc
    return [r for r in reqs if r.marker is None or r.marker.evaluate({"extra": ""})]


def is_verifiers_env(reqs: list[Requirement]) -> bool:
    """A package requiring verifiers: installed without dependencies (never beside rlkit)."""
    return any(normalize(r.name) == "verifiers" for r in reqs)


def _install_verifiers_env(python: str, path: Path, env: dict[str, str] | None) -> None:
    """A package requiring verifiers goes in without its dependencies: it runs in a bridge
    venv (`rlkit.envs.bridge`) that gets verifiers and the rest of its requirements, and
    verifiers never lands beside rlkit."""
    _pip(python, ["install", "--no-deps", str(path)], env)
    importlib.invalidate_caches()


def _install_public(python: str, reqs: list[Requirement], hub_names: set[str], tmp: Path) -> None:
    """Install `reqs` (none of them a hub name) from pip's configured index, refusing a
    resolution that would bring in any package the hub publishes."""
    report = tmp / "public-report.json"
    _pip(python, ["install", "--dry-run", "--quiet", "--report", str(report), *map(str, reqs)])
    items = json.loads(report.read_text()).get("install", [])
    clash = sorted({normalize(i["metadata"]["name"]) for i in items} & hub_names)
    if clash:
        raise HubError(
            f"refusing: the public index would supply {', '.join(clash)}, which the hub "
            "publishes (dependency confusion); nothing was installed",
            400,
        )
    pins = []
    for item in items:
        meta, archive = item["metadata"], item["download_info"].get("archive_info", {})
        digest = archive.get("hashes", {}).get("sha256")
        if not digest:
            raise HubError(f"the public index gave no sha256 for {meta['name']}", 400)
        pins.append(f"{meta['name']}=={meta['version']} --hash=sha256:{digest}")
    if pins:
        pinned = tmp / "public-pins.txt"
        pinned.write_text("\n".join(pins) + "\n")
        _pip(python, ["install", "--no-deps", "--require-hashes", "-r", str(pinned)])


def install(
    env_id: str,
    hub: Hub | None = None,
    python: str | None = None,
    public_deps: bool | None = None,
) -> str:
    """pip-install ``OWNER/NAME[@VERSION]`` into `python` (default: this interpreter), with
    the hub as the only index for hub packages (see the module docstring). Returns the
    installed version."""
    ref = parse_env_id(env_id)
    hub = hub or open_hub()
    python = python or sys.executable
    release = _release(hub.card(ref), ref)
    wheel = _file(release, "bdist_wheel", ref)
    with tempfile.TemporaryDirectory(prefix="rlkit-install-") as tmp:
        path = verified_download(hub, ref, wheel, Path(tmp))
        reqs = _requirements(path)
        if is_verifiers_env(reqs):
            _install_verifiers_env(python, path, _hub_only_env())
            return release.version
        hub_names = hub.index_projects()
        public = [r for r in reqs if normalize(r.name) not in hub_names]
        if public and public_deps_allowed(public_deps):
            _install_public(python, public, hub_names, Path(tmp))
        try:
            _pip(python, ["install", "--index-url", hub.index_url(), str(path)], _hub_only_env())
        except HubError as exc:
            hint = ""
            if public and not public_deps_allowed(public_deps):
                names = ", ".join(sorted(r.name for r in public))
                hint = (
                    f"\n{names}: not on the hub; allow the public index for dependencies with "
                    "--public-deps (or RLKIT_HUB_PUBLIC_DEPS=1)"
                )
            raise HubError(
                f"could not install {ref.owner}/{ref.name}@{release.version}: {exc}{hint}"
            ) from exc
    importlib.invalidate_caches()
    return release.version


def pull(env_id: str, dest: Path, hub: Hub | None = None) -> Path:
    """Unpack the sdist of ``OWNER/NAME[@VERSION]`` into `dest`; returns the source folder."""
    ref = parse_env_id(env_id)
    hub = hub or open_hub()
    release = _release(hub.card(ref), ref)
    sdist = _file(release, "sdist", ref)
    top = Path(dest) / sdist.filename.removesuffix(".tar.gz")
    if top.exists():
        raise HubError(f"{top} already exists", 409)
    Path(dest).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".rlkit-pull-", dir=dest) as tmp:
        archive = verified_download(hub, ref, sdist, Path(tmp))
        with tarfile.open(archive, "r:gz") as tar:
            tar.extractall(Path(tmp) / "src", filter="data")
        (Path(tmp) / "src" / top.name).rename(top)
    return top


def ensure_installed(env_id: str, hub: str | None = None) -> None:
    """Install ``OWNER/NAME[@VERSION]`` unless that distribution (and version) is present.

    Used by `rlkit.envs.load_environment` for hub ids that are not importable yet.
    """
    ref = parse_env_id(env_id)
    try:
        present = importlib.metadata.version(ref.name)
    except importlib.metadata.PackageNotFoundError:
        present = None
    if present is not None and (ref.version is None or present == ref.version):
        return
    install(env_id, open_hub(hub))


def download_from_index(
    name: str, version: str | None, dest: Path, find_links: Path | None = None
) -> Path:
    """The wheel (or sdist) of package-index project `name` (==`version`), without its
    dependencies, downloaded into the empty folder `dest`; `find_links`: from that folder."""
    source = ["--no-index", "--find-links", str(find_links)] if find_links else []
    wanted = f"{name}=={version}" if version else name
    try:
        _pip(
            sys.executable,
            ["download", "--no-deps", "--prefer-binary", "-d", str(dest), *source, wanted],
        )
    except HubError as exc:
        where = f"in {find_links}" if find_links else "on the package index"
        raise HubError(f"could not fetch {wanted} {where}: {exc}", 404) from exc
    (path,) = dest.iterdir()
    return path


def install_from_index(
    name: str, version: str | None = None, python: str | None = None, find_links: Path | None = None
) -> str:
    """pip-install the package-index project `name` (==`version`) into `python` (default: this
    interpreter); a verifiers environment the same way a hub one is (without its
    dependencies). `find_links`: a folder of wheels/sdists to install from instead of the
    index (offline). Returns the installed version."""
    python = python or sys.executable
    source = ["--no-index", "--find-links", str(find_links)] if find_links else []
    with tempfile.TemporaryDirectory(prefix="rlkit-install-") as tmp:
        path = download_from_index(name, version, Path(tmp), find_links)
        if is_verifiers_env(_requirements(path)):
            _install_verifiers_env(python, path, None)
        else:
            _pip(python, ["install", *source, str(path)])
            importlib.invalidate_caches()
        return inspect_artifact(path.read_bytes(), path.name).version
