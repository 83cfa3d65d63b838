"""`rlkit env ...`: check, scaffold, build, publish, install, pull and browse environments."""

from __future__ import annotations

import os
from contextlib import closing
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.table import Table

from rlkit.progress import make_console

if TYPE_CHECKING:
    from rlkit.envs import Environment
    from rlkit.envs.check import CheckReport
    from rlkit.hub.records import AuditRecord

app = typer.Typer(help="Create, publish and install environment packages.", no_args_is_help=True)


class Split(StrEnum):
    EVAL = "eval"
    TRAIN = "train"


console = make_console()

HUB_HELP = "Hub: 'local' (a directory under $RLKIT_HOME), a directory, or an http(s) URL."
HubOption = typer.Option(None, "--hub", help=HUB_HELP + " Default: $RLKIT_HUB, config, local.")
TokenOption = typer.Option(None, "--token", help="API token (default: $RLKIT_HUB_TOKEN).")
EnvIdArgument = typer.Argument(..., help="Environment id (reverse-text, owner/name).")
EnvArgsOption = typer.Option(
    None, "--env-args", "-a", help="Environment loader arguments as a JSON object."
)


def _print_check(report: CheckReport) -> None:
    from rlkit.envs.check import report_lines

    for line in report_lines(report):
        console.print(line, markup=False, highlight=False, soft_wrap=True)


@app.command("check")
def check_cmd(
    env_id: str = EnvIdArgument,
    env_args: str | None = EnvArgsOption,
    num_rows: int = typer.Option(10, "--num-rows", "-n", min=1, help="Rows to check."),
    gold: bool = typer.Option(
        False, "--gold", help="Also play each row's gold completion (expects the maximum reward)."
    ),
    split: Split = typer.Option(Split.EVAL, "--split", help="Which rows to check."),
    verifiers_version: str | None = typer.Option(
        None,
        "--verifiers-version",
        help="Run a verifiers environment with this exact verifiers version "
        "[newest tested inside its declared range].",
    ),
    model: str | None = typer.Option(
        None,
        "--model",
        "-m",
        help="The model: a local HF directory (as `rlkit infer -m` serves it); also check that "
        "every prompt of the split fits its context with room for --max-tokens.",
    ),
    max_model_len: int | None = typer.Option(
        None, "--max-model-len", min=1, help="Context length (default: the model's)."
    ),
    max_tokens: int | None = typer.Option(
        None, "--max-tokens", min=0, help="Completion tokens (default: the env's sampling)."
    ),
    audit: bool = typer.Option(
        False, "--audit", help="Also run `rlkit env audit` on the same rows (exploit policies)."
    ),
) -> None:
    """Check that empty and garbage replies score the minimum and gold answers the maximum.

    A verifiers environment runs in its bridge worker, the scripted replies served to it over
    HTTP. Exit 0 when every case scores as expected (and with --model every prompt fits), 1
    otherwise (with a per-row report). With --audit, also 1 when an exploit beats the floor.
    """
    from rlkit.envs.check import check_environment
    from rlkit.envs.loader import load_resolved
    from rlkit.envs.resolve import resolve_env_id
    from rlkit_cli.eval import json_object

    kwargs = json_object(env_args, "-a/--env-args") or {}
    resolved = resolve_env_id(env_id)
    console.print(resolved.describe(), markup=False, highlight=False, soft_wrap=True)
    with closing(load_resolved(resolved, verifiers_version=verifiers_version, **kwargs)) as env:
        with console.status(f"checking {env_id}"):
            report = check_environment(env, num_rows=num_rows, gold=gold, split=split.value)
        _print_check(report)
        fits = True
        if model is not None:
            fits = _check_fit(env, report.split, model, max_model_len, max_tokens)
        audited = True
        if audit:
            audited = _run_audit(env, num_rows, report.split, None, 0.05, as_json=False)
    raise typer.Exit(0 if report.ok and fits and audited else 1)


def _run_audit(
    env: Environment,
    num_rows: int,
    split: str,
    only: str | None,
    margin: float,
    as_json: bool,
) -> bool:
    """Audit `env`, print the table (or its JSON) and say whether it passed."""
    from rlkit.envs.audit import audit_environment, report_json, report_lines
    from rlkit.errors import UsageError

    names = [n.strip() for n in only.split(",") if n.strip()] if only else None
    try:
        with console.status(f"auditing {env.env_id}"):
            report = audit_environment(
                env, num_rows=num_rows, split=split, only=names, margin=margin
            )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if as_json:
        print(report_json(report))
    else:
        for line in report_lines(report):
            console.print(line, markup=False, highlight=False, soft_wrap=True)
    return report.ok


@app.command("audit")
def audit_cmd(
    env_id: str = EnvIdArgument,
    env_args: str | None = EnvArgsOption,
    num_rows: int = typer.Option(10, "--num-rows", "-n", min=1, help="Rows to play on."),
    split: Split = typer.Option(Split.EVAL, "--split", help="Which rows to play on."),
    only: str | None = typer.Option(
        None, "--exploits", help="Comma-separated exploit names to play (default: all)."
    ),
    margin: float = typer.Option(
        0.05,
        "--margin",
        min=0.0,
        max=0.99,
        help="How far above the empty reply's mean (as a share of the reward range) an "
        "exploit may average before it fails.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the report as one JSON object."),
    verifiers_version: str | None = typer.Option(
        None, "--verifiers-version", help="Run a verifiers environment with this exact version."
    ),
) -> None:
    """Play exploit policies (echo, constants, every option at once, format only, judge bait,
    the family's own: runner shadowing, restated premises, ...) through the environment's own
    rollout and rubric, and compare each with the empty reply and the gold completion.

    Exit 0 when no exploit reaches the maximum on any row or averages above the floor (the
    empty reply's mean plus --margin of the reward range), 1 otherwise. Two-way guesses are
    reported apart with the split's balance and fail only on a lopsided split.
    """
    from rlkit.envs.loader import load_resolved
    from rlkit.envs.resolve import resolve_env_id
    from rlkit_cli.eval import json_object

    kwargs = json_object(env_args, "-a/--env-args") or {}
    resolved = resolve_env_id(env_id)
    if not as_json:
        console.print(resolved.describe(), markup=False, highlight=False, soft_wrap=True)
    with closing(load_resolved(resolved, verifiers_version=verifiers_version, **kwargs)) as env:
        ok = _run_audit(env, num_rows, split.value, only, margin, as_json)
    raise typer.Exit(0 if ok else 1)


def _check_fit(
    env: Environment, split: str, model: str, context: int | None, max_tokens: int | None
) -> bool:
    """Print whether the split's prompts fit `model`'s context; True when all do."""
    from rlkit.envs.fit import max_model_len, measure, renderer_for
    from rlkit.errors import UsageError

    renderer = renderer_for(model)
    context = context or max_model_len([], model)
    if renderer is None or context is None:
        raise UsageError(f"--model {model}: no local tokenizer with a chat template and context")
    rows = env.get_eval_dataset() if split == "eval" else env.get_dataset()
    sampling = {} if max_tokens is None else {"max_tokens": max_tokens}
    fit = measure(env, rows, renderer, context, sampling)
    if fit.overlong:
        console.print(
            f"FAIL {fit.describe()}: {fit.fix('serve with')}", markup=False, soft_wrap=True
        )
        return False
    console.print(
        f"prompts fit: the longest of {len(rows)} has {fit.longest} tokens, "
        f"{fit.limit} fit in max_model_len {context} - max_tokens {fit.max_tokens}",
        markup=False,
        soft_wrap=True,
    )
    return True


@app.command("doctor")
def doctor_cmd(
    env_id: str = typer.Argument(
        ...,
        help="A verifiers environment: NAME[@VERSION][:MODULE] (installed, local, or else from "
        "the package index into a scratch folder) or a package folder.",
    ),
    env_args: str | None = typer.Option(
        None, "--env-args", "-a", help="Environment loader arguments as a JSON object."
    ),
    num_rows: int = typer.Option(3, "--num-rows", "-n", min=1, help="Rows to play replies on."),
    verifiers_version: str | None = typer.Option(
        None, "--verifiers-version", help="Try this exact verifiers version instead."
    ),
    find_links: Path | None = typer.Option(
        None,
        "--find-links",
        help="Fetch the package from the wheels/sdists in this folder instead of the index.",
        exists=True,
        file_okay=False,
    ),
) -> None:
    """Say whether a verifiers environment runs through rlkit's bridge: its verifiers
    requirement, era and exact version, entry point, load, and scripted rollouts (empty,
    garbage, gold). Nothing is installed beside rlkit. Exit 0 when every stage works, else 1."""
    from rlkit.envs.doctor import Finding, doctor
    from rlkit_cli.eval import json_object

    def report(finding: Finding) -> None:
        mark = "[green]ok  [/]" if finding.ok else "[red]FAIL[/]"
        console.print(f"{mark} {finding.stage}: ", end="")
        console.print(finding.detail, markup=False, highlight=False, soft_wrap=True)

    ok = doctor(
        env_id,
        report,
        verifiers_version=verifiers_version,
        env_args=json_object(env_args, "-a/--env-args"),
        num_rows=num_rows,
        find_links=find_links,
    )
    console.print(f"{env_id}: " + ("runs through the bridge" if ok else "does not run as is"))
    raise typer.Exit(0 if ok else 1)


@app.command("init")
def init_cmd(
    name: str = typer.Argument(..., help="Package name, e.g. my-env (module my_env)."),
    path: Path = typer.Option(Path("."), "--path", "-p", help="Parent directory."),
    description: str = typer.Option("", help="One-line description."),
    template: str = typer.Option(
        "single-turn",
        "--template",
        help="single-turn (one question, one answer) or tool (a ToolEnv: the model calls a "
        "Python function over several turns).",
    ),
) -> None:
    """Scaffold a working environment package (data, rubric, gold completion, tests)."""
    from rlkit.hub import init_env
    from rlkit.hub.scaffold import next_steps

    dest = init_env(name, path, description, template)
    console.print(f"created {dest}", markup=False)
    console.print(next_steps(dest), markup=False, soft_wrap=True)


@app.command("build")
def build_cmd(
    path: Path = typer.Argument(Path("."), help="Environment package directory."),
    isolation: bool = typer.Option(
        True, help="Build in an isolated environment (--no-isolation uses installed setuptools)."
    ),
) -> None:
    """Build a wheel and an sdist into PATH/dist/."""
    from rlkit.hub import build_env

    with console.status(f"building {path}"):
        files = build_env(path, isolation=isolation)
    for file in files:
        console.print(f"built {file}")


@app.command("push")
def push_cmd(
    path: Path = typer.Argument(Path("."), help="Environment package directory."),
    hub: str | None = HubOption,
    token: str | None = TokenOption,
    owner: str | None = typer.Option(None, help="Namespace (default: the token's owner)."),
    private: bool | None = typer.Option(
        None, "--private/--public", help="Visibility (default: public for new environments)."
    ),
    skip_check: bool = typer.Option(
        False,
        "--skip-check",
        help="Publish without first running `rlkit env check` and `rlkit env audit` on it "
        "(the hub then shows the audit as not run).",
    ),
    allow_exploits: bool = typer.Option(
        False,
        "--allow-exploits",
        help="Publish even when an exploit earns full reward on some row (the hub shows it).",
    ),
    audit_rows: int = typer.Option(
        10, "--audit-rows", min=1, help="Rows the audit plays each exploit on."
    ),
) -> None:
    """Check and audit, then publish the package's current version (building it if dist/ lacks
    it) with the audit's table attached to that version.

    Refused (exit 1, nothing uploaded) when the check fails or an exploit policy earns full
    reward on any row, unless --allow-exploits; an exploit that only averages above the floor
    is published with a warning.
    """
    from rlkit.hub import build_env, dist_files, open_hub
    from rlkit.hub.records import AuditRecord
    from rlkit.hub.scaffold import project_metadata

    name, version = project_metadata(path)
    audit = AuditRecord.not_run() if skip_check else _check_and_audit(path, name, audit_rows)
    if audit.ran:
        exploited = [row.exploit for row in audit.table if row.full_reward_rows and not row.two_way]
        if exploited and not allow_exploits:
            console.print(
                f"not published: exploit(s) {', '.join(exploited)} earn full reward without "
                "the task; fix the rubric or pass --allow-exploits",
                markup=False,
                soft_wrap=True,
            )
            raise typer.Exit(1)
        audit.exploits_allowed = bool(exploited)
        if not audit.ok:
            failed = [row.exploit for row in audit.table if row.verdict != "ok"]
            console.print(
                f"warning: publishing with a failed audit ({', '.join(failed)}): the hub "
                "shows it on the environment's page",
                markup=False,
                soft_wrap=True,
            )
    files = dist_files(path)
    if len(files) != 2:
        with console.status(f"building {path}"):
            files = build_env(path)
    target = open_hub(hub, token)
    visibility = None if private is None else ("private" if private else "public")
    with console.status(f"pushing {', '.join(f.name for f in files)} to {target.location}"):
        card = target.push(files, owner=owner, visibility=visibility, audit=audit)
    console.print(f"published {card.owner}/{card.name}@{version} to {target.location}")


def _check_and_audit(path: Path, name: str, num_rows: int) -> AuditRecord:
    """`rlkit env check` then `rlkit env audit` on one loaded environment; exit 1 when the
    check fails or the audit cannot run."""
    from rlkit.envs.audit import audit_environment, hub_record, report_lines
    from rlkit.envs.check import check_environment
    from rlkit.envs.loader import load_environment_at

    with closing(load_environment_at(path, name)) as env:
        with console.status(f"checking {name}"):
            report = check_environment(env)
        _print_check(report)
        if not report.ok:
            console.print("not published: fix the environment or pass --skip-check")
            raise typer.Exit(1)
        try:
            with console.status(f"auditing {name}"):
                audit = audit_environment(env, num_rows=num_rows)
        except (RuntimeError, ValueError) as exc:
            console.print(
                f"not published: the audit could not run: {exc}", markup=False, soft_wrap=True
            )
            raise typer.Exit(1) from None
    for line in report_lines(audit):
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    return hub_record(audit)


@app.command("install")
def install_cmd(
    env_id: str = typer.Argument(
        ..., help="OWNER/NAME[@VERSION] from the hub, or NAME[@VERSION] from the package index."
    ),
    hub: str | None = HubOption,
    token: str | None = TokenOption,
    public_deps: bool | None = typer.Option(
        None,
        "--public-deps/--no-public-deps",
        help="Let dependencies the hub does not publish come from pip's configured index "
        "(never a name the hub publishes). Default: $RLKIT_HUB_PUBLIC_DEPS, "
        "[hub] public_dependencies, else off.",
    ),
    find_links: Path | None = typer.Option(
        None,
        "--find-links",
        help="NAME only: install from the wheels/sdists in this folder, offline (no index).",
        exists=True,
        file_okay=False,
    ),
    python: Path | None = typer.Option(
        None,
        "--python",
        help="Install into the environment of this interpreter (e.g. another venv's "
        "bin/python) instead of the one running rlkit.",
    ),
) -> None:
    """pip-install an environment into the current interpreter (or --python's). OWNER/NAME:
    with the hub as the only index for hub packages (sha256 verified against the hub's card and
    index). NAME: from pip's configured package index. A verifiers environment is installed
    without its dependencies: it runs in its own bridge venv, never beside rlkit."""
    from rlkit.errors import UsageError
    from rlkit.hub import install, install_from_index, open_hub, parse_env_id

    ref = parse_env_id(env_id, require_owner=False)
    if python is not None and not (python.is_file() and os.access(python, os.X_OK)):
        raise UsageError(f"--python: {python} is not an executable Python interpreter")
    target = str(python) if python is not None else None
    with console.status(f"installing {env_id}"):
        if ref.owner:
            if find_links is not None:
                raise UsageError("--find-links is for NAME from the package index, not OWNER/NAME")
            version = install(env_id, open_hub(hub, token), target, public_deps=public_deps)
        else:
            version = install_from_index(ref.name, ref.version, target, find_links=find_links)
    where = f" into {python}" if python is not None else ""
    console.print(f"installed {env_id.split('@')[0]}@{version}{where}", soft_wrap=True)


@app.command("pull")
def pull_cmd(
    env_id: str = typer.Argument(..., help="OWNER/NAME[@VERSION]"),
    dest: Path = typer.Option(Path("."), "--dir", "-d", help="Directory to unpack into."),
    hub: str | None = HubOption,
    token: str | None = TokenOption,
) -> None:
    """Download an environment's source (sdist, sha256 verified) and unpack it."""
    from rlkit.hub import open_hub, pull

    console.print(f"unpacked {pull(env_id, dest, open_hub(hub, token))}")


def _print_envs(rows: list) -> None:
    table = Table("environment", "version", "tags", "summary")
    for row in rows:
        name = f"{row.owner}/{row.name}" + (" (private)" if row.visibility == "private" else "")
        table.add_row(name, row.latest_version, ", ".join(row.tags), row.summary)
    console.print(table if rows else "no environments")


@app.command("list")
def list_cmd(hub: str | None = HubOption, token: str | None = TokenOption) -> None:
    """List the environments on the hub."""
    from rlkit.hub import open_hub

    _print_envs(open_hub(hub, token).search())


@app.command("search")
def search_cmd(
    query: str = typer.Argument("", help="Text to find in owner/name or summary."),
    tag: str | None = typer.Option(None, "--tag", help="Only environments with this tag."),
    hub: str | None = HubOption,
    token: str | None = TokenOption,
) -> None:
    """Search environments by name and tag."""
    from rlkit.hub import open_hub

    _print_envs(open_hub(hub, token).search(query, tag))


@app.command("info")
def info_cmd(
    env_id: str = typer.Argument(..., help="OWNER/NAME"),
    hub: str | None = HubOption,
    token: str | None = TokenOption,
    as_json: bool = typer.Option(
        False, "--json", help="Print the full card as JSON (each version with its audit)."
    ),
) -> None:
    """Show an environment's card: versions, files with sha256, the latest version's exploit
    audit, evaluation results."""
    from rlkit.hub import open_hub, parse_env_id

    card = open_hub(hub, token).card(parse_env_id(env_id))
    if as_json:
        print(card.model_dump_json(indent=2))
        return
    console.print(f"[bold]{card.owner}/{card.name}[/] {card.latest_version} ({card.visibility})")
    console.print(card.summary, markup=False)
    console.print(f"tags: {', '.join(card.tags)}   license: {card.license}", markup=False)
    files = Table("version", "file", "sha256")
    for version in card.versions:
        for file in version.files:
            files.add_row(version.version, file.filename, file.sha256)
    console.print(files)
    _print_audit(card.latest_version, card.latest_audit)
    if card.evals:
        board = Table("model", "version", "mean reward", "pass@k", "n", "date")
        for e in sorted(card.evals, key=lambda e: e.mean_reward, reverse=True):
            passes = " ".join(f"{k}={v:.3f}" for k, v in e.pass_at_k.items())
            board.add_row(e.model, e.version, f"{e.mean_reward:.3f}", passes, str(e.n), e.date)
        console.print(board)


def _print_audit(version: str, audit: AuditRecord | None) -> None:
    """The audit a version was pushed with: its figures, then one line per exploit (plain
    text, never wrapped or read as markup: names and verdicts come from the package)."""
    from rlkit.progress import print_line

    if audit is None or not audit.ran:
        state = "not audited" if audit is None else "not run (pushed with --skip-check)"
        print_line(console, f"audit of {version}: {state}")
        return

    def fmt(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f}"

    allowed = " (published with --allow-exploits)" if audit.exploits_allowed else ""
    print_line(
        console,
        f"audit of {version}: {audit.verdict}{allowed}; {audit.rows} {audit.split} rows, "
        f"gold mean {fmt(audit.gold_mean)}, empty mean {fmt(audit.empty_mean)}, "
        f"floor {fmt(audit.floor)} ({audit.date[:10]})",
    )
    print_line(
        console,
        f"  {'exploit':<28} {'family':<10} {'best variant':<24} {'mean':>6} "
        f"{'full-reward rows':>16}  verdict",
    )
    for row in audit.table:
        name = row.exploit + (" (two-way)" if row.two_way else "")
        full = f"{row.full_reward_rows}/{row.rows}"
        print_line(
            console,
            f"  {name:<28} {row.family:<10} {row.best_variant[:24]:<24} {fmt(row.mean):>6} "
            f"{full:>16}  {row.verdict}",
        )
