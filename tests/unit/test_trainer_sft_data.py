"""SFT data: assistant-token masks from the chat template, row formats, step plans."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlkit.errors import UsageError
from rlkit.trainer.config import SFTDataConfig
from rlkit.trainer.sft import build_sequences, conversation, load_rows, plan_steps


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def masked_text(tokenizer, seq) -> list[str]:
    """Decode each run of mask-1 tokens."""
    runs, current = [], []
    for tok, m in zip(seq.token_ids, seq.loss_mask, strict=True):
        if m:
            current.append(tok)
        elif current:
            runs.append(tokenizer.decode(current))
            current = []
    if current:
        runs.append(tokenizer.decode(current))
    return runs


def test_mask_covers_exactly_the_assistant_turns(tokenizer) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "reverse abc"},
        {"role": "assistant", "content": "cba"},
        {"role": "user", "content": "and xyz?"},
        {"role": "assistant", "content": "zyx"},
    ]
    (seq,) = build_sequences(tokenizer, [{"messages": messages}], max_len=4096)
    assert masked_text(tokenizer, seq) == ["cba<|im_end|>\n", "zyx<|im_end|>\n"]
    full = tokenizer.apply_chat_template(messages, tokenize=False)
    assert tokenizer.decode(seq.token_ids) == full


def test_prompt_completion_rows_and_truncation(tokenizer) -> None:
    row = {
        "prompt": [{"role": "user", "content": "hi"}],
        "completion": [{"role": "assistant", "content": "hello there"}],
    }
    (seq,) = build_sequences(tokenizer, [row], max_len=4096)
    assert masked_text(tokenizer, seq) == ["hello there<|im_end|>\n"]
    (short,) = build_sequences(tokenizer, [row], max_len=len(seq.token_ids) - 2)
    assert len(short.token_ids) == len(short.loss_mask) == len(seq.token_ids) - 2


def test_bad_rows_are_named(tokenizer, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="data row 1: needs `messages`"):
        build_sequences(tokenizer, [{"messages": [{"role": "user", "content": "x"}]}, {"q": 1}], 64)
    with pytest.raises(UsageError, match="no data row has assistant tokens"):
        build_sequences(tokenizer, [{"messages": [{"role": "user", "content": "x"}]}], 64)
    with pytest.raises(UsageError, match="data row 0: messages must be a list"):
        conversation({"messages": ["just text"]}, 0)
    with pytest.raises(UsageError, match="file not found"):
        load_rows(SFTDataConfig(path=str(tmp_path / "missing.jsonl")))


def test_jsonl_rows_and_seeded_plan(tokenizer, tmp_path: Path) -> None:
    path = tmp_path / "chat.jsonl"
    rows = [
        {"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a"}]}
        for i in range(10)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = SFTDataConfig(path=str(path), epochs=2, batch_tokens=40)
    seqs = build_sequences(tokenizer, load_rows(cfg), 4096)
    plan = plan_steps(seqs, cfg, seed=0)
    assert plan == plan_steps(seqs, cfg, seed=0) != plan_steps(seqs, cfg, seed=1)
    per_epoch = len(plan) // 2
    assert sorted(i for step in plan[:per_epoch] for i in step) == list(range(10))
    assert all(sum(len(seqs[i].token_ids) for i in step) <= 40 for step in plan)
