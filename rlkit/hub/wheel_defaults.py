"""An environment's eval defaults (`[tool.rlkit.eval]`) inside its wheel, so that the installed
copy evaluates as its folder does.

A wheel carries no pyproject.toml. `rlkit env build` adds the table to the wheel's `.dist-info`
as `rlkit_eval.toml` (listed in RECORD with its hash, as installers require), and the resolver
reads it back from the installed distribution's metadata (`read_installed_defaults`).
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import os
import tempfile
import tomllib
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import tomli_w

DEFAULTS_FILE = "rlkit_eval.toml"


def embed_eval_defaults(wheel: Path, defaults: dict[str, Any]) -> None:
    """Rewrite `wheel` with `<dist-info>/rlkit_eval.toml` holding `defaults`."""
    data = tomli_w.dumps(defaults).encode()
    with zipfile.ZipFile(wheel) as source:
        names = source.namelist()
        record = next(n for n in names if n.endswith(".dist-info/RECORD"))
        target = f"{record.rsplit('/', 1)[0]}/{DEFAULTS_FILE}"
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        line = f"{target},sha256={digest},{len(data)}\n"
        lines = [
            x for x in source.read(record).decode().splitlines(True) if not x.startswith(target)
        ]
        fd, tmp = tempfile.mkstemp(dir=wheel.parent, suffix=".whl")
        os.close(fd)
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as out:
            for info in source.infolist():
                if info.filename == target:
                    continue
                if info.filename == record:
                    out.writestr(target, data)
                    out.writestr(info, "".join(lines) + line)
                else:
                    out.writestr(info, source.read(info))
    os.replace(tmp, wheel)


def read_installed_defaults(dist_names: Iterable[str]) -> dict[str, Any]:
    """The `[tool.rlkit.eval]` table an installed distribution's wheel carried, else {}."""
    for name in dist_names:
        try:
            text = importlib.metadata.distribution(name).read_text(DEFAULTS_FILE)
        except importlib.metadata.PackageNotFoundError:
            continue
        if text:
            return tomllib.loads(text)
    return {}
