"""A test double for reward signal: reverse-text's rows scored by difflib's LCS ratio.

reverse-text pays only for reversal work above the row's cheap answers, so an untrained tiny
model earns 0 on every rollout and a run from it has no learning signal (the watchdog stops it).
The trainer's plumbing tests (weight transports, resume, interrupts, LoRA, Muon, plugins) start
from such a model and need rewards that vary: this environment gives them the LCS ratio, which
an echo of the prompt also earns (~0.4). It fails `rlkit env audit` by design; never train a
model on it. `tests/helpers/cli.py:tiny_train_cmd` uses it; tests that train the warm-started
demo model use reverse-text itself.
"""

from __future__ import annotations

from difflib import SequenceMatcher
from typing import Any

import reverse_text

from rlkit.envs import Rubric


def load_environment(**kwargs: Any) -> reverse_text.ReverseTextEnv:
    env = reverse_text.load_environment(**kwargs)
    parser = env.parser

    def lcs_reward(completion: list[dict[str, Any]], answer: str) -> float:
        reply = parser.parse_answer(completion) or ""
        return SequenceMatcher(None, reply, answer, autojunk=False).ratio()

    def exact_match(completion: list[dict[str, Any]], answer: str) -> float:
        return float((parser.parse_answer(completion) or "") == answer)

    env.rubric = Rubric([lcs_reward, exact_match], [1.0, 0.0], parser=parser)
    env.env_id = "reverse-text-lcs"
    return env
