"""Row normalisation (`rlkit.envs.rows`) and the row shapes a native environment accepts."""

from __future__ import annotations

import pytest
from datasets import Dataset

from rlkit.envs.environment import format_dataset
from rlkit.envs.rows import RowError, format_row, prompt_messages
from rlkit.errors import UsageError


def test_string_prompt_is_one_user_message_after_the_system_prompt() -> None:
    assert prompt_messages({"prompt": "hi"}, 0) == [{"role": "user", "content": "hi"}]
    assert prompt_messages({"prompt": "hi"}, 0, "be brief") == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
    ]


def test_question_and_system_prompt_and_list_prompts() -> None:
    assert prompt_messages({"question": "2+2?"}, 3, "sys") == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "2+2?"},
    ]
    # a list prompt gets the system prompt unless it already starts with one (verifiers 0.2)
    listed = [{"role": "user", "content": "x", "tool_calls": None}]
    assert prompt_messages({"prompt": listed}, 0, "sys")[0] == {"role": "system", "content": "sys"}
    own = [{"role": "system", "content": "mine"}, {"role": "user", "content": "x"}]
    assert prompt_messages({"prompt": own}, 0, "sys") == own
    # a row with an empty prompt cell falls back to its question (mixed datasets)
    assert prompt_messages({"prompt": None, "question": "q"}, 0)[0]["content"] == "q"


def test_missing_fields_get_defaults() -> None:
    row = format_row({"prompt": "p"}, 7)
    assert row == {
        "prompt": [{"role": "user", "content": "p"}],
        "answer": "",
        "info": {},
        "example_id": 7,
    }
    row = format_row({"prompt": "p", "answer": 4, "info": '{"a": 1}', "example_id": "x9"}, 0)
    assert (row["answer"], row["info"], row["example_id"]) == ("4", {"a": 1}, "x9")


@pytest.mark.parametrize(
    ("row", "field", "problem"),
    [
        ({"answer": "a"}, "prompt", "is missing (and there is no 'question')"),
        ({"prompt": 5}, "prompt", "must be text or a list of chat messages, got int"),
        ({"prompt": []}, "prompt", "is an empty list of messages"),
        ({"prompt": ["hello"]}, "prompt[0]", "must be a chat message with a 'role'"),
        ({"prompt": [{"content": "no role"}]}, "prompt[0]", "must be a chat message"),
        ({"question": ["a"]}, "question", "must be text, got list"),
        ({"prompt": "p", "info": "{not json"}, "info", "is text but not JSON"),
        ({"prompt": "p", "info": [1]}, "info", "must be a dict, got list"),
    ],
)
def test_rows_verifiers_rejects_name_the_row_and_field(row, field, problem) -> None:
    with pytest.raises(RowError) as info:
        format_row({**row, "example_id": 42}, 3)
    assert str(info.value).startswith(f"dataset row 3 (example_id 42): field {field!r} {problem}")
    assert isinstance(info.value, UsageError)  # the CLI prints it and exits 2


def test_format_dataset_takes_string_prompt_columns() -> None:
    rows = Dataset.from_dict({"prompt": ["a", "b"], "answer": ["1", "2"]})
    formatted = list(format_dataset(rows, "sys"))
    assert formatted[1]["prompt"] == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "b"},
    ]
    assert [r["example_id"] for r in formatted] == [0, 1]
    with pytest.raises(RowError, match="dataset row 0: field 'prompt' is an empty list"):
        format_dataset(Dataset.from_dict({"prompt": [[]], "answer": ["x"]}))
