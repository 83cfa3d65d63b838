"""A run's credential (`rlkit.protocol.credentials`): private files, derived signing keys."""

from __future__ import annotations

import hashlib
import hmac
import os
import threading
from pathlib import Path

import pytest

from rlkit.errors import UsageError
from rlkit.protocol import credentials


def test_a_token_file_is_created_private_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "run" / "token"
    token = credentials.write_token_file(path)
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert credentials.read_token(path) == token and len(token) >= 40
    with pytest.raises(FileExistsError):
        credentials.write_token_file(path)


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620, 0o606])
def test_a_file_others_can_reach_is_refused(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "token"
    credentials.write_token_file(path)
    path.chmod(mode)
    with pytest.raises(UsageError, match="other users.*chmod 600"):
        credentials.read_token(path)


def test_missing_and_empty_files_are_usage_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="not found"):
        credentials.read_token(tmp_path / "nope")
    empty = tmp_path / "empty"
    empty.touch(mode=0o600)
    with pytest.raises(UsageError, match="holds no token"):
        credentials.read_token(empty)


def test_racing_processes_share_one_token(tmp_path: Path) -> None:
    """No racer reads the file between its creation and its token (it did, under load)."""
    for i in range(50):
        path, seen = tmp_path / f"token-{i}", []
        threads = [
            threading.Thread(
                target=lambda p=path, s=seen: s.append(credentials.ensure_token_file(p))
            )
            for _ in range(8)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(set(seen)) == 1 and len(seen) == 8
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_token_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(credentials.TOKEN_FILE_ENV, raising=False)
    assert credentials.token_from_env() is None
    token = credentials.write_token_file(tmp_path / "t")
    monkeypatch.setenv(credentials.TOKEN_FILE_ENV, str(tmp_path / "t"))
    assert credentials.token_from_env() == token


def test_signatures_need_the_same_token_and_payload() -> None:
    token, other = credentials.new_token(), credentials.new_token()
    signature = credentials.sign(b"version 3", token)
    assert credentials.verify(b"version 3", signature, token)
    assert not credentials.verify(b"version 4", signature, token)
    assert not credentials.verify(b"version 3", signature, other)
    assert not credentials.verify(b"version 3", None, token)
    assert not credentials.verify(b"version 3", "", token)
    # the token is never the HMAC key itself
    assert credentials.signing_key(token) != token.encode()
    assert signature != hmac.new(token.encode(), b"version 3", hashlib.sha256).hexdigest()
