"""The test tiers stay honest: a test that reaches a costly resource carries its marker, so
`bash scripts/test.sh --fast` (which deselects slow, venv and system) never starts one.

A static check, per test function: the names it reaches (its own body, its arguments, and the
module-level fixtures, functions and classes those name, transitively, into the helpers it
imports from tests/helpers and the helpers those import) are matched against the calls that need
each tier (the session fixture `vllm_server`, `start_server`, `tiny_train_cmd`, torchrun's
launcher, `fresh_venv`, `require_system`, ...). So `roles.train_cmd`, which builds an `rlkit
train` command through `tiny_train_cmd`, needs `slow` as much as `tiny_train_cmd` itself.

Four layout checks ride along: the benchmark scripts sit outside pytest's test paths, no test
module imports another (shared code lives in tests/helpers/), the suite's log (CI's too) lists
its slowest tests, and the files on the session's LoRA server share one xdist worker.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# a command line naming pip (`[sys.executable, "-m", "pip", ...]`) runs it; uv runs inside
# ensure_venv / fresh_venv
INSTALLERS = {"pip"}
TRIGGERS = {
    # lora_server: the session's LoRA vLLM server (tests/integration/conftest.py); running_hub:
    # a hub server with its database and tokens, driven through the CLI and HTTP
    "slow": {
        "vllm_server",
        "lora_server",
        "start_server",
        "torchrun",
        "torchrun_args",
        "tiny_train_cmd",
        "running_hub",
    },
    "venv": {"fresh_venv", "ensure_venv", *INSTALLERS},
    "system": {"require_system", "headless_chromium", "slurm_cluster"},
}
# a verifiers environment (`vf-...`) that is loaded or evaluated runs in a bridge venv (uv)
BRIDGED_ENV_PREFIX = "vf-"

# modules whose attributes share a trigger's name without being one (asyncio.start_server is
# a plain TCP listener: the fake OpenAI server's lean mode)
NOT_TRIGGERS = {"asyncio"}

LOADS_ENVS = {"run_cli", "load_environment", "check_environment", "audit_environment", "RLKIT"}
# tests of a trigger itself, not users of the resource
EXEMPT = {
    "tests/unit/test_ci_system_requirements.py::test_require_system_skips_locally_and_fails_in_ci"
}


def checked_files() -> list[Path]:
    files = sorted((ROOT / "tests").rglob("test_*.py"))
    files += sorted(ROOT.glob("environments/*/tests/test_*.py"))
    return [f for f in files if "/envs/" not in str(f.relative_to(ROOT))]


def marks_of(decorators: list[ast.expr]) -> set[str]:
    """`pytest.mark.NAME` (called or not) among decorators or a pytestmark value."""
    found = set()
    for node in decorators:
        for sub in ast.walk(node):
            if (
                isinstance(sub, ast.Attribute)
                and isinstance(sub.value, ast.Attribute)
                and sub.value.attr == "mark"
            ):
                found.add(sub.attr)
    return found


def pytestmarks(tree: ast.Module) -> list[ast.expr]:
    """What a module assigns to `pytestmark`."""
    return [
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets)
    ]


def names_in(node: ast.AST) -> set[str]:
    """Identifiers, attribute names, `vf-` environment ids and installers that `node` mentions."""
    names = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            names.add(sub.id)
        elif isinstance(sub, ast.Attribute) and not (
            isinstance(sub.value, ast.Name) and sub.value.id in NOT_TRIGGERS
        ):
            names.add(sub.attr)
        elif isinstance(sub, ast.arg):
            names.add(sub.arg)
        elif isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            if sub.value.startswith(BRIDGED_ENV_PREFIX):
                names.add(BRIDGED_ENV_PREFIX)
            elif sub.value in INSTALLERS:
                names.add(sub.value)
    return names


HELPERS = "tests.helpers"
Definitions = dict[str, ast.AST]
# a name imported from tests/helpers -> (its module, its name there; None: the module itself)
Imports = dict[str, tuple[str, str | None]]


def definitions(tree: ast.Module) -> tuple[Definitions, Imports]:
    """A module's top-level functions and classes by name, and what it imports from
    tests/helpers (`from tests.helpers.roles import train_cmd as roles_cmd` ->
    {"roles_cmd": ("tests.helpers.roles", "train_cmd")}, `from tests.helpers import roles` ->
    {"roles": ("tests.helpers.roles", None)})."""
    defs: Definitions = {
        node.name: node
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    }
    imports: Imports = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or not node.module:
            continue
        for alias in node.names:
            if node.module == HELPERS:
                imports[alias.asname or alias.name] = (f"{HELPERS}.{alias.name}", None)
            elif node.module.startswith(HELPERS + "."):
                imports[alias.asname or alias.name] = (node.module, alias.name)
    return defs, imports


def helper_modules() -> dict[str, ast.Module]:
    """Every module of tests/helpers, parsed, by its dotted name."""
    return {
        f"{HELPERS}.{path.stem}": ast.parse(path.read_text())
        for path in sorted((ROOT / "tests" / "helpers").glob("*.py"))
    }


def reached(tree: ast.Module, start: set[str], helpers: dict[str, ast.Module]) -> set[str]:
    """The names `start` reaches in `tree`: those in the definitions they name, transitively,
    followed into tests/helpers through each module's imports."""
    names = set(start)
    todo = [(tree, name) for name in start]
    seen: set[tuple[int, str]] = set()
    parsed: dict[int, tuple[Definitions, Imports]] = {}
    while todo:
        module, name = todo.pop()
        if (id(module), name) in seen:
            continue
        seen.add((id(module), name))
        if id(module) not in parsed:
            parsed[id(module)] = definitions(module)
        defs, imports = parsed[id(module)]
        if name in defs:
            more = names_in(defs[name])
            names |= more
            todo += [(module, n) for n in more]
        elif name in imports and imports[name][0] in helpers:
            helper_name, original = imports[name]
            helper = helpers[helper_name]
            if original is None:  # the whole module
                names |= names_in(helper)
                todo += [(helper, n) for n in names_in(helper)]
            else:
                todo.append((helper, original))
    return names


def is_autouse(func: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any(
        isinstance(d, ast.Call) and any(k.arg == "autouse" for k in d.keywords)
        for d in func.decorator_list
    )


def missing_marks(source: str, helpers: dict[str, ast.Module] | None = None) -> list[str]:
    """`test_name: tier` for each test that reaches a tier's trigger without its marker."""
    helpers = helper_modules() if helpers is None else helpers
    tree = ast.parse(source)
    functions = {
        node.name: node
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    module_marks = marks_of(pytestmarks(tree))
    autouse = {name for name, func in functions.items() if is_autouse(func)}

    problems = []
    for name, func in functions.items():
        if not name.startswith("test_"):
            continue
        names = reached(tree, {name} | autouse, helpers)
        if BRIDGED_ENV_PREFIX in names and names & LOADS_ENVS:
            names.add("ensure_venv")
        marks = module_marks | marks_of(func.decorator_list)
        for tier, triggers in TRIGGERS.items():
            hit = sorted(names & triggers)
            if hit and tier not in marks:
                problems.append(f"{name}: reaches {', '.join(hit)} but is not marked {tier}")
    return problems


def test_every_costly_test_carries_its_tier_marker() -> None:
    problems = []
    helpers = helper_modules()
    for path in checked_files():
        for problem in missing_marks(path.read_text(), helpers):
            test = f"{path.relative_to(ROOT)}::{problem.split(':')[0]}"
            if test not in EXEMPT:
                problems.append(f"{path.relative_to(ROOT)}::{problem}")
    assert not problems, "\n".join(problems)


def test_the_check_finds_an_unmarked_server_test() -> None:
    source = (
        "import pytest\n"
        "@pytest.fixture\n"
        "def served(vllm_server):\n"
        "    return vllm_server.url\n"
        "def test_a(served): ...\n"
        "@pytest.mark.slow\n"
        "def test_b(served): ...\n"
        "def test_c(): load_environment('vf-calc')\n"
        "def test_d(): find_verifiers_source('vf-calc')\n"
        "def test_e(): subprocess.run([sys.executable, '-m', 'pip', 'download', 'x'])\n"
    )
    assert missing_marks(source) == [
        "test_a: reaches vllm_server but is not marked slow",
        "test_c: reaches ensure_venv but is not marked venv",
        "test_e: reaches pip but is not marked venv",
    ]
    assert missing_marks("import pytest\npytestmark = [pytest.mark.slow]\n" + source[14:]) == [
        "test_c: reaches ensure_venv but is not marked venv",
        "test_e: reaches pip but is not marked venv",
    ]


def test_the_check_follows_calls_into_tests_helpers() -> None:
    """A helper that reaches a trigger (here through a second helper, imported under another
    name) makes its callers need the marker; a same-named attribute of asyncio does not."""
    helpers = {
        "tests.helpers.cmds": ast.parse(
            "from tests.helpers.cli import tiny_train_cmd\n"
            "def train_cmd(model, run_dir):\n"
            "    return tiny_train_cmd(model, run_dir, '--log.plot=false')\n"
            "def listen():\n"
            "    return asyncio.start_server(handle, port=0)\n"
        ),
        "tests.helpers.cli": ast.parse("def tiny_train_cmd(model, run_dir, *extra): ...\n"),
        "tests.helpers.served": ast.parse(
            "from rlkit.inference import start_server\ndef up(model): return start_server(model)\n"
        ),
    }
    source = (
        "import pytest\n"
        "from tests.helpers.cmds import listen, train_cmd as cmd\n"
        "from tests.helpers import served\n"
        "def launch(tmp_path): return cmd('m', tmp_path)\n"
        "def test_a(tmp_path): launch(tmp_path)\n"
        "@pytest.mark.slow\n"
        "def test_b(tmp_path): launch(tmp_path)\n"
        "def test_c(): listen()\n"
        "def test_d(): served.up('m')\n"
    )
    assert missing_marks(source, helpers) == [
        "test_a: reaches tiny_train_cmd but is not marked slow",
        "test_d: reaches start_server but is not marked slow",
    ]


@pytest.mark.parametrize("tier", sorted(TRIGGERS))
def test_tiers_are_registered_and_deselected_by_fast(tier: str) -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    registered = [m.split(":")[0] for m in pyproject["tool"]["pytest"]["ini_options"]["markers"]]
    assert tier in registered
    assert f"not {tier}" in (ROOT / "scripts" / "test.sh").read_text()


def test_the_suite_log_lists_its_slowest_tests() -> None:
    """CI runs scripts/test.sh (.ci/run): its log names where the suite's time goes."""
    assert "scripts/test.sh" in (ROOT / ".ci" / "run").read_text()
    pytest_line = next(
        line
        for line in (ROOT / "scripts" / "test.sh").read_text().splitlines()
        if line.startswith("exec ") and "pytest" in line
    )
    assert "--durations=" in pytest_line


def test_benchmarks_are_outside_the_test_paths() -> None:
    """Benchmark scripts are run by hand; `pytest` with no arguments never collects them."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    testpaths = [ROOT / p for p in pyproject["tool"]["pytest"]["ini_options"]["testpaths"]]
    benchmarks = ROOT / "tests" / "benchmarks"
    assert all(p.is_dir() for p in testpaths)
    assert not [p for p in testpaths if benchmarks == p or p in benchmarks.parents]


def test_no_test_module_imports_another() -> None:
    """What several test modules share lives in tests/helpers/ (or a conftest's fixtures)."""
    offenders = []
    for path in checked_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            offenders += [
                f"{path.relative_to(ROOT)}: {name}"
                for name in names
                if name.rpartition(".")[2].startswith("test_")
            ]
    assert not offenders, "\n".join(offenders)


def groups_of(tree: ast.Module) -> set[str]:
    """The `pytest.mark.xdist_group("NAME")` names in a module's `pytestmark`."""
    return {
        sub.args[0].value
        for value in pytestmarks(tree)
        for sub in ast.walk(value)
        if isinstance(sub, ast.Call)
        and isinstance(sub.func, ast.Attribute)
        and sub.func.attr == "xdist_group"
        and sub.args
        and isinstance(sub.args[0], ast.Constant)
    }


def test_files_on_the_lora_server_share_one_worker() -> None:
    """Each xdist worker that runs a test taking `lora_server` keeps its own LoRA engine until
    the suite ends: those files carry the group that sends them to one worker."""
    users = []
    for path in checked_files():
        tree = ast.parse(path.read_text())
        takes = any(
            isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.name.startswith("test_")
            and "lora_server" in {a.arg for a in node.args.args}
            for node in tree.body
        )
        if takes:
            users.append(path.relative_to(ROOT))
            assert "lora-server" in groups_of(tree), f"{path}: no xdist_group('lora-server')"
    assert len(users) >= 2, users  # the check sees the files it guards
