"""MoE routing as a batch carries it: the inference engine's expert ids per token (R3).

Routing is an array [tokens, moe_layers, top_k] of expert ids laid out like the sample's token
ids; `UNKNOWN` (-1) marks tokens without a known routing (the engine's last sampled token,
padding), where the trainer's router uses its own top-k. In a batch file it is stored as
little-endian int16 bytes with its (moe_layers, top_k) beside it (`TrainSample.routing_dims`).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

UNKNOWN = -1


def encode_routing(routing: np.ndarray) -> bytes:
    """[tokens, moe_layers, top_k] expert ids as little-endian int16 bytes (UNKNOWN = -1)."""
    return np.ascontiguousarray(routing, dtype="<i2").tobytes()


def decode_routing(data: bytes, dims: tuple[int, int]) -> Tensor:
    """`encode_routing`'s bytes back to a [tokens, moe_layers, top_k] long tensor."""
    flat = np.frombuffer(data, dtype="<i2").astype(np.int64)
    return torch.from_numpy(flat.reshape(-1, *dims))
