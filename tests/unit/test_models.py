"""Tiny model factory: loadable by transformers, deterministic, sized as documented."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlkit.errors import UsageError
from rlkit.models import init_tiny, tokenizer


def _digest(path: Path) -> str:
    return hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()


def test_tiny_loads_and_generates(tiny_model_dir: Path) -> None:
    meta = json.loads((tiny_model_dir / "rlkit_model.json").read_text())
    assert meta["parameters"] < 1_000_000
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert model.config.head_dim == 64
    ids = tok("def reverse(s): return s[::-1]", return_tensors="pt").input_ids
    assert tok.decode(ids[0]) == "def reverse(s): return s[::-1]"
    out = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert out.shape[1] == ids.shape[1] + 4


def test_chat_template_roles_think_and_tools(tiny_model_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Add 2 and 3."},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "use the tool",
            "tool_calls": [{"function": {"name": "add", "arguments": {"a": 2, "b": 3}}}],
        },
        {"role": "tool", "content": "5"},
        {"role": "assistant", "content": "<think>\nok\n</think>\n\n5"},
    ]
    tools = [{"type": "function", "function": {"name": "add", "parameters": {}}}]
    text = tok.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=True
    )
    for piece in (
        "<|im_start|>system",
        "# Tools",
        "<tool_call>",
        '"name": "add"',
        "<tool_response>\n5",
    ):
        assert piece in text
    assert text.endswith("<|im_start|>assistant\n")
    assert "<think>" in tok.convert_ids_to_tokens(tok("<think>").input_ids)


def test_deterministic_for_seed(tmp_path: Path, tiny_model_dir: Path) -> None:
    tokenizer._trained.cache_clear()  # train again: a process keeps what it trained
    again = init_tiny(tmp_path / "again", seed=0)
    other = init_tiny(tmp_path / "other", seed=1)
    assert _digest(again) == _digest(tiny_model_dir)
    assert _digest(other) != _digest(tiny_model_dir)
    assert (again / "tokenizer.json").read_bytes() == (
        tiny_model_dir / "tokenizer.json"
    ).read_bytes()


def test_moe_and_tied_variants(tiny_moe_model_dir: Path, tmp_path: Path) -> None:
    moe = AutoModelForCausalLM.from_pretrained(tiny_moe_model_dir)
    assert moe.config.model_type == "qwen3_moe" and moe.config.num_experts == 4
    tied = AutoModelForCausalLM.from_pretrained(init_tiny(tmp_path / "tied", tie_embeddings=True))
    assert tied.lm_head.weight.data_ptr() == tied.model.embed_tokens.weight.data_ptr()
    assert moe(torch.tensor([[1, 2, 3]])).logits.shape[-1] == moe.config.vocab_size


def test_refuses_to_overwrite_and_unknown_size(tiny_model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="not empty"):
        init_tiny(tiny_model_dir)
    with pytest.raises(UsageError, match="size"):
        init_tiny(tmp_path / "x", size="huge")  # type: ignore[arg-type]
