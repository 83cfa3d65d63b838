"""Names that moved keep working at their old import path for one release, with a warning."""

from __future__ import annotations

import importlib

import pytest

from rlkit.eval import publish
from rlkit.launch import config as train_config
from rlkit.orchestrator import config as orchestrator_config
from rlkit.orchestrator import scheduler

MOVED = [
    ("rlkit.orchestrator.config", "check_environments", train_config.check_environments),
    ("rlkit.orchestrator.config", "EvalConfig", orchestrator_config.OnlineEvalConfig),
    ("rlkit.orchestrator.scheduler", "Accept", scheduler.ProcessGroup),
    ("rlkit.hub", "push_eval_results", publish.push_eval_results),
]


@pytest.mark.parametrize(("module", "name", "new"), MOVED)
def test_old_import_path_warns_and_returns_the_new_object(module: str, name: str, new: object):
    with pytest.warns(DeprecationWarning, match=f"{module}.{name} moved to"):
        assert getattr(importlib.import_module(module), name) is new


def test_unknown_names_still_raise_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        importlib.import_module("rlkit.orchestrator.config").Nope  # noqa: B018
