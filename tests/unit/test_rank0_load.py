"""Rank 0's checkpoint copied into the model one decoder layer at a time, its file pages handed
back as it goes (`rlkit.trainer.rank0_load`)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch import nn

from rlkit.trainer import dist
from rlkit.trainer.rank0_load import layer_groups, load_from_rank0, release_file_pages


def rss_file_kb() -> int:
    status = Path("/proc/self/status").read_text()
    return int(re.search(r"RssFile:\s+(\d+)", status).group(1))


def test_layers_are_grouped_and_the_rest_stays_together() -> None:
    names = ["m.embed.weight", "m.layers.0.a", "m.layers.0.b", "m.layers.1.a", "m.norm.weight"]
    assert layer_groups(names) == [
        ("", ["m.embed.weight", "m.norm.weight"]),
        ("m.layers.0", ["m.layers.0.a", "m.layers.0.b"]),
        ("m.layers.1", ["m.layers.1.a"]),
    ]


def test_file_pages_are_handed_back_and_anonymous_memory_is_left_alone(tmp_path: Path) -> None:
    values = torch.arange(8 * 1024 * 1024, dtype=torch.float32)  # 32 MiB
    path = tmp_path / "weights.bin"
    values.numpy().tofile(path)
    mapped = torch.from_file(str(path), shared=True, size=values.numel(), dtype=torch.float32)
    assert torch.equal(mapped, values)  # every page read: resident
    before = rss_file_kb()
    release_file_pages([mapped])
    assert before - rss_file_kb() > 30 * 1024  # the 32 MiB of file pages are no longer resident
    assert torch.equal(mapped, values)  # read again, they fault back in from the file
    anonymous = values.clone()
    release_file_pages([anonymous])
    assert torch.equal(anonymous, values)  # not a file's pages: untouched


@pytest.fixture
def group() -> object:
    dist.init_distributed()
    yield
    dist.close_distributed()


def test_every_tensor_is_loaded_and_a_missing_one_is_an_error(group: object) -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.Sequential(nn.Linear(4, 2)))
    model.layers = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)])
    source = {name: torch.randn_like(t) for name, t in model.state_dict().items()}
    full = dict(source)
    load_from_rank0(model, full)
    assert full == {}  # consumed
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, source[name]), name
    lacking = {k: v for k, v in source.items() if k != "layers.1.bias"}
    with pytest.raises(RuntimeError, match=r"lacks 1 tensors, e\.g\. \['layers\.1\.bias'\]"):
        load_from_rank0(model, lacking)
