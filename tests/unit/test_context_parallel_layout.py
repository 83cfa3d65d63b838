"""Context parallelism's pieces in one process (`rlkit.trainer.context_parallel`): the row
layout, the micro-batch split, and the attention of each rank of a group of N, with the K/V
exchange replaced by the other ranks' tensors, against one dense masked attention of the row.
The collectives themselves run in tests/integration/test_context_parallel.py."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from rlkit.errors import UsageError
from rlkit.trainer import context_parallel as cp
from rlkit.trainer.packing import TokenSequence, make_micro_batches


def test_mesh_shape_and_description():
    assert cp.mesh_shape(4, 2) == (2, 2)
    assert cp.mesh_shape(3, 1) == (3, 1)
    with pytest.raises(UsageError, match="context_parallel = 2 must divide .* world size 3"):
        cp.mesh_shape(3, 2)
    line = cp.describe_mesh(4, 2)
    assert "data parallel 2 x context parallel 2" in line and "FSDP2 shards over all 4" in line


@pytest.mark.parametrize("size", [1, 2, 3])
def test_columns_cover_the_row_with_equal_causal_work(size: int):
    length = 12 * size
    cols = [cp.local_columns(length, r, size) for r in range(size)]
    assert sorted(torch.cat(cols).tolist()) == list(range(length))
    # query-key pairs under the causal mask: sum of (position + 1) over the rank's queries
    work = {int((c + 1).sum()) for c in cols}
    assert len(work) == 1


def test_document_ids_restart_where_positions_do_not_count_up():
    # transformers' find_packed_sequence_indices: a new sample wherever the step is not +1
    pos = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]])
    expected = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2, 2, 2], [0] * 10])
    assert torch.equal(cp.document_ids(pos), expected)


def _batch(packing: bool):
    g = torch.Generator().manual_seed(0)
    seqs = []
    for prompt, completion in [(5, 30), (3, 17), (8, 11)]:
        n = prompt + completion
        seqs.append(
            TokenSequence(
                torch.randint(0, 50, (n,), generator=g).tolist(),
                [0] * prompt + [1] * completion,
                [0.0] * n,
            )
        )
    return make_micro_batches(seqs, 100, packing)[0]


@pytest.mark.parametrize("packing", [True, False])
@pytest.mark.parametrize("size", [2, 3])
def test_shards_hold_every_target_once(packing: bool, size: int):
    mb = _batch(packing)
    shards = [cp.shard_micro_batch(mb, cp.ContextGroup(size, r)) for r in range(size)]
    slots = sorted((int(s), int(t)) for sh in shards for s, t in zip(*sh.target_slot, strict=True))
    assert slots == sorted(zip(*(x.tolist() for x in mb.target_slot), strict=True))
    rows, length = mb.input_ids.shape
    for sh in shards:
        assert sh.padded_length % (2 * size) == 0 and sh.length == length
        # each local target sits where the whole row has it, and predicts the same token
        local = sh.input_ids.flatten()
        assert sh.flat_index.numel() == sh.targets.numel()
        cols = cp.local_columns(sh.padded_length, sh.rows.chunks[0], size)
        whole = mb.input_ids.flatten()
        for flat, target in zip(sh.flat_index.tolist(), sh.targets.tolist(), strict=True):
            row, col = divmod(flat, cols.numel())
            assert local[flat] == whole[row * length + cols[col]]
            assert target == whole[row * length + cols[col] + 1]


def _dense_reference(q, k, v, position_ids):
    """The whole row's attention with transformers' packed causal mask (one process)."""
    docs = cp.document_ids(position_ids)
    n = q.shape[2]
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    mask = causal[None] & (docs[:, :, None] == docs[:, None, :])
    repeat = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(repeat, 1), v.repeat_interleave(repeat, 1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None])


class _Module(torch.nn.Module):
    pass


@pytest.mark.parametrize("size", [1, 2, 3])
@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("kernel", ["lse", "masked"])
def test_each_rank_attends_like_the_whole_row(
    size: int, packed: bool, kernel: str, monkeypatch: pytest.MonkeyPatch
):
    """Both paths: CPU's flash blocks merged by log-sum-exp, and the masked sdpa that devices
    without that kernel (GPU) take."""
    if kernel == "masked":
        monkeypatch.setattr(cp, "_lse_kernel", lambda device, dtype: False)
    length = 24 * size
    g = torch.Generator().manual_seed(size)
    q = torch.randn(2, 4, length, 8, generator=g)
    k, v = torch.randn(2, 2, length, 8, generator=g), torch.randn(2, 2, length, 8, generator=g)
    if packed:
        cuts = [0, 7, 7 + length // 2, length]
        pos = torch.cat([torch.arange(b - a) for a, b in zip(cuts, cuts[1:], strict=False)])
        position_ids = torch.stack([pos, torch.arange(length)])
    else:
        position_ids = torch.arange(length).repeat(2, 1)
    reference = _dense_reference(q, k, v, position_ids)
    columns = [cp.local_columns(length, r, size) for r in range(size)]
    docs = cp.document_ids(position_ids)
    for rank in range(size):
        local_k, local_v = k[:, :, columns[rank]], v[:, :, columns[rank]]

        def gathered(x, group, _k=local_k):  # every rank's part, as all_gather returns them
            whole = k if x is _k else v
            return torch.stack([whole[:, :, c] for c in columns])

        monkeypatch.setattr(cp, "_all_gather", gathered)
        group = cp.ContextGroup(size, rank)
        rows = cp.RowAttention(group, docs, cp.chunks_of(rank, size), length // (2 * size))
        out, _ = cp.attention(_Module(), q[:, :, columns[rank]], local_k, local_v, None, rows=rows)
        torch.testing.assert_close(out.transpose(1, 2), reference[:, :, columns[rank]])


@pytest.mark.parametrize("size", [1, 2, 3])
def test_block_attention_gradients_match_the_whole_row(size: int):
    """Each rank's block attention (flash blocks merged by log-sum-exp, no mask) has the dense
    masked attention's gradients for its queries and all keys: packed rows whose documents start
    inside a chunk, exactly at a chunk boundary and span several chunks, one row per layout,
    and rows sharing one layout (padded), GQA (8 query / 2 key-value heads)."""
    length = 24 * size
    c = length // (2 * size)
    g = torch.Generator().manual_seed(10 + size)
    cuts = [0, 5, c, c + 3, length - 2, length]  # a document begins at chunk 1's first token
    pos = torch.cat([torch.arange(b - a) for a, b in zip(cuts, cuts[1:], strict=False)])
    other = torch.cat([torch.arange(7), torch.arange(length - 7)])
    layouts = {
        "packed": torch.stack([pos, torch.arange(length), other]),
        "padded": torch.arange(length).repeat(3, 1),
    }
    for name, position_ids in layouts.items():
        q = torch.randn(3, 8, length, 16, generator=g, requires_grad=True)
        k = torch.randn(3, 2, length, 16, generator=g, requires_grad=True)
        v = torch.randn(3, 2, length, 16, generator=g, requires_grad=True)
        weight = torch.randn(3, 8, length, 16, generator=g)
        reference = _dense_reference(q, k, v, position_ids)
        docs = cp.document_ids(position_ids)
        for rank in range(size):
            cols = cp.local_columns(length, rank, size)
            loss = (reference[:, :, cols] * weight[:, :, cols]).sum()
            want, want_k, want_v = torch.autograd.grad(loss, (q, k, v), retain_graph=True)
            local_q = q.detach()[:, :, cols].requires_grad_()
            kk, vv = k.detach().requires_grad_(), v.detach().requires_grad_()
            # group None: no exchange, the whole row's K/V given; the rank's query chunks
            rows = cp.RowAttention(None, docs, cp.chunks_of(rank, size), c)
            out, _ = cp.attention(_Module(), local_q, kk, vv, None, rows=rows)
            torch.testing.assert_close(out.transpose(1, 2), reference[:, :, cols], msg=name)
            (out.transpose(1, 2) * weight[:, :, cols]).sum().backward()
            torch.testing.assert_close(local_q.grad, want[:, :, cols], msg=name)
            torch.testing.assert_close(kk.grad, want_k, msg=name)
            torch.testing.assert_close(vv.grad, want_v, msg=name)


def test_the_plan_masks_nothing_and_blocks_cross_no_document():
    """Blocks are causal squares or unmasked rectangles inside one document."""
    position_ids = torch.cat([torch.arange(10), torch.arange(14)])[None]
    rows = cp.RowAttention(None, cp.document_ids(position_ids), (0, 3), 6)
    plan = rows.plan()
    docs = rows.documents[0]
    for blocks in plan:
        for x in blocks:
            assert len(set(docs[x.k0 : x.k1].tolist())) == 1  # inside one document
            assert not x.causal or x.k1 - x.k0 == x.q1 - x.q0  # a square
    # chunk 3 (positions 18-23) lies in the second document (10-23): its keys 10-17 unmasked
    assert [(x.k0, x.k1, x.causal) for x in plan[-1]] == [(10, 18, False), (18, 24, True)]
    assert rows._masks == {}


def test_unsplit_rows_run_one_chunk_causally():
    q, k, v = (torch.randn(1, 2, 10, 4) for _ in range(3))
    pos = torch.arange(10)[None]
    rows = cp.unsplit_rows(pos)
    assert rows.mask(0, q.dtype, q.device) is None  # plain is_causal
    out, _ = cp.attention(_Module(), q, k, v, None, rows=rows)
    torch.testing.assert_close(out.transpose(1, 2), _dense_reference(q, k, v, pos))


def test_attention_needs_the_rows():
    x = torch.randn(1, 1, 4, 4)
    with pytest.raises(RuntimeError, match="rows"):
        cp.attention(_Module(), x, x, x, None)


def test_router_aux_loss_with_context_parallel_is_accepted():
    """The load-balancing loss of split rows sums its per-expert counts over the context group
    (exactness: tests/integration/test_context_parallel.py, case moe-r3-aux)."""
    from rlkit.trainer.config import TrainerSettings

    cfg = TrainerSettings(context_parallel=2, router_aux_loss_coef=0.01)
    assert (cfg.context_parallel, cfg.router_aux_loss_coef) == (2, 0.01)


TRAIN_CONFIG = """
[model]
path = "/nonexistent/model"
[[env]]
id = "math"
[orchestrator]
c3po.token_budget = 512
sampling = { max_tokens = 64 }
"""


def test_dry_run_prints_the_mesh(
    tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
):
    import tomllib

    from tests.helpers.cli import run_cli

    path = tmp_path / "train.toml"
    path.write_text(TRAIN_CONFIG)
    args = ["--trainer.nproc_per_node", "4", "--trainer.context_parallel", "2"]
    code, out = run_cli(
        monkeypatch, capsys, "train", str(path), "--role", "trainer", "--dry-run", *args
    )
    assert code in (0, None), out
    assert "trainer mesh: 4 rank(s) = data parallel 2 x context parallel 2" in out
    toml = "\n".join(line for line in out.splitlines() if not line.startswith("trainer mesh"))
    assert tomllib.loads(toml)["trainer"]["context_parallel"] == 2


def test_a_mesh_that_does_not_divide_is_a_config_error(
    tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
):
    from tests.helpers.cli import run_cli

    path = tmp_path / "train.toml"
    path.write_text(TRAIN_CONFIG)
    args = ["--trainer.nproc_per_node", "3", "--trainer.context_parallel", "2"]
    code, out = run_cli(monkeypatch, capsys, "train", str(path), "--dry-run", *args)
    assert code == 2
    assert "trainer.context_parallel (2) must divide" in out and "= 3" in out
