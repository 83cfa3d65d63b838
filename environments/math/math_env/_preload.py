"""Imported once by the verifier's forkserver: warms math-verify (its first check loads sympy's
LaTeX machinery, seconds of work) so every worker forked from it, including replacements for
killed ones, starts warm."""

from math_env.verify import _init_worker

_init_worker()
