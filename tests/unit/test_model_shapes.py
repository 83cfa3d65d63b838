"""Real model shapes for `rlkit model init-tiny`: the released configs' numbers, their parameter
counts, the padded vocabulary, and the CLI's answer to a size it does not know."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rlkit_cli.model import Size
from tokenizers import Tokenizer

from rlkit.errors import UsageError
from rlkit.models import init_tiny
from rlkit.models.shapes import REAL_SHAPES, parameter_count, real_config
from rlkit.models.tiny import size_names
from rlkit.models.tokenizer import pad_vocabulary
from tests.helpers.cli import run_cli


def test_qwen3_0_6b_is_the_released_shape() -> None:
    config = real_config("qwen3-0.6b", eos_id=2, pad_id=0, max_positions=4096)
    assert (config.num_hidden_layers, config.hidden_size, config.intermediate_size) == (
        28,
        1024,
        3072,
    )
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (16, 8, 128)
    assert config.vocab_size == 151_936 and config.tie_word_embeddings
    assert (config.eos_token_id, config.pad_token_id) == (2, 0)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("medium", 64_638_848),
        ("qwen3-0.6b", 596_049_920),  # Qwen3-0.6B's model card: 0.6 B, 0.44 B non-embedding
        ("qwen3-1.7b", 1_720_574_976),
    ],
)
def test_parameter_counts(name: str, expected: int) -> None:
    assert parameter_count(real_config(name, 2, 0, 4096)) == expected


def test_moe_shape_is_qwen3_moe() -> None:
    config = real_config("qwen3-30b-a3b", 2, 0, 4096)
    assert config.model_type == "qwen3_moe"
    assert (config.num_experts, config.num_experts_per_tok) == (128, 8)
    assert not config.tie_word_embeddings


def test_cli_offers_every_size() -> None:
    assert [s.value for s in Size] == size_names() == ["tiny", "small", *REAL_SHAPES]


def test_padded_vocabulary_decodes_and_encodes_as_before(tiny_model_dir: Path) -> None:
    tok = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    padded = pad_vocabulary(tok, tok.get_vocab_size() + 500)
    assert padded.get_vocab_size() == tok.get_vocab_size() + 500
    text = "def reverse(s): return s[::-1]  <|reserved_3|>"
    assert padded.encode(text).ids == tok.encode(text).ids  # padding entries have no merges
    last = padded.get_vocab_size() - 1
    assert padded.decode([last]) == f"<|reserved_{last}|>"


def test_bad_size_exits_2_naming_the_choices(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    out = tmp_path / "m"
    code, text = run_cli(
        monkeypatch, capsys, "model", "init-tiny", "--size", "qwen3-7b", "--out", str(out)
    )
    assert code == 2
    for name in size_names():
        assert name in text
    assert not out.exists()


def test_real_size_refuses_another_arch(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="qwen3-moe shape"):
        init_tiny(tmp_path / "m", arch="qwen3", size="qwen3-30b-a3b")
    with pytest.raises(UsageError, match="qwen3-0.6b, qwen3-1.7b"):
        init_tiny(tmp_path / "m", size="qwen3-7b")
    assert not (tmp_path / "m").exists()


def test_bad_config_file_is_a_usage_error(tmp_path: Path) -> None:
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({"hidden_size": 64}))  # no model_type
    with pytest.raises(UsageError, match="config.json"):
        init_tiny(tmp_path / "m", config_file=bad)


@pytest.mark.slow
def test_config_file_builds_a_loadable_model_with_the_real_vocabulary(tmp_path: Path) -> None:
    """Any HF config.json: here a two-layer Qwen3 with Qwen3's vocabulary (trains the local
    BPE: ~10 s)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    fields = dict(REAL_SHAPES["medium"], num_hidden_layers=1, hidden_size=64, model_type="qwen3")
    fields.pop("arch")
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(fields))
    out = init_tiny(tmp_path / "m", config_file=cfg)
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    assert model.config.vocab_size == len(tok) == 151_936
    assert model.config.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    meta = json.loads((out / "rlkit_model.json").read_text())
    assert meta["size"] == "config" and meta["parameters"] == model.num_parameters()
    assert tok.decode([151_935]) == "<|reserved_151935|>"
