"""A verifiers environment whose reward function is broken: it looks for the answer in the
prompt instead of the reply, so every reply (empty, garbage, right) scores the maximum."""

import verifiers as vf
from datasets import Dataset


def load_environment() -> vf.Environment:
    words = ["apple", "river"]
    rows = Dataset.from_dict(
        {
            "prompt": [[{"role": "user", "content": f"Say the word: {w}"}] for w in words],
            "answer": words,
        }
    )

    def said_word(prompt, answer, **kwargs) -> float:  # the bug: prompt, not completion
        return float(answer in str(prompt))

    return vf.SingleTurnEnv(dataset=rows, rubric=vf.Rubric(funcs=[said_word], weights=[1.0]))
