"""reverse-text's long-context variant (`haystack_records`): the needle among distractor
records, the same reversal reward, gold scores 1 and every exploit (the family's and the
haystack's own: a distractor's reversal, every record listed, the key) earns nothing."""

from __future__ import annotations

import re

from reverse_text import HAYSTACK_PROMPT, SYSTEM_PROMPT, load_environment

from rlkit.envs.audit import audit_environment
from rlkit.envs.check import check_environment

ARGS = dict(haystack_records=200, num_train_examples=20, num_eval_examples=12)


def test_haystack_rows_hide_one_needle_among_distractors() -> None:
    env = load_environment(**ARGS)
    again = load_environment(**ARGS)
    rows = env.get_eval_dataset()
    assert rows[0]["question"] == again.get_eval_dataset()[0]["question"]  # deterministic
    assert env.system_prompt == HAYSTACK_PROMPT
    assert load_environment(num_train_examples=2, num_eval_examples=2).system_prompt == (
        SYSTEM_PROMPT
    )
    for row in rows:
        info = row["info"]
        lines = re.findall(r"^record (\d+): (\w+)$", row["question"], flags=re.MULTILINE)
        assert len(lines) == 200 and len({k for k, _ in lines}) == 200  # distinct keys
        assert lines[info["line"]] == (str(info["key"]), info["text"])
        assert row["question"].endswith(f"Reverse the text of record {info['key']}.")
        assert row["answer"] == info["text"][::-1]
        assert len(row["question"]) > 4000  # a few thousand tokens


def test_haystack_gold_and_audit() -> None:
    env = load_environment(**ARGS)
    report = check_environment(env, num_rows=6, gold=True)
    assert report.ok and report.summary()["gold"] == (6, 6)
    audit = audit_environment(env, num_rows=12)
    names = {e.name for e in audit.exploits}
    assert {"distractor reversed", "every record reversed", "needle key"} <= names
    assert audit.ok, [(e.name, e.problem) for e in audit.failures]
