"""A byte-level BPE tokenizer trained locally in seconds, with a Qwen3-style chat template.

Nothing is downloaded: the training corpus is built from text that ships with Python itself
(the standard library's sources and docstrings) plus a little math and arithmetic, so the
vocabulary covers code, prose, digits and LaTeX. Training is deterministic for a corpus.
"""

from __future__ import annotations

import functools
import random
import sysconfig
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
]
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"

# Qwen3-style template: system/user/assistant/tool roles, <think> reasoning, tool calls as JSON in
# <tool_call> tags, tool results in <tool_response> tags, and an optional tool list in the system.
CHAT_TEMPLATE = r"""{%- if tools %}
<|im_start|>system
{%- if messages[0].role == 'system' %}
{{ messages[0].content }}

{%- endif %}
# Tools

You may call one or more functions. Function signatures are in <tools></tools>:
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools>
Return each call as <tool_call>{"name": ..., "arguments": ...}</tool_call>.<|im_end|>
{% elif messages[0].role == 'system' %}
{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'user' %}
{{- '<|im_start|>user\n' + message.content + '<|im_end|>\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant\n' }}
{%- if message.reasoning_content %}
{{- '<think>\n' + message.reasoning_content + '\n</think>\n\n' }}
{%- endif %}
{%- if message.content %}{{- message.content }}{%- endif %}
{%- if message.tool_calls %}
{%- for call in message.tool_calls %}
{%- set fn = call.function if call.function is defined else call %}
{{- '\n<tool_call>\n{"name": "' + fn.name + '", "arguments": ' }}
{%- if fn.arguments is string %}{{- fn.arguments }}
{%- else %}{{- fn.arguments | tojson }}{%- endif %}
{{- '}\n</tool_call>' }}
{%- endfor %}
{%- endif %}
{{- '<|im_end|>\n' }}
{%- elif message.role == 'tool' %}
{{- '<|im_start|>user\n<tool_response>\n' + message.content + '\n</tool_response><|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}
{{- '<think>\n\n</think>\n\n' }}
{%- endif %}
{%- endif %}"""


def _corpus(limit_chars: int = 3_000_000) -> list[str]:
    """Deterministic local training text: stdlib sources, arithmetic, LaTeX and chat markup."""
    texts: list[str] = []
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    total = 0
    for path in sorted(stdlib.glob("*.py")):
        text = path.read_text(errors="ignore")
        texts.append(text)
        total += len(text)
        if total >= limit_chars:
            break
    rng = random.Random(0)
    for _ in range(20_000):
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        texts.append(f"{a} + {b} = {a + b}. \\boxed{{{a * b}}} \\frac{{{a}}}{{{b or 1}}}")
    texts.append("<think>\nLet me think step by step.\n</think>\n\nThe answer is")
    return texts


def train_tokenizer(vocab_size: int) -> Tokenizer:
    """A byte-level BPE of `vocab_size` entries (special tokens included). Training on the
    fixed corpus is deterministic, so a process trains each size once (~1.4 s) and hands out
    fresh copies."""
    return Tokenizer.from_str(_trained(vocab_size))


@functools.cache
def _trained(vocab_size: int) -> str:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    return tok.to_str()


def save_hf_tokenizer(tok: Tokenizer, out: Path, model_max_length: int) -> None:
    """Write the tokenizer in transformers' format with the chat template embedded."""
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        bos_token=None,
        unk_token=None,
        model_max_length=model_max_length,
        chat_template=CHAT_TEMPLATE,
        additional_special_tokens=SPECIAL_TOKENS[1:],
    )
    hf.save_pretrained(out)


def pad_vocabulary(tok: Tokenizer, vocab_size: int) -> Tokenizer:
    """`tok` with plain vocabulary entries `<|reserved_N|>` appended up to `vocab_size`, so every
    id a model of a real vocabulary samples decodes (to that text). Encoding never produces them:
    they have no merges. Real Qwen3 checkpoints likewise carry ids past their trained merges."""
    import json

    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    for i in range(tok.get_vocab_size(), vocab_size):
        vocab[f"<|reserved_{i}|>"] = i
    return Tokenizer.from_str(json.dumps(spec))
