"""Client of a hub server over HTTP: the JSON API for cards and evaluations, twine for uploads
(the standard legacy upload API) and plain downloads whose sha256 is checked against the card.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import httpx

from rlkit.hub.artifacts import ArtifactError, ArtifactInfo, inspect_artifact
from rlkit.hub.base import HubError, download_path
from rlkit.hub.names import EnvRef, normalize
from rlkit.hub.publishing import files_to_add
from rlkit.hub.records import (
    AuditRecord,
    EnvCard,
    EnvSummary,
    EvalRecord,
    FileRecord,
    ReproductionRecord,
    Visibility,
)
from rlkit.hub.simple import JSON_TYPE, hashes_from_project_page


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
                detail = response.json().get("error", response.text)
            except ValueError:
                detail = response.text
            raise HubError(f"hub {self.url}: {response.status_code} {detail}", response.status_code)
        return response

    def whoami(self) -> str:
        if not self.token:
            raise HubError("no API token: set RLKIT_HUB_TOKEN or pass --token", 401)
        return self._request("GET", "/api/v1/whoami").json()["owner"]

    def push(
        self,
        files: list[Path],
        owner: str | None = None,
        visibility: Visibility | None = None,
        audit: AuditRecord | None = None,
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
        files = self._missing(ref, [Path(p) for p in files], infos)
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
        if audit is not None:
            try:
                self.set_audit(ref, infos[0].version, audit)
            except HubError as exc:  # the files are published; say so
                raise HubError(
                    f"published {ref}, but the hub did not record its audit: {exc}", exc.status
                ) from exc
        return self.card(ref)

    def set_audit(self, ref: EnvRef, version: str, audit: AuditRecord) -> AuditRecord:
        """Attach `audit` to a published version (the owner's token; once per version)."""
        path = f"/api/v1/envs/{ref.owner}/{ref.name}/{version}/audit"
        return AuditRecord.model_validate(self._post(path, audit.model_dump(mode="json")))

    def _missing(self, ref: EnvRef, files: list[Path], infos: list[ArtifactInfo]) -> list[Path]:
        """Files not yet on the hub, so an interrupted push can be completed; what the
        publishing rules refuse (`rlkit.hub.publishing`) fails here, before any upload."""
        try:
            release = self.card(ref).get_version(ref.version)
        except HubError as exc:
            if exc.status != 404:
                raise
            release = None
        new = {i.filename for i in files_to_add(str(ref), release.files if release else [], infos)}
        return [p for p in files if p.name in new]

    def card(self, ref: EnvRef) -> EnvCard:
        response = self._request("GET", f"/api/v1/envs/{ref.owner}/{ref.name}")
        return EnvCard.model_validate(response.json())

    def search(self, query: str = "", tag: str | None = None) -> list[EnvSummary]:
        params = {"q": query} | ({"tag": tag} if tag else {})
        rows = self._request("GET", "/api/v1/envs", params=params).json()
        return [EnvSummary.model_validate(r) for r in rows]

    def download(self, ref: EnvRef, file: FileRecord, dest_dir: Path) -> Path:
        dest = download_path(dest_dir, file.filename)
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
        path = f"/api/v1/envs/{ref.owner}/{ref.name}/{version}/evals"
        return EvalRecord.model_validate(self._post(path, record.model_dump(mode="json")))

    def add_reproduction(
        self, ref: EnvRef, version: str, eval_id: int, record: ReproductionRecord
    ) -> EvalRecord:
        path = f"/api/v1/envs/{ref.owner}/{ref.name}/{version}/evals/{eval_id}/reproductions"
        fields = {"model", "mean_reward", "n", "date", "metadata"}
        body = record.model_dump(mode="json", include=fields)
        return EvalRecord.model_validate(self._post(path, body))

    def _post(self, path: str, body: dict) -> object:
        """POST a JSON record as the token's owner; the hub's JSON answer."""
        if not self.token:
            raise HubError("no API token: set RLKIT_HUB_TOKEN or pass --token", 401)
        return self._request("POST", path, json=body).json()

    def index_hashes(self, name: str) -> dict[str, str] | None:
        try:
            page = self._request("GET", f"/simple/{name}/", headers={"Accept": "text/html"})
        except HubError as exc:
            if exc.status == 404:
                return None
            raise
        return hashes_from_project_page(page.text)

    def index_projects(self) -> set[str]:
        page = self._request("GET", "/simple/", headers={"Accept": JSON_TYPE})
        try:
            return {normalize(p["name"]) for p in page.json()["projects"]}
        except (ValueError, KeyError, TypeError) as exc:
            raise HubError(f"hub {self.url}: /simple/ is not a PEP 691 project list", 502) from exc

    def index_url(self) -> str:
        """The simple index, with the token as basic-auth credentials when there is one."""
        parts = urlsplit(f"{self.url}/simple/")
        if self.token:
            netloc = f"__token__:{quote(self.token, safe='')}@{parts.netloc}"
            parts = parts._replace(netloc=netloc)
        return urlunsplit(parts)
