"""Installing and pulling environments from a hub, trusting no file name or hash it serves.

Every file name from a card is checked with the server's own rule (a bare wheel/sdist name), the
card's sha256 must equal the one the hub's simple index lists, and the download (into a private
temp dir) must match it before pip or tar sees it. Dependencies resolve from pip's configured
index plus the hub's simple index (``--extra-index-url``), so a same-named package on the public
index can still win (dependency confusion: not fixed yet). Pull unpacks the sdist after the
same checks.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from rlkit.hub.base import Hub, HubError, download_path
from rlkit.hub.client import open_hub
from rlkit.hub.names import EnvRef, parse_env_id
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


def install(env_id: str, hub: Hub | None = None, python: str | None = None) -> str:
    """pip-install ``OWNER/NAME[@VERSION]`` into `python` (default: this interpreter).

    Returns the installed version.
    """
    ref = parse_env_id(env_id)
    hub = hub or open_hub()
    release = _release(hub.card(ref), ref)
    wheel = _file(release, "bdist_wheel", ref)
    with tempfile.TemporaryDirectory(prefix="rlkit-install-") as tmp:
        path = verified_download(hub, ref, wheel, Path(tmp))
        cmd = [
            python or sys.executable,
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "--no-input",
            "--extra-index-url",
            hub.index_url(),
            str(path),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise HubError(f"pip could not install {ref.owner}/{ref.name}@{release.version}:\n{tail}")
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
