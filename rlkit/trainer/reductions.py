"""How each trainer metric combines over micro-batches, ranks and mini-steps, declared by the
code that produces it (`declare_metrics`), so the training step needs no list of names.

A loss or a model part reports plain floats per micro-batch; the step combines them by the
metric's declared `Reduction`. A custom loss declares its own metrics the same way; an
undeclared metric is a token mean.
"""

from __future__ import annotations

from enum import Enum


class Reduction(Enum):
    """How one metric's per-micro-batch values become the step's value."""

    # counts (tokens, sequences, rejected sequences): summed everywhere
    SUM = "sum"
    # a value already divided by the whole batch's count (a loss term): summed over this rank's
    # micro-batches, averaged over ranks, token-weighted over mini-steps
    NORMALISED = "normalised"
    # a per-token statistic of the micro-batch: weighted by its tokens everywhere
    TOKEN_MEAN = "token_mean"


_DECLARED: dict[str, Reduction] = {}


def declare_metrics(reduction: Reduction, *names: str) -> None:
    """Declare that the metrics `names` combine by `reduction`; a conflicting redeclaration
    is an error (two producers must not mean different things by one name)."""
    for name in names:
        if _DECLARED.setdefault(name, reduction) is not reduction:
            raise ValueError(
                f"metric {name!r} is declared {_DECLARED[name].value}, not {reduction.value}"
            )


def reduction_of(name: str) -> Reduction:
    """The declared reduction of metric `name` (token mean when undeclared)."""
    return _DECLARED.get(name, Reduction.TOKEN_MEAN)
