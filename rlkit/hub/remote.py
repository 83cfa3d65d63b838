"""Client of a hub server over HTTP: the JSON API for cards and evaluations, twine for uploads
(the standard legacy upload API) and plain downloads whose sha256 is checked against the card.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import httpx

from rlkit.hub.artifacts import ArtifactError, inspect_artifact
from rlkit.hub.base import HubError
from rlkit.hub.names import EnvRef
from rlkit.hub.records import EnvCard, EnvSummary, EvalRecord, FileRecord, Visibility


class RemoteHub:
    """A hub server at `url`; `token` authenticates pushes and private reads."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 120.0) -> None:
        self.url = url.rstrip("/")
        self.location = self.url
        self.token = token
        self.timeout = timeout

    def _client(self) -> httpx.Client:
        auth = httpx.BasicAuth("__token__", self.token) if self.token else None
        return httpx.Client(base_url=self.url, auth=auth, timeout=self.timeout)

    def _request(self, method: str, path: str, **kwargs) -> httpx.Response:
        try:
            with self._client() as client:
                response = client.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise HubError(f"cannot reach hub {self.url}: {exc}", 503) from exc
        if response.status_code >= 400:
            try:
                detail = response.json().get("detail", response.text)
            except ValueError:
                detail = response.text
            raise HubError(f"hub {self.url}: {response.status_code} {detail}", response.status_code)
        return response

    def whoami(self) -> str:
        if not self.token:
            raise HubError("no API token: set RLKIT_HUB_TOKEN or pass --token", 401)
        return self._request("GET", "/api/v1/whoami").json()["owner"]

    def push(
        self, files: list[Path], owner: str | None = None, visibility: Visibility | None = None
    ) -> EnvCard:
        from requests.exceptions import HTTPError
        from twine.commands.upload import upload
        from twine.exceptions import TwineException
        from twine.settings import Settings

        try:
            infos = [inspect_artifact(Path(p).read_bytes(), Path(p).name) for p in files]
        except ArtifactError as exc:
            raise HubError(str(exc), 400) from exc
        if not infos or len({(i.name, i.version) for i in infos}) != 1:
            raise HubError("push needs files of exactly one name and version", 400)
        me = self.whoami()
        owner = owner or me
        if owner != me:
            raise HubError(f"token belongs to {me}; it cannot push into namespace {owner}", 403)
        ref = EnvRef(owner, infos[0].name, infos[0].version)
        files = self._missing(ref, [Path(p) for p in files], {i.filename: i.sha256 for i in infos})
        if visibility:
            self._request(
                "PUT", f"/api/v1/envs/{owner}/{ref.name}", json={"visibility": visibility}
            )
        settings = Settings(
            repository_url=f"{self.url}/legacy/",
            username="__token__",
            password=self.token,
            non_interactive=True,
            disable_progress_bar=True,
        )
        try:
            upload(settings, [str(p) for p in files])
        except HTTPError as exc:
            status = exc.response.status_code if exc.response is not None else 400
            detail = exc.response.text if exc.response is not None else str(exc)
            raise HubError(f"upload refused: {status} {detail}", status) from exc
        except TwineException as exc:
            raise HubError(f"upload failed: {exc}", 400) from exc
        return self.card(ref)

    def _missing(self, ref: EnvRef, files: list[Path], sha256: dict[str, str]) -> list[Path]:
        """Files not yet on the hub, so an interrupted push can be completed; a version whose
        files are all there, or that holds different bytes under a name, is refused (409)."""
        try:
            release = self.card(ref).get_version(ref.version)
        except HubError as exc:
            if exc.status != 404:
                raise
            return files
        present = {f.filename: f.sha256 for f in release.files} if release else {}
        if any(present.get(p.name, sha256[p.name]) != sha256[p.name] for p in files):
            raise HubError(f"{ref} is already published with different files (immutable)", 409)
        missing = [p for p in files if p.name not in present]
        if not missing:
            raise HubError(f"{ref} is already published (versions are immutable)", 409)
        return missing

    def card(self, ref: EnvRef) -> EnvCard:
        response = self._request("GET", f"/api/v1/envs/{ref.owner}/{ref.name}")
        return EnvCard.model_validate(response.json())

    def search(self, query: str = "", tag: str | None = None) -> list[EnvSummary]:
        params = {"q": query} | ({"tag": tag} if tag else {})
        rows = self._request("GET", "/api/v1/envs", params=params).json()
        return [EnvSummary.model_validate(r) for r in rows]

    def download(self, ref: EnvRef, file: FileRecord, dest_dir: Path) -> Path:
        dest = Path(dest_dir) / file.filename
        digest = hashlib.sha256()
        try:
            with (
                self._client() as client,
                client.stream("GET", f"/files/{ref.name}/{quote(file.filename)}") as response,
            ):
                if response.status_code >= 400:
                    raise HubError(
                        f"download of {file.filename} failed: {response.status_code}",
                        response.status_code,
                    )
                with dest.open("wb") as out:
                    for chunk in response.iter_bytes():
                        digest.update(chunk)
                        out.write(chunk)
        except httpx.HTTPError as exc:
            raise HubError(f"download of {file.filename} failed: {exc}", 503) from exc
        if digest.hexdigest() != file.sha256:
            dest.unlink()
            raise HubError(f"sha256 mismatch for {file.filename}: the artifact was altered", 400)
        return dest

    def add_eval(self, ref: EnvRef, version: str, record: EvalRecord) -> EvalRecord:
        if not self.token:
            raise HubError("no API token: set RLKIT_HUB_TOKEN or pass --token", 401)
        response = self._request(
            "POST",
            f"/api/v1/envs/{ref.owner}/{ref.name}/{version}/evals",
            json=record.model_dump(mode="json"),
        )
        return EvalRecord.model_validate(response.json())

    def index_url(self) -> str:
        """The simple index, with the token as basic-auth credentials when there is one."""
        parts = urlsplit(f"{self.url}/simple/")
        if self.token:
            netloc = f"__token__:{quote(self.token, safe='')}@{parts.netloc}"
            parts = parts._replace(netloc=netloc)
        return urlunsplit(parts)
