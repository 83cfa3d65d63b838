"""Evaluation runs: any model behind an OpenAI-compatible API on any environment.

`run_eval(EvalConfig(...))` writes a run directory (`metadata.json` + `results.jsonl`) and
returns its path; `load_run` reads one back; `summarize` and `pass_at_k` are the metrics.
"""

from rlkit.eval.config import EvalConfig
from rlkit.eval.metrics import pass_at_k, summarize
from rlkit.eval.runner import EvalInterrupted, run_eval, run_eval_async
from rlkit.eval.store import EvalResult, EvalRun, RunMetadata, load_run

__all__ = [
    "EvalConfig",
    "EvalInterrupted",
    "EvalResult",
    "EvalRun",
    "RunMetadata",
    "load_run",
    "pass_at_k",
    "run_eval",
    "run_eval_async",
    "summarize",
]
