"""The package's one verifiers environment, in a submodule: repeat the given word."""

import verifiers as vf
from datasets import Dataset


def load_environment(num_examples: int = 3) -> vf.Environment:
    words = ["north", "south", "east", "west"][:num_examples]
    rows = Dataset.from_dict({"prompt": [f"Say the word: {w}" for w in words], "answer": words})
    parser = vf.Parser()

    def said_word(completion, answer, **kwargs) -> float:
        return float(answer in (parser.parse_answer(completion) or ""))

    return vf.SingleTurnEnv(eval_dataset=rows, rubric=vf.Rubric(funcs=[said_word], parser=parser))
