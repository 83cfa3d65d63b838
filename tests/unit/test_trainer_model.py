"""Model loading: meta-device init + per-rank shard loading gives the checkpoint's exact weights
and logprobs; the attention kernel is chosen by device and what is installed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlkit.errors import UsageError
from rlkit.trainer import dist, model
from rlkit.trainer.config import ModelConfig
from rlkit.trainer.model import attention_implementation, load_policy
from rlkit.trainer.packing import TokenSequence, make_micro_batches
from tests.helpers.tolerance import forward_terms, summation_atol

CPU = torch.device("cpu")


def reference(model_dir: Path) -> torch.nn.Module:
    """The plain HF model in fp32: what each rank used to materialise in full."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="sdpa"
    )


@pytest.fixture
def group() -> object:
    dist.init_distributed()
    yield
    dist.close_distributed()


@pytest.mark.parametrize("arch", ["dense", "moe", "tied"])
def test_meta_init_loads_the_checkpoint_exactly(
    arch: str, tiny_model_dir: Path, tiny_moe_model_dir: Path, tmp_path: Path, group: object
) -> None:
    from rlkit.models import init_tiny

    if arch == "tied":
        model_dir = init_tiny(tmp_path / "tied", seed=0, tie_embeddings=True)
    else:
        model_dir = tiny_model_dir if arch == "dense" else tiny_moe_model_dir
    policy = load_policy(ModelConfig(path=str(model_dir)), CPU, chunk_size=16)
    ref = reference(model_dir)
    ours = {k.removeprefix("lm."): v for k, v in policy.state_dict().items()}
    expected = ref.state_dict()
    assert ours.keys() == expected.keys()
    for name, value in expected.items():
        assert not ours[name].is_meta, name
        full = dist.whole(ours[name])
        assert full.dtype == torch.float32, name
        torch.testing.assert_close(full, value, rtol=0, atol=0, msg=name)
    buffers = dict(ref.named_buffers())
    assert buffers, "the reference model has no buffers (rotary tables) to compare"
    for name, buf in policy.lm.named_buffers():
        torch.testing.assert_close(buf, buffers[name], rtol=0, atol=0, msg=name)
    lm = policy.lm
    assert (lm.lm_head.weight is lm.model.embed_tokens.weight) == (arch == "tied")


def test_meta_init_gives_the_old_paths_logprobs(tiny_model_dir: Path, group: object) -> None:
    """Packed micro-batch logprobs equal the plain HF model's, sample by sample."""
    policy = load_policy(ModelConfig(path=str(tiny_model_dir)), CPU, chunk_size=16)
    ref = reference(tiny_model_dir)
    g = torch.Generator().manual_seed(0)
    seqs = [
        TokenSequence(
            torch.randint(0, 500, (n,), generator=g).tolist(), [0, 0] + [1] * (n - 2), [0.0] * n
        )
        for n in (9, 17, 6)
    ]
    (mb,) = make_micro_batches(seqs, 64, packing=True)
    with torch.no_grad():
        lp, _ = policy(mb.input_ids, mb.position_ids, mb.flat_index, mb.targets)
        expected = []
        for i in mb.sample_ids:  # packing may reorder the samples
            ids = torch.tensor([seqs[i].token_ids])
            logits = ref(input_ids=ids).logits[0, :-1]
            token_lp = torch.log_softmax(logits, -1).gather(1, ids[0, 1:, None])[:, 0]
            expected.append(token_lp[1:])  # targets: the tokens with loss mask 1 (from the 3rd)
    expected_lp = torch.cat(expected)
    terms = forward_terms(ref.config, keys=max(len(s.token_ids) for s in seqs))
    atol = summation_atol(terms, float(expected_lp.abs().max()))  # another kernel's order
    torch.testing.assert_close(lp, expected_lp, rtol=0, atol=atol)


def test_tied_embedding_gradient_is_autograds(tmp_path: Path, group: object) -> None:
    """A tied, trained embedding's gradient (the LM head's plus the looked-up rows', added by
    `embed_into_weight_grad`'s hook) equals the plain HF model's autograd gradient over two
    accumulated micro-batches, padding tokens included (their row gets none)."""
    from rlkit.models import init_tiny

    model_dir = init_tiny(tmp_path / "tied", seed=0, tie_embeddings=True)
    policy = load_policy(ModelConfig(path=str(model_dir)), CPU, chunk_size=16)
    lm = policy.lm
    assert model.trained_tied(lm.model.embed_tokens, lm.lm_head)
    pad = lm.model.embed_tokens.padding_idx
    assert pad is not None
    ref = reference(model_dir)
    g = torch.Generator().manual_seed(0)
    batches = []
    for lengths in ((9, 17), (12, 5)):
        seqs = []
        for n in lengths:
            ids = torch.randint(0, 500, (n,), generator=g)
            ids[3] = pad  # a padding token inside a sample: the row it reads gets no gradient
            seqs.append(TokenSequence(ids.tolist(), [0, 0] + [1] * (n - 2), [0.0] * n))
        batches.append((seqs, make_micro_batches(seqs, 64, packing=True)[0]))
    lookups: list[torch.Tensor] = []  # d lp / d the looked-up rows, one sequence's at a time
    ref.model.embed_tokens.register_forward_hook(
        lambda module, args, out: None if out.register_hook(lookups.append) else None
    )
    max_term = 0.0  # the largest thing one position adds to an embedding row's gradient
    for seqs, mb in batches:
        lp, _ = policy(mb.input_ids, mb.position_ids, mb.flat_index, mb.targets)
        lp.sum().backward()
        for seq in seqs:
            ids = torch.tensor([seq.token_ids])
            out = ref(input_ids=ids, output_hidden_states=True)
            logits = out.logits[0, :-1]
            token_lp = torch.log_softmax(logits, -1).gather(1, ids[0, 1:, None])[:, 0]
            token_lp[1:].sum().backward()
            # the head's term at a position: d lp / d logit (at most 1) x its last hidden state
            max_term = max(max_term, out.hidden_states[-1].abs().max().item())
            # a lookup's term: d lp / d its row (none for the padding row)
            max_term = max(max_term, lookups.pop()[0][ids[0] != pad].abs().max().item())
    ours = lm.model.embed_tokens.weight.grad
    expected = ref.model.embed_tokens.weight.grad
    assert ours is lm.lm_head.weight.grad and expected.abs().sum() > 0
    # each row's gradient sums one head term per position and one lookup term per occurrence
    n_terms = 2 * sum(len(seq.token_ids) for seqs, _ in batches for seq in seqs)
    torch.testing.assert_close(ours, expected, rtol=0, atol=summation_atol(n_terms, max_term))


def test_attention_selection(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = torch.device("cuda", 0)  # a device object only: nothing runs on it
    auto = ModelConfig(path="m")
    assert attention_implementation(auto, CPU) == "sdpa"
    monkeypatch.setattr(model, "flash_available", lambda name: False)
    assert attention_implementation(auto, gpu) == "sdpa"  # no flash-attn package: sdpa on GPU
    with pytest.raises(UsageError, match="flash-attn package is not installed"):
        attention_implementation(ModelConfig(path="m", attention="flash_attention_2"), gpu)
    monkeypatch.setattr(model, "flash_available", lambda name: name == "flash_attention_2")
    assert attention_implementation(auto, gpu) == "flash_attention_2"
    assert attention_implementation(auto, CPU) == "sdpa"  # the CPU path never changes
    with pytest.raises(UsageError, match="needs a GPU"):
        attention_implementation(ModelConfig(path="m", attention="flash_attention_2"), CPU)
    assert attention_implementation(ModelConfig(path="m", attention="eager"), gpu) == "eager"
