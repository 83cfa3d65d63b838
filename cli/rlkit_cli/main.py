"""The `rlkit` command: a thin typer application that parses, validates and calls rlkit.*."""

from __future__ import annotations

import atexit
import os
import sys

import typer

from rlkit.errors import RunStopped, SystemRequirementError, UsageError
from rlkit.progress import make_console, print_error

# `rlkit --help` lists commands in a newcomer's order: write an environment, evaluate a model on
# it, train, read the run's report (publishing is `env push`); then the operator's commands
NEWCOMER_ORDER = ("env", "eval", "train", "runs", "simulate", "sft", "infer", "model", "hub")


class NewcomerOrder(typer.core.TyperGroup):
    def list_commands(self, ctx: typer.Context) -> list[str]:  # type: ignore[override]
        names = list(self.commands)
        rank = {name: i for i, name in enumerate(NEWCOMER_ORDER)}
        return sorted(names, key=lambda name: (rank.get(name, len(rank)), names.index(name)))


app = typer.Typer(
    name="rlkit",
    cls=NewcomerOrder,
    help="rlkit: environments, evaluation, a hub and an async RL trainer for language models.\n\n"
    "\b\nA first session:\n"
    "  rlkit env init my-env                         an environment package\n"
    "  rlkit env check ./my-env --gold               gold answers score the top reward\n"
    "  rlkit eval ./my-env -m MODEL --base-url URL   evaluate a model behind an API\n"
    "  rlkit train CONFIG.toml                       RL (needs rlkit[train])\n"
    "  rlkit runs show RUN_DIR                       read the run's report\n"
    "  rlkit env push ./my-env                       publish to the hub",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
err_console = make_console(stderr=True)


def _register() -> None:
    """Attach every sub-command module; each owns one verb or verb group."""
    from rlkit_cli import model

    app.add_typer(model.app, name="model")
    from rlkit_cli import infer

    app.command(
        name="infer", context_settings={"allow_extra_args": True, "ignore_unknown_options": True}
    )(infer.infer)
    from rlkit_cli import eval as eval_cli

    app.add_typer(eval_cli.app, name="eval")
    from rlkit_cli import train

    app.command(
        name="train", context_settings={"allow_extra_args": True, "ignore_unknown_options": True}
    )(train.train)
    from rlkit_cli import env as env_cli
    from rlkit_cli import hub as hub_cli

    app.add_typer(env_cli.app, name="env")
    app.add_typer(hub_cli.app, name="hub")
    from rlkit_cli import sandbox as sandbox_cli

    app.add_typer(sandbox_cli.app, name="sandbox")
    from rlkit_cli import runs as runs_cli

    app.add_typer(runs_cli.app, name="runs")
    from rlkit_cli import sft

    app.command(
        name="sft", context_settings={"allow_extra_args": True, "ignore_unknown_options": True}
    )(sft.sft)
    from rlkit_cli import simulate

    app.command(
        name="simulate",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )(simulate.simulate)


_register()


def plain_help(typer_app: typer.Typer) -> None:
    """Help rendered as written, every word kept: rich markup would read `[section]` names,
    `[bwrap]` defaults and `[OPTIONS]` as tags and drop them (`Sandbox backend .`), so no
    command's help is parsed as markup; click also prints each usage line with its arguments."""
    typer_app.rich_markup_mode = None
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            plain_help(group.typer_instance)


plain_help(app)


def quiet_triton_teardown() -> None:
    """Exit handler: once triton is loaded (transformers imports it through torch._dynamo),
    its nanobind bindings print a "nanobind: leaked ... functions" report at interpreter
    teardown, ~30 lines after every `rlkit train`. Registered first, it runs after every other
    exit handler and points stderr at /dev/null for the teardown alone, as triton does for its
    own compile workers (`triton/_compile_warmup_pool.py`)."""
    if "triton" in sys.modules:
        sys.stderr.flush()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)


def main() -> None:
    """Console-script entry point: UsageError becomes a one-line message and exit code 2, a
    missing system component (SystemRequirementError) or a run that stopped itself (RunStopped)
    one with exit code 1.

    Typer runs in standalone mode, so its own usage errors already exit with code 2.
    """
    atexit.unregister(quiet_triton_teardown)  # once, however often tests call main()
    atexit.register(quiet_triton_teardown)
    try:
        app()
    except UsageError as exc:
        print_error(err_console, exc)
        sys.exit(2)
    except (SystemRequirementError, RunStopped) as exc:
        print_error(err_console, exc)
        sys.exit(1)


if __name__ == "__main__":
    main()
