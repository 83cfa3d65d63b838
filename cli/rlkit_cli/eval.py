"""`rlkit eval ENV_ID ...` runs an eval; `rlkit eval show RUN_DIR` shows one.

`rlkit eval ENV_ID` is shorthand for `rlkit eval run ENV_ID` (an environment literally named
`show` or `run` is reached with `rlkit eval run NAME`). Flags follow verifiers' `vf-eval`; like
`rlkit train`, a run can also come from a TOML file (`--config eval.toml`) and any field can be
set with a dotted override (`--sandbox.backend local`). Precedence: the resumed run's stored
config < the file < the flags < the dotted overrides (`rlkit.eval.config.layered_eval_config`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import typer
from typer.core import TyperGroup

from rlkit.errors import UsageError
from rlkit.ports import INFERENCE_PORT
from rlkit.progress import make_console, print_line


class _RunByDefault(TyperGroup):
    """Route anything that is not a sub-command name to `run`."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


app = typer.Typer(
    cls=_RunByDefault,
    help="Evaluate a model behind an OpenAI-compatible API on an environment: "
    "`rlkit eval ENV_ID -m MODEL ...` (same as `rlkit eval run ...`) or `rlkit eval show RUN_DIR`.",
    no_args_is_help=True,
)


def json_object(text: str | None, flag: str) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{flag} is not valid JSON ({exc}): {text!r}") from exc
    if not isinstance(value, dict):
        raise UsageError(f"{flag} must be a JSON object like '{{\"key\": 1}}', got {text!r}")
    return value


def split_env_id(args: list[str]) -> tuple[str | None, list[str]]:
    """The positional ENV_ID, if the arguments start with one, and the dotted overrides after it.

    ENV_ID is read by hand, not declared to click: a declared optional argument would swallow the
    value of an override (`--env_args.name VALUE`) whenever ENV_ID comes from --config or --resume.
    """
    if args and not args[0].startswith("-"):
        return args[0], args[1:]
    return None, args


@app.command(
    "run",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    options_metavar="ENV_ID [OPTIONS] [--FIELD VALUE]...",
)
def run_cmd(
    ctx: typer.Context,
    model: str | None = typer.Option(
        None,
        "--model",
        "-m",
        help="The model: the name the server serves it under (`rlkit infer -m X` serves X, a "
        "local HF directory or an HF name; a hosted API's model name).",
    ),
    base_url: str | None = typer.Option(
        None,
        "--base-url",
        "-b",
        help=f"OpenAI-compatible base URL [http://127.0.0.1:{INFERENCE_PORT}/v1].",
    ),
    api_key_var: str | None = typer.Option(
        None, "--api-key-var", "-k", help="Env variable holding the API key [OPENAI_API_KEY]."
    ),
    token_file: str | None = typer.Option(
        None, "--token-file", help="An `rlkit infer` server's token file (sent as the API key)."
    ),
    num_examples: int | None = typer.Option(
        None, "--num-examples", "-n", min=1, help="Dataset rows to evaluate [5]."
    ),
    rollouts_per_example: int | None = typer.Option(
        None, "--rollouts-per-example", "-r", min=1, help="Rollouts per row [3]."
    ),
    max_concurrent: int | None = typer.Option(
        None, "--max-concurrent", "-c", min=1, help="Rollouts in flight [32]."
    ),
    max_tokens: int | None = typer.Option(
        None, "--max-tokens", "-t", min=1, help="Max completion tokens per turn."
    ),
    temperature: float | None = typer.Option(
        None, "--temperature", "-T", min=0.0, help="Sampling temperature."
    ),
    sampling: str | None = typer.Option(
        None, "--sampling-args", "-S", help="Sampling arguments as a JSON object (wins over -t/-T)."
    ),
    env_args: str | None = typer.Option(
        None, "--env-args", "-a", help="Environment loader arguments as a JSON object."
    ),
    verifiers_version: str | None = typer.Option(
        None,
        "--verifiers-version",
        help="Run a verifiers environment with this exact verifiers version "
        "[newest tested inside its declared range].",
    ),
    install: bool = typer.Option(
        False,
        "--install",
        help="Install ENV_ID from the package index when it is found nowhere (NAME ids; "
        "OWNER/NAME ids come from the hub).",
    ),
    output_dir: Path | None = typer.Option(
        None, "--output-dir", "-o", help="Folder that receives the run folder [runs/eval]."
    ),
    timeout: float | None = typer.Option(None, "--timeout", help="Per-request timeout, s [600]."),
    max_retries: int | None = typer.Option(
        None, "--max-retries", min=0, help="Retries on 429/5xx/timeouts per request [5]."
    ),
    pass_threshold: float | None = typer.Option(
        None, "--pass-threshold", help="pass@k success: score >= this [1.0]."
    ),
    pass_metric: str | None = typer.Option(
        None, "--pass-metric", help="Metric scored for pass@k instead of the reward."
    ),
    resume: Path | None = typer.Option(
        None, "--resume", help="Run folder to complete: reruns missing or errored rollouts."
    ),
    push: bool = typer.Option(False, "--push", help="Publish the results to the hub."),
    hub: str | None = typer.Option(None, "--hub", help="Hub URL, or 'local' (with --push)."),
    config_file: Path | None = typer.Option(
        None, "--config", help="TOML file with the eval's fields (see rlkit.eval.EvalConfig)."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the resolved config and exit."),
    allow_errors: bool = typer.Option(
        False,
        "--allow-errors",
        help="Exit 0 even when rollouts errored (by default an eval with errored rollouts "
        "exits 1, after its summary).",
    ),
    reproduces: int | None = typer.Option(
        None,
        "--reproduces",
        help="With --push: post this run as a re-run of leaderboard result ID (the "
        "environment's owner or a trusted runner verifies results this way).",
    ),
) -> None:
    """Run an eval (or resume one) and print its summary: `rlkit eval ENV_ID [OPTIONS]`.

    Exit status: 0 when every rollout finished, 1 when any errored (the summary groups them by
    cause; --allow-errors exits 0), 2 on a usage error (nothing written), 130 when interrupted.

    ENV_ID is an environment id (reverse-text, owner/name@1.0), or DIST:package.module for a
    package whose load_environment is not in the module named after it. Any field of the eval
    config can also be set after it, e.g. `--sandbox.backend local`.
    """
    from rlkit.config import dump_toml
    from rlkit.eval import EvalInterrupted, load_run, run_eval
    from rlkit.eval.config import layered_eval_config
    from rlkit.eval.report import error_summary, run_summary, summary_table

    if reproduces is not None and not push:
        raise UsageError("--reproduces needs --push")
    env_id, overrides = split_env_id(list(ctx.args))
    flags = {
        "env_id": env_id,
        "model": model,
        "base_url": base_url,
        "api_key_var": api_key_var,
        "token_file": token_file,
        "num_examples": num_examples,
        "rollouts_per_example": rollouts_per_example,
        "max_concurrent": max_concurrent,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "sampling": json_object(sampling, "-S/--sampling-args"),
        "env_args": json_object(env_args, "-a/--env-args"),
        "verifiers_version": verifiers_version,
        "install": install or None,
        "output_dir": output_dir,
        "timeout": timeout,
        "max_retries": max_retries,
        "pass_threshold": pass_threshold,
        "pass_metric": pass_metric,
    }
    config = layered_eval_config(flags, resume=resume, config_file=config_file, overrides=overrides)
    if dry_run:
        typer.echo(dump_toml(config), nl=False)
        return

    err = make_console(stderr=True)
    try:
        run_dir = run_eval(config, resume=resume, console=err)
    except EvalInterrupted as exc:
        err.print(
            f"[yellow]interrupted[/]: finished rollouts are kept in {exc.run_dir}\n"
            f"resume with: rlkit eval --resume {exc.run_dir}"
        )
        raise typer.Exit(130) from None
    run = load_run(run_dir)
    console = make_console()
    console.print(summary_table(run_summary(run), title=f"{config.env_id} | {config.model}"))
    print_line(console, f"results: {run_dir}")
    errors = error_summary(run)
    for line in errors:
        print_line(console, line)
    if push:
        from rlkit.eval.publish import push_eval_results

        console.print(f"pushed: {push_eval_results(run_dir, hub, reproduces)}")
    if errors and not allow_errors:
        print_line(err, "exit status 1: rollouts errored (--allow-errors exits 0)")
        raise typer.Exit(1)


@app.command("show")
def show_cmd(
    run_dir: Path = typer.Argument(..., help="A run folder written by `rlkit eval`."),
    samples: int = typer.Option(5, "--samples", "-s", min=0, help="Rollouts to print."),
    errors: bool = typer.Option(False, "--errors", help="Only rollouts that errored."),
) -> None:
    """Print a run's summary and page through its rollouts."""
    from rlkit.eval import load_run
    from rlkit.eval.report import show_run

    show_run(make_console(), load_run(run_dir), samples=samples, errors_only=errors)
