"""The sandbox service's own rules (`rlkit.sandbox.service.build_app`), without a sandbox: every
route but /health needs a token, and no route is the owner's alone: a tenant reads /metrics."""

from __future__ import annotations

from typing import Any

from starlette.testclient import TestClient

from rlkit.sandbox.service import ServiceSettings, build_app
from rlkit.serving import Credentials

OWNER, ALICE = "o" * 32, "a" * 32


class CountingService:
    """What the routes ask of a `SandboxService` here: its settings and its counts."""

    config = ServiceSettings()

    def metrics(self) -> dict[str, Any]:
        return {"runs": 3}

    async def run(self, request: Any) -> dict[str, Any]:
        raise AssertionError("a refused request never runs")


def client() -> TestClient:
    app = build_app(CountingService(), Credentials(OWNER, {"alice": ALICE}))  # type: ignore[arg-type]
    return TestClient(app)


def test_a_tenant_reads_the_services_metrics() -> None:
    service = client()
    for token in (OWNER, ALICE):
        resp = service.get("/metrics", headers={"Authorization": f"Bearer {token}"})
        assert (resp.status_code, resp.json()) == (200, {"runs": 3})


def test_only_health_is_open_and_refusals_have_one_body() -> None:
    service = client()
    assert service.get("/health").json() == {"ok": True}
    no_token = service.get("/metrics")
    assert no_token.status_code == 401 and "no credential" in no_token.json()["error"]
    wrong = service.get("/metrics", headers={"Authorization": "Bearer " + "x" * 32})
    assert wrong.status_code == 403
    assert service.get("/ping").status_code == 401  # inference's liveness route is not ours
    big = "x" * (ServiceSettings().max_request_bytes + 1)
    refused = service.post("/run", content=big, headers={"Authorization": f"Bearer {ALICE}"})
    assert refused.status_code == 413 and list(refused.json()) == ["error"]


def test_the_sandbox_service_loads_nothing_of_rlkit_inference() -> None:
    """Issue 62: the sandbox service states its own rules; importing it (a fresh interpreter)
    loads no module of rlkit.inference."""
    import subprocess
    import sys

    code = (
        "import sys, rlkit.sandbox.service; "
        "print(sorted(m for m in sys.modules if m.startswith('rlkit.inference')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
