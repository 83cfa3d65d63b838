"""A run's credential: one random token, kept in a 0600 file, never on a command line.

Every process of a run (servers, trainer, orchestrator) and every client of an `rlkit infer`
server proves itself with the token (`Authorization: Bearer TOKEN`). Processes get it through
the file named by `TOKEN_FILE_ENV` (argv is world-readable; an environment is not). A file that
other users can read is refused: they would hold the credential.

The token also signs what a run publishes (a weights version): `sign` / `verify` use a key
derived from the token (`signing_key`), so the bearer token itself is never an HMAC key and a
signature never helps anyone guess the token. The one-time keys of the tensor tags in a
version's table are derived from another key derived from it (`digest_key`).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
from pathlib import Path

from rlkit.errors import UsageError

TOKEN_FILE_ENV = "RLKIT_TOKEN_FILE"  # path of the token file a run's processes read
TOKEN_BYTES = 32
_SIGNING_CONTEXT = b"rlkit signing key v1"
_DIGEST_CONTEXT = b"rlkit tensor digest key v1"
UNKEYED = bytes(32)  # the digest key of a run without a token (its records are unsigned)


def new_token() -> str:
    """A fresh random token (256 bits, URL-safe text)."""
    return secrets.token_urlsafe(TOKEN_BYTES)


def check_private(path: Path) -> None:
    """Refuse a token file that its group or other users can read or write, or that another
    user owns (one planted in a folder others may write to: they would know the token)."""
    info = path.stat()
    mode = info.st_mode
    if info.st_uid != os.geteuid():
        raise UsageError(
            f"token file {path} belongs to uid {info.st_uid}, not to this user "
            f"({os.geteuid()}): whoever owns it knows the token; create a new one"
        )
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise UsageError(
            f"token file {path} is readable or writable by other users "
            f"(mode {stat.S_IMODE(mode):04o}); `chmod 600 {path}` or create a new one"
        )


def read_token(path: str | Path) -> str:
    """The token in `path`, after checking that only its owner can read it."""
    path = Path(path)
    try:
        check_private(path)
        token = path.read_text().strip()
    except FileNotFoundError:
        raise UsageError(f"token file {path} not found") from None
    except OSError as exc:
        raise UsageError(f"token file {path} cannot be read: {exc.strerror}") from None
    if len(token) < 16:
        raise UsageError(f"token file {path} holds no token (at least 16 characters)")
    return token


def write_token_file(path: str | Path, token: str | None = None) -> str:
    """Create `path` (mode 0600 from the start, never wider) holding `token` or a new one;
    an existing file is an error. Returns the token."""
    path = Path(path)
    token = token or new_token()
    path.parent.mkdir(parents=True, exist_ok=True)
    # written beside it, then linked into place: a racing reader never sees an empty file
    draft = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
        os.link(draft, path)  # FileExistsError when the file exists
    finally:
        draft.unlink()
    return token


def ensure_token_file(path: str | Path) -> str:
    """The token in `path`, created first when the file does not exist (several processes of
    one run may race here: exactly one creates it, all read the same token)."""
    path = Path(path)
    try:
        write_token_file(path)
    except FileExistsError:
        pass
    return read_token(path)


def token_from_env() -> str | None:
    """The token of the file named by `TOKEN_FILE_ENV`, or None when it is unset."""
    path = os.environ.get(TOKEN_FILE_ENV)
    return read_token(path) if path else None


def signing_key(token: str) -> bytes:
    """The HMAC key for what a token's holder signs, derived from the token."""
    return hmac.new(token.encode(), _SIGNING_CONTEXT, hashlib.sha256).digest()


def digest_key(token: str | None) -> bytes:
    """The 32-byte key from which the one-time Poly1305 keys of the tensor tags in what a
    token's holder publishes are derived (`rlkit.protocol.weights.Digester`), derived from the
    token apart from the signing key. Without a
    token, `UNKEYED`: such a run's records go unsigned, and every server refuses them."""
    if token is None:
        return UNKEYED
    return hmac.new(token.encode(), _DIGEST_CONTEXT, hashlib.sha256).digest()


def sign(payload: bytes, token: str) -> str:
    """Hex HMAC-SHA256 of `payload` under the token's signing key."""
    return hmac.new(signing_key(token), payload, hashlib.sha256).hexdigest()


def verify(payload: bytes, signature: str | None, token: str) -> bool:
    """True when `signature` is `sign(payload, token)` (constant-time comparison)."""
    if not signature:
        return False
    return hmac.compare_digest(sign(payload, token), signature)


def rendezvous_secret(token: str) -> str:
    """A name prefix, derived from the run's token, for everything a run's processes put in a
    rendezvous store: a process without the token can neither read nor plant those keys."""
    return sign(b"rendezvous", token)[:32]
