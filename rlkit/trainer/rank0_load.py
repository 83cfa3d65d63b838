"""Fill every rank's (sharded) model from rank 0's full state dict, one decoder layer at a time.

Rank 0's state dict is the checkpoint as transformers maps it: tensors that are views of the
safetensors file's memory mapping, whose pages become resident as they are read. Copied all at
once, the load held the whole checkpoint resident beside the whole model (docs/benchmarks.md:
LoRA's load peaked above its step). Here each layer's source pages are handed back to the kernel
once the layer is copied (they are clean file pages: read again, they fault back in), so the
load holds the model beside one layer of the checkpoint.
"""

from __future__ import annotations

import ctypes
import mmap
import re
from collections.abc import Iterable

from torch import Tensor, nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

from rlkit.trainer import dist

MADV_DONTNEED = 4  # <sys/mman.h> on Linux
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def layer_groups(names: Iterable[str]) -> list[tuple[str, list[str]]]:
    """`names` grouped by decoder layer, as (the layer's prefix `...layers.N`, its names); the
    rest (embeddings, norm, LM head) in one group with the prefix "", in order of appearance."""
    groups: dict[str, list[str]] = {}
    for name in names:
        match = _LAYER.search(name)
        groups.setdefault(name[: match.end() - 1] if match else "", []).append(name)
    return list(groups.items())


def load_from_rank0(model: nn.Module, full: dict[str, Tensor]) -> None:
    """Collective: rank 0 passes the whole state dict (consumed: emptied as it goes), the others
    `{}`. Every parameter and persistent buffer of `model` must be in rank 0's dict: a missing
    one is an error, as with a strict `load_state_dict`.

    A layer is loaded into the layer's module alone (a load into `model` would also copy every
    other tensor onto itself); the rest into `model`, once."""
    names = list(model.state_dict())
    if dist.is_main() and (missing := [n for n in names if n not in full]):
        raise RuntimeError(f"the checkpoint lacks {len(missing)} tensors, e.g. {missing[:3]}")
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=False)
    for prefix, group in layer_groups(names):
        module = model.get_submodule(prefix) if prefix else model
        cut = len(prefix) + 1 if prefix else 0
        part = {name[cut:]: full.pop(name) for name in group if name in full}
        sources = list(part.values())
        set_model_state_dict(module, part, options=options)  # fills `part` with the rest too
        release_file_pages(sources)


def file_mappings() -> list[tuple[int, int]]:
    """(start, end) of this process's mappings of regular files (from /proc/self/maps)."""
    spans = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[4] != "0" and fields[5].startswith("/"):
                start, end = fields[0].split("-")
                spans.append((int(start, 16), int(end, 16)))
    return spans


def release_file_pages(tensors: list[Tensor]) -> None:
    """Hand back the resident pages wholly inside each tensor of `tensors` that lies in a
    mapping of a file. Tensors in anonymous memory (whose pages hold the only copy of their
    data) and pages shared with a neighbouring tensor are left alone."""
    spans = file_mappings()
    page = mmap.PAGESIZE
    libc = ctypes.CDLL(None, use_errno=True)
    for tensor in tensors:
        if tensor.device.type != "cpu" or tensor.numel() == 0:
            continue
        start = tensor.data_ptr()
        end = start + tensor.numel() * tensor.element_size()
        if not any(lo <= start and end <= hi for lo, hi in spans):
            continue
        first, last = -(-start // page) * page, end // page * page
        if last > first:
            libc.madvise(ctypes.c_void_p(first), ctypes.c_size_t(last - first), MADV_DONTNEED)
