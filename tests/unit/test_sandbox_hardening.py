"""Parts of issue 64's hardening that need no sandbox: token files owned by the caller, file
names refused before any sandbox is taken, tmpfs sizes inside the total memory cap."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rlkit.errors import UsageError
from rlkit.protocol.credentials import read_token, write_token_file
from rlkit.sandbox.launch import check_names
from rlkit.sandbox.limits import SCRATCH_MB, Limits


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_token_file_another_user_owns_is_refused(tmp_path: Path) -> None:
    planted = tmp_path / "token"
    write_token_file(planted)
    assert read_token(planted)
    os.chown(planted, 12345, 12345)  # mode 0600 still: only the owner check refuses it
    with pytest.raises(UsageError, match="belongs to uid 12345"):
        read_token(planted)


@pytest.mark.parametrize(
    "name", ["../x", "/etc/passwd", "", ".", "a\x00b", "x" * 2000, "a/" + "b" * 300]
)
def test_bad_file_names_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="relative path inside the workdir"):
        check_names({name: b""})


def test_tmpfs_mounts_come_out_of_the_total_memory_cap() -> None:
    limits = Limits(timeout=1, memory_mb=256, total_memory_mb=1024)
    assert (limits.nproc - 1) * 256 + SCRATCH_MB <= 1024
    with pytest.raises(ValueError, match="tmpfs"):
        Limits(timeout=1, memory_mb=1024, total_memory_mb=1024)


def test_service_urls_reach_the_client_which_picks_the_least_loaded(tmp_path: Path) -> None:
    from rlkit.sandbox.client import SandboxClient
    from rlkit.sandbox.config import SandboxConfig
    from rlkit.sandbox.runner import SandboxSettings

    token = tmp_path / "token"
    write_token_file(token)
    urls = ["http://a:8790", "http://b:8790/"]
    config = SandboxConfig(service_urls=urls, token_file=str(token))
    made = config.settings(SandboxSettings())
    assert made.url == "http://a:8790,http://b:8790/" and made.token_file == str(token)
    with pytest.raises(ValueError, match="not both"):
        SandboxConfig(url="http://a:8790", service_urls=urls, token_file=str(token))
    with pytest.raises(ValueError, match="token_file is required"):
        SandboxConfig(service_urls=urls)
    client = SandboxClient(made.url, str(token))
    assert client.urls == ["http://a:8790", "http://b:8790"]
    client.in_flight["http://a:8790"] = 3
    assert client.ranked()[0] == "http://b:8790"
    client._down_until["http://b:8790"] = float("inf")  # failed just now: passed over
    assert client.ranked() == ["http://a:8790", "http://b:8790"]
