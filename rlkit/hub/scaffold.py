"""Environment packages on disk: scaffold a new one, read its project metadata, build it.

A scaffolded package is an ordinary setuptools project (wheel + sdist via the standard `build`
frontend), so anything that installs Python packages can install an environment.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

from jinja2 import ChoiceLoader, Environment, PackageLoader, StrictUndefined
from packaging.utils import parse_sdist_filename, parse_wheel_filename

from rlkit.atomic import atomic_dir
from rlkit.errors import UsageError
from rlkit.hub.names import module_name, normalize, validate_name, validate_version
from rlkit.hub.wheel_defaults import embed_eval_defaults

_TEMPLATES = {
    "pyproject.toml.jinja": "pyproject.toml",
    "README.md.jinja": "README.md",
    "module.py.jinja": "{module}/__init__.py",
    "train.jsonl.jinja": "{module}/train.jsonl",
    "eval.jsonl.jinja": "{module}/eval.jsonl",
    "test_env.py.jinja": "tests/test_{module}.py",
    "conftest.py.jinja": "tests/conftest.py",
    "gitignore.jinja": ".gitignore",
}
# `rlkit env init --template NAME`: each template's folder under templates/ (files it lacks come
# from templates/scaffold) and what its tasks are
TEMPLATES = {
    "single-turn": ("scaffold", "addition problems"),
    "tool": ("tool", "multiplication with a calculator tool, multi-turn"),
}


def init_env(name: str, parent: Path, description: str = "", template: str = "single-turn") -> Path:
    """Create `parent/NAME/`, a working environment package from `template` (`single-turn`, or
    `tool`: a ToolEnv, multi-turn): train and eval splits, a gold completion, tests that pass
    from any folder; returns its path."""
    if template not in TEMPLATES:
        raise UsageError(f"--template: {template!r} is not one of {', '.join(TEMPLATES)}")
    folder, tasks = TEMPLATES[template]
    validate_name(name)
    dest = Path(parent) / name
    if dest.exists() and any(dest.iterdir()):
        raise UsageError(f"{dest} already exists and is not empty")
    module = module_name(name)
    context = {
        "name": name,
        "module": module,
        "description": description or f"{name}: an rlkit environment ({tasks}).",
    }
    loaders = [
        PackageLoader("rlkit.hub", f"templates/{f}") for f in dict.fromkeys([folder, "scaffold"])
    ]
    jinja = Environment(
        loader=ChoiceLoader(loaders),
        undefined=StrictUndefined,
        keep_trailing_newline=True,
    )
    with atomic_dir(dest, durable=False) as tmp:  # `dest` is absent or empty (checked above)
        for template, target in _TEMPLATES.items():
            out = tmp / target.format(module=module)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(jinja.get_template(template).render(context))
    return dest


def next_steps(dest: Path) -> str:
    """What to run after `rlkit env init`: the folder is the environment's id until published."""
    folder = str(dest) if Path(dest).is_absolute() else f"./{Path(dest).as_posix()}"
    return (
        f"next: rlkit env check {folder} --gold   (then: pytest {Path(dest) / 'tests'}; "
        f"rlkit eval {folder} -m MODEL --base-url URL; rlkit env push {folder})"
    )


def project_metadata(path: Path) -> tuple[str, str]:
    """(normalised name, version) from `path/pyproject.toml`."""
    pyproject = Path(path) / "pyproject.toml"
    if not pyproject.is_file():
        raise UsageError(f"{path} is not an environment package: no pyproject.toml")
    try:
        project = tomllib.loads(pyproject.read_text()).get("project", {})
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{pyproject}: invalid TOML: {exc}") from exc
    if "name" not in project or "version" not in project:
        raise UsageError(f"{pyproject}: [project] needs a static name and version")
    return validate_name(project["name"]), validate_version(str(project["version"]))


def dist_files(path: Path) -> list[Path]:
    """The wheel and sdist in `path/dist/` for the project's current name and version."""
    name, version = project_metadata(path)
    found: list[Path] = []
    for file in sorted((Path(path) / "dist").glob("*")):
        try:
            if file.name.endswith(".whl"):
                fname, fversion, _, _ = parse_wheel_filename(file.name)
            elif file.name.endswith(".tar.gz"):
                fname, fversion = parse_sdist_filename(file.name)
            else:
                continue
        except ValueError:
            continue
        if fname == normalize(name) and str(fversion) == version:
            found.append(file)
    return found


def build_env(path: Path, isolation: bool = True) -> list[Path]:
    """Build wheel + sdist into `path/dist/` with `python -m build`; returns the two files.
    The wheel carries the package's `[tool.rlkit.eval]` defaults (`rlkit.hub.wheel_defaults`).

    Isolated builds install the declared build requirements from the package index into a
    temporary environment; `isolation=False` uses the current interpreter's setuptools.
    """
    path = Path(path).resolve()
    project_metadata(path)  # fail early with a clear message
    cmd = [sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", str(path / "dist")]
    if not isolation:
        cmd.append("--no-isolation")
    proc = subprocess.run([*cmd, str(path)], capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-20:])
        raise UsageError(f"building {path} failed:\n{tail}")
    files = dist_files(path)
    if len(files) != 2:
        raise UsageError(f"build of {path} produced {[f.name for f in files]}, not wheel + sdist")
    table = tomllib.loads((path / "pyproject.toml").read_text()).get("tool", {})
    defaults = table.get("rlkit", {}).get("eval")
    if defaults:
        embed_eval_defaults(next(f for f in files if f.suffix == ".whl"), defaults)
    return files
