"""Finding verifiers packages off the template, uv beside the interpreter, the scripted server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from rlkit.envs.bridge import venvs
from rlkit.envs.bridge.source import (
    discover_modules,
    entry_module,
    find_verifiers_source,
    split_requirements,
)
from rlkit.envs.scripted_server import ScriptedServer
from rlkit.errors import UsageError
from rlkit.hub.names import EnvRef, parse_env_id

ENVS = Path(__file__).resolve().parents[1] / "integration" / "envs"


def test_env_id_names_a_module_after_a_colon() -> None:
    assert parse_env_id("my-env:pkg.sub.mod", require_owner=False) == EnvRef(
        "", "my-env", None, "pkg.sub.mod"
    )
    ref = parse_env_id("alice/my-env@1.0:pkg")
    assert (ref.owner, ref.name, ref.version, ref.module) == ("alice", "my-env", "1.0", "pkg")
    assert str(ref) == "alice/my-env@1.0"  # the hub sees the package, not the module
    with pytest.raises(UsageError, match="not a dotted module path"):
        parse_env_id("my-env:pkg/mod", require_owner=False)


def test_verifiers_only_in_an_extra_counts() -> None:
    # dist metadata: every extra's requirement carries its marker
    requires = ["numpy", 'verifiers>=0.2; extra == "vf"', 'regex; extra == "vf"', "x; extra == 'y'"]
    spec, others = split_requirements(requires, {"y": requires, "vf": requires})
    assert spec == ">=0.2" and others == ["numpy", "regex"]  # marker dropped: pip skips it
    # pyproject: extras are listed apart, without markers
    spec, others = split_requirements(["numpy"], {"vf": ["verifiers<0.3", "regex"]})
    assert spec == "<0.3" and others == ["numpy", "regex"]
    assert split_requirements(["numpy"], {"dev": ["pytest"]}) == (None, ["numpy"])


def test_off_template_folder_is_found_by_its_load_environment() -> None:
    source = find_verifiers_source("vf-odd-layout", [ENVS], ["vf_odd_layout", "vf_odd_layout_env"])
    assert source is not None
    assert source.module == "odd_tasks.envs.echo"
    assert source.sys_path == [str(ENVS / "vf-odd-layout" / "src")]
    assert source.verifiers_spec == "<0.3,>=0.2" and source.requirements == ["datasets>=3.0"]
    assert "verifiers" not in sys.modules


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text))


def test_discovery_prefers_the_shallowest_and_refuses_ties(tmp_path: Path) -> None:
    env = "def load_environment(**kwargs):\n    pass\n"
    _write(
        tmp_path,
        {
            "pkg/__init__.py": env,
            "pkg/deep/mod.py": env,
            "pkg/other.py": "x = 'def load_environment('\n",  # not at the start of a line
            "tests/test_pkg.py": env,  # tests are not searched
        },
    )
    assert discover_modules(tmp_path) == ["pkg", "pkg.deep.mod"]
    assert entry_module([tmp_path], ["nope"], False, "e") == (tmp_path, "pkg")
    _write(tmp_path, {"twin.py": env})
    with pytest.raises(UsageError, match=r"several modules define load_environment \(pkg, twin\)"):
        entry_module([tmp_path], ["nope"], False, "e")
    with pytest.raises(UsageError, match="no module 'nope' in"):
        entry_module([tmp_path], ["nope"], True, "e")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UsageError, match=r"no load_environment found \(looked for modules e_mod"):
        entry_module([empty], ["e_mod"], False, "e")


def test_uv_is_the_packages_binary_else_the_one_on_path(tmp_path: Path, monkeypatch) -> None:
    """uv is found from its package (rlkit depends on it) with nothing on PATH; where the
    package's binary is gone, from PATH; neither is a clear error."""
    import uv

    monkeypatch.setenv("PATH", str(tmp_path / "nothing-here"))
    found = Path(venvs.find_uv())
    assert found.name == "uv" and os.access(found, os.X_OK)
    assert subprocess.run([found, "--version"], capture_output=True, text=True).stdout

    def gone() -> str:
        raise uv._find_uv.UvNotFound("not in the package's bin folder")

    monkeypatch.setattr(uv, "find_uv_bin", gone)
    with pytest.raises(
        UsageError, match=r"the uv binary is missing .*put uv on PATH\): not in the package"
    ):
        venvs.find_uv()
    on_path = tmp_path / "bin"
    on_path.mkdir()
    (on_path / "uv").symlink_to(found)
    monkeypatch.setenv("PATH", str(on_path))
    assert venvs.find_uv() == str(on_path / "uv")


def _post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(
        f"{url}/chat/completions", json.dumps(body).encode(), {"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_scripted_server_routes_by_model_and_refuses_past_the_script() -> None:
    from rlkit.envs.check import ScriptedClient

    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    one = ScriptedClient([{"role": "assistant", "content": "", "tool_calls": [call]}])
    two = ScriptedClient([{"role": "assistant", "content": "x"}], repeat=True)
    with ScriptedServer() as server:
        first, second = server.register(one.next_message), server.register(two.next_message)
        status, data = _post(server.url, {"model": first, "messages": []})
        assert status == 200 and data["choices"][0]["finish_reason"] == "tool_calls"
        assert data["choices"][0]["message"]["tool_calls"] == [call]
        status, data = _post(server.url, {"model": first, "messages": []})
        assert status == 400 and "asked for model turn 2" in data["error"]["message"]
        for _ in range(2):
            status, data = _post(server.url, {"model": second, "messages": []})
            assert (status, data["choices"][0]["message"]["content"]) == (200, "x")
        assert _post(server.url, {"model": "other", "messages": []})[0] == 404
