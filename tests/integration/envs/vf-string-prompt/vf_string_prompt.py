"""A single-turn verifiers environment whose rows hold a plain-string `prompt`.

Written against the API every load_environment era shares (`vf.SingleTurnEnv`, `vf.Rubric`,
`vf.Parser.parse_answer`): the rows are `{"prompt": "Say the word: apple", "answer": "apple"}`,
no system prompt (verifiers 0.2 refuses a system prompt beside string prompts). Rewards: the
answer word in the reply (weight 1) and a brevity score 1 / (number of words) when the word is
there (weight 0.5), so replies of different lengths score differently. Row `info` holds the
reply a perfect model gives (`gold_completion`), which `rlkit env check --gold` plays.
"""

import verifiers as vf
from datasets import Dataset

WORDS = ["apple", "river", "stone", "cloud", "maple", "tiger", "amber", "lemon"]


def load_environment(num_examples: int = 4) -> vf.Environment:
    words = [WORDS[i % len(WORDS)] for i in range(num_examples)]
    rows = Dataset.from_dict(
        {
            "prompt": [f"Say the word: {w}" for w in words],
            "answer": words,
            "info": [{"gold_completion": w} for w in words],
        }
    )
    parser = vf.Parser()

    def said_word(completion, answer, **kwargs) -> float:
        return float(answer in (parser.parse_answer(completion) or ""))

    def brevity(completion, answer, **kwargs) -> float:
        reply = parser.parse_answer(completion) or ""
        return 1.0 / len(reply.split()) if answer in reply else 0.0

    rubric = vf.Rubric(funcs=[said_word, brevity], weights=[1.0, 0.5], parser=parser)
    return vf.SingleTurnEnv(dataset=rows, eval_dataset=rows, parser=parser, rubric=rubric)
