"""Environment discovery: local folders, installed packages, hub ids, unknown ids."""

from __future__ import annotations

import sys
import textwrap
from dataclasses import FrozenInstanceError
from pathlib import Path

import pytest

from rlkit.envs import Environment, list_environments, load_environment
from rlkit.envs.loader import load_resolved
from rlkit.envs.resolve import resolve_env_id
from rlkit.errors import UsageError
from rlkit.hub.names import EnvRef, parse_env_id
from rlkit.inference import InferenceClient
from tests.helpers.fake_openai import FakeOpenAIServer

# A complete environment package in about 30 lines: the README's "write your own" example.
CUSTOM_ENV = '''
"""shout: repeat the word in capitals."""

from datasets import Dataset

from rlkit.envs import Parser, Rubric, SingleTurnEnv

WORDS = ["apple", "river", "stone", "cloud"]


def load_environment(num_examples: int = 4, bonus: float = 0.0) -> SingleTurnEnv:
    data = Dataset.from_dict(
        {"question": WORDS[:num_examples], "answer": [w.upper() for w in WORDS[:num_examples]]}
    )
    parser = Parser()

    def exact(completion, answer, parser) -> float:
        return float((parser.parse_answer(completion) or "").strip() == answer)

    def shouting(completion) -> float:
        text = completion[-1]["content"]
        return float(text.isupper()) + bonus

    return SingleTurnEnv(
        dataset=data,
        system_prompt="Repeat the word in capital letters.",
        parser=parser,
        rubric=Rubric([exact, shouting], [1.0, 0.1], parser=parser),
    )
'''


@pytest.fixture
def env_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder of local environments on RLKIT_ENV_PATH; sys.path and modules restored after."""
    monkeypatch.setenv("RLKIT_ENV_PATH", str(tmp_path))
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith(("shout_words", "hubbed"))]:
        del sys.modules[name]


def _write_env(folder: Path, name: str, module: str, source: str) -> None:
    (folder / name).mkdir(parents=True)
    (folder / name / f"{module}.py").write_text(source)
    (folder / name / "pyproject.toml").write_text(
        textwrap.dedent(f"""
        [project]
        name = "{name}"
        version = "0.1.0"
        dependencies = ["rlkit"]
        """)
    )


def test_parse_env_id() -> None:
    assert parse_env_id("owner/my-env@1.2") == EnvRef("owner", "my-env", "1.2")
    assert parse_env_id("my-env", require_owner=False) == EnvRef("", "my-env", None)
    with pytest.raises(UsageError, match="must look like"):
        parse_env_id("a/b/c")


async def test_custom_environment_in_a_folder_is_found_and_runs(env_path: Path) -> None:
    _write_env(env_path, "shout-words", "shout_words", CUSTOM_ENV)
    env = load_environment("someone/shout-words@0.1.0", num_examples=2)
    assert isinstance(env, Environment) and env.env_id == "shout-words"
    assert env.version == "0.1.0"  # from the folder's pyproject.toml (no installed package)
    assert "shout-words" in list_environments()
    rows = env.get_eval_dataset()
    assert rows[1]["prompt"][0] == {
        "role": "system",
        "content": "Repeat the word in capital letters.",
    }

    def upper(body: dict) -> str:
        return body["messages"][-1]["content"].upper()

    with FakeOpenAIServer(responder=upper) as server:
        async with InferenceClient(server.url) as client:
            rollouts = await env.run_group(rows[0], client, "fake-model", {}, n=2)
    assert [r.reward for r in rollouts] == [pytest.approx(1.1)] * 2
    assert rollouts[0].metrics == {"exact": 1.0, "shouting": 1.0}


def test_unknown_id_suggests_close_matches() -> None:
    with pytest.raises(UsageError, match=r"unknown environment 'revers-txt'.*reverse-text"):
        load_environment("revers-txt")


def test_bad_arguments_are_usage_errors(env_path: Path) -> None:
    _write_env(env_path, "shout-words", "shout_words", CUSTOM_ENV)
    with pytest.raises(UsageError, match="environment 'shout-words' takes no argument 'colour'"):
        load_environment("shout-words", colour="red")


def test_not_an_environment_is_a_usage_error(env_path: Path) -> None:
    _write_env(env_path, "shout-words", "shout_words", "def load_environment():\n    return 42\n")
    with pytest.raises(UsageError, match="returned int, not an rlkit.envs.Environment"):
        load_environment("shout-words")


def test_missing_dependency_is_named(env_path: Path) -> None:
    source = "import no_such_dependency_xyz\n\ndef load_environment():\n    pass\n"
    _write_env(env_path, "shout-words", "shout_words", source)
    with pytest.raises(UsageError, match="missing module 'no_such_dependency_xyz'"):
        load_environment("shout-words")


def test_hub_ids_are_installed_then_imported(
    env_path: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path_factory.mktemp("site")
    calls: list[str] = []

    def ensure_installed(env_id: str, hub: str | None = None) -> None:
        calls.append(env_id)
        (site / "hubbed.py").write_text(CUSTOM_ENV)  # what `pip install` would have done
        sys.path.insert(0, str(site))

    monkeypatch.setattr("rlkit.envs.resolve.ensure_installed", ensure_installed)
    env = load_environment("alice/hubbed@1.0")
    assert calls == ["alice/hubbed@1.0"] and env.env_id == "hubbed"
    with pytest.raises(UsageError, match="unknown environment 'nohub'"):
        load_environment("nohub")  # no owner: the hub is not asked
    assert calls == ["alice/hubbed@1.0"]


def test_installed_environments_are_listed() -> None:
    names = list_environments()
    assert "reverse-text" in names and "math" in names


def test_an_id_resolves_once_into_one_record_without_touching_sys_path(env_path: Path) -> None:
    """The record names source, module, version, folder and the package's eval defaults;
    resolving imports nothing from a local folder, so eval's defaults cannot lean on the loader."""
    _write_env(env_path, "shout-words", "shout_words", CUSTOM_ENV)
    pyproject = env_path / "shout-words" / "pyproject.toml"
    pyproject.write_text(pyproject.read_text() + "\n[tool.rlkit.eval]\nnum_examples = 2\n")
    before = list(sys.path)
    resolved = resolve_env_id("shout-words")
    assert sys.path == before and "shout_words" not in sys.modules
    assert (resolved.source, resolved.module, resolved.version) == ("local", "shout_words", "0.1.0")
    assert resolved.project == env_path / "shout-words"
    assert dict(resolved.eval_defaults) == {"num_examples": 2}
    with pytest.raises(FrozenInstanceError):
        resolved.source = "installed"  # type: ignore[misc]

    # a folder is an id too: the same package, found from its path
    by_folder = resolve_env_id(str(env_path / "shout-words"))
    assert (by_folder.source, by_folder.name, by_folder.module) == (
        "local",
        "shout-words",
        "shout_words",
    )
    assert load_resolved(by_folder, num_examples=1).env_id == "shout-words"

    installed = resolve_env_id("reverse-text")
    assert installed.source == "installed" and installed.module == "reverse_text"
    assert installed.version and installed.bridge is None
