"""Which optional parts of rlkit are installed, and the error that names the missing extra.

The base package evaluates, authors, checks, publishes and installs environments; the trainer
(`rlkit train`, `sft`, `infer`, `model`) needs torch, transformers and peft: the `train` extra
(`cpu` / `gpu` add vLLM and include it).
"""

from __future__ import annotations

import importlib.util

from rlkit.errors import SystemRequirementError

TRAIN_MODULES = ("torch", "transformers", "peft")


def missing_train_modules() -> list[str]:
    """The trainer's modules that cannot be imported here (without importing them)."""
    missing = []
    for name in TRAIN_MODULES:
        try:
            if importlib.util.find_spec(name) is None:
                missing.append(name)
        except (ImportError, ValueError):  # a half-installed package
            missing.append(name)
    return missing


def require_train_extra(command: str) -> None:
    """Raise SystemRequirementError (exit 1) naming the extra when the trainer is not installed."""
    missing = missing_train_modules()
    if missing:
        raise SystemRequirementError(
            f"`{command}` needs rlkit's trainer, which is not installed here (missing: "
            f"{', '.join(missing)}). Install the extra: pip install 'rlkit[train]' (with vLLM: "
            "'rlkit[cpu]' on a CPU machine, 'rlkit[gpu]' on GPUs). The base package evaluates, "
            "checks, publishes and installs environments without it."
        )
