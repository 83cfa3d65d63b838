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


def test_serve_takes_other_nodes_services_and_a_fixed_port_beyond_loopback() -> None:
    """`[sandbox] serve` with `service_urls`: the run's own service plus other nodes' (the run's
    token, so no token_file); the client is pointed at them once the own one is up, not at load.
    A service on another interface needs a port other nodes can name."""
    from rlkit.launch.roles import Role
    from rlkit.sandbox.config import SandboxConfig
    from rlkit.sandbox.runner import SandboxSettings

    config = SandboxConfig(serve=True, service_urls=["http://node2:8790"])
    assert config.settings(SandboxSettings()).url is None
    with pytest.raises(ValueError, match="token_file"):
        SandboxConfig(serve=True, service_urls=["http://node2:8790"], token_file="/x")
    with pytest.raises(ValueError, match="serve_port"):
        SandboxConfig(serve=True, serve_host="0.0.0.0")
    SandboxConfig(serve=True, serve_host="0.0.0.0", serve_port=8790)
    assert Role.SANDBOX.starts_sandbox_service and Role.INFERENCE.starts_sandbox_service
    assert not Role.TRAINER.starts_sandbox_service


@pytest.mark.skipif(os.geteuid() != 0, reason="a uid per sandbox needs root (README)")
def test_a_sandbox_uid_is_held_while_its_holder_lives_and_leaves_nothing() -> None:
    """Each uid was held by a lock file that a SIGKILLed service left behind (one per sandbox it
    held); the abstract socket's name goes with its holder, and two holders never share one."""
    import signal
    import socket
    import subprocess
    import sys

    from rlkit.sandbox.launch import UID_BASE, SandboxUid, uid_lock_name

    held = [SandboxUid() for _ in range(3)]
    uids = [h.uid for h in held]
    assert len(set(uids)) == 3 and all(u is not None and u >= UID_BASE for u in uids)
    probe = socket.socket(socket.AF_UNIX)
    with pytest.raises(OSError):
        probe.bind(uid_lock_name(uids[0]))
    held[0].release()
    probe.bind(uid_lock_name(uids[0]))  # free again once released
    probe.close()
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from rlkit.sandbox.launch import SandboxUid; import sys, time; "
            "print(SandboxUid().uid, flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    uid = int(child.stdout.readline())
    child.send_signal(signal.SIGKILL)
    child.wait()
    probe = socket.socket(socket.AF_UNIX)
    probe.bind(uid_lock_name(uid))  # the killed holder's uid is free, nothing to clean up
    probe.close()
    for h in held[1:]:
        h.release()
