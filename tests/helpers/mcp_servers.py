"""MCP servers for tests: the real `mcp-server-time` from the package index, installed into a
directory the sandbox can bind, and a stdlib-only server that misbehaves on request."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from rlkit.sandbox.rootfs import sandbox_python
from rlkit.sandbox.workspace import base_dir

# Answers initialize and tools/list (one tool, `echo`); on tools/call it echoes, hangs or dies.
BROKEN_SERVER = """
import json, os, sys, time
MODE = sys.argv[1]
for line in sys.stdin:
    msg = json.loads(line)
    if "id" not in msg:
        continue
    if msg["method"] == "initialize":
        result = {"protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
                  "serverInfo": {"name": "broken", "version": "0"}}
    elif msg["method"] == "tools/list":
        schema = {"type": "object", "properties": {"text": {"type": "string"}},
                  "required": ["text"]}
        result = {"tools": [{"name": "echo", "description": "Echo text.", "inputSchema": schema}]}
    elif MODE == "hang":
        time.sleep(3600)
    elif MODE == "die":
        print("dying on purpose", file=sys.stderr, flush=True)
        os._exit(3)
    else:
        result = {"content": [{"type": "text", "text": msg["params"]["arguments"]["text"]}]}
    print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}), flush=True)
"""


def bindable_dir(prefix: str) -> Path:
    """A fresh directory the sandbox user can read (under the sandbox's base directory)."""
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=base_dir()))
    folder.chmod(0o755)
    return folder


def broken_server_dir() -> Path:
    folder = bindable_dir("mcp-broken-")
    (folder / "broken_mcp.py").write_text(BROKEN_SERVER)
    (folder / "broken_mcp.py").chmod(0o644)
    return folder


def install_mcp_server_time() -> Path:
    """`mcp-server-time` and its requirements, unmodified, for the sandbox's interpreter."""
    folder = bindable_dir("mcp-time-")
    uv = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
    subprocess.run(
        [uv, "pip", "install", "--quiet", "--python", str(sandbox_python())]
        + ["--target", str(folder), "mcp-server-time"],
        check=True,
        timeout=300,
    )
    subprocess.run(["chmod", "-R", "a+rX", str(folder)], check=True)
    return folder
