"""Record the experts vLLM's MoE routers choose, per request: R3 on engines without the official
path.

vLLM returns routed experts (`--enable-return-routed-experts`) only from its V2 model runner,
which the CPU build does not use. This worker-side fallback hooks the same place the official
capturer does (`BaseRouter.capture_fn`, called with the logical expert ids right after the
router's top-k, before any expert runs) and splits each forward's rows by request using the
layout the model runner builds in `_prepare_inputs` (requests in batch order, each with its
scheduled positions). Rows are stored by position, so chunked prefill and recomputation after
preemption land where they belong; positions never forwarded (the last sampled token) stay
`UNKNOWN`. Layer indices count MoE layers only. Works in eager mode (`--enforce-eager`): a
compiled graph would not call back into Python.
"""

from __future__ import annotations

from collections import OrderedDict
from functools import partial
from typing import Any

import numpy as np
import torch

UNKNOWN = -1
CAPTURE_ROUTING_FLAG = "--rlkit-capture-routing"  # rlkit.inference.server: turn the capture on
MAX_REQUESTS = 4096  # routing of requests nobody fetched is dropped oldest first


class RequestRouting:
    """Expert ids of one request, [positions, moe_layers, top_k] int16, grown on demand."""

    def __init__(self, layers: int, top_k: int) -> None:
        self.data = np.full((64, layers, top_k), UNKNOWN, dtype=np.int16)
        self.length = 0

    def write(self, start: int, layer: int, rows: np.ndarray) -> None:
        end = start + len(rows)
        if end > len(self.data):
            grown = np.full((max(end, 2 * len(self.data)), *self.data.shape[1:]), UNKNOWN)
            grown[: len(self.data)] = self.data
            self.data = grown.astype(np.int16)
        self.data[start:end, layer] = rows
        self.length = max(self.length, end)

    def array(self) -> np.ndarray:
        return self.data[: self.length]


class RoutingCapture:
    """Installed on one worker's model runner; `take(prefix)` hands a finished request over."""

    def __init__(self, runner: Any) -> None:
        from vllm.model_executor.layers.fused_moe.layer import MoERunner
        from vllm.model_executor.layers.fused_moe.router.base_router import BaseRouter

        moe = [m for m in runner.model.modules() if isinstance(m, MoERunner)]
        if not moe or not all(isinstance(m.router, BaseRouter) for m in moe):
            raise ValueError("routing capture: the served model has no supported MoE routers")
        layer_ids = sorted({m.layer_id for m in moe})
        self.moe_index = {layer_id: i for i, layer_id in enumerate(layer_ids)}
        self.layers = len(layer_ids)
        self.top_k = int(runner.model_config.get_num_experts_per_tok())
        self.requests: OrderedDict[str, RequestRouting] = OrderedDict()
        self.layout: list[tuple[str, int, int]] | None = None  # (request, start, rows)
        self.rows = 0
        for m in moe:
            m.router.set_capture_fn(partial(self.capture, self.moe_index[m.layer_id]))
        self._wrap(runner)

    def _wrap(self, runner: Any) -> None:
        prepare, execute = runner._prepare_inputs, runner.execute_model

        def prepare_inputs(scheduler_output: Any, num_scheduled_tokens: np.ndarray, *a, **kw):
            batch = runner.input_batch
            starts = batch.num_computed_tokens_cpu[: batch.num_reqs]
            self.layout = [
                (req_id, int(start), int(n))
                for req_id, start, n in zip(
                    batch.req_ids, starts, num_scheduled_tokens, strict=True
                )
            ]
            self.rows = int(sum(n for _, _, n in self.layout))
            return prepare(scheduler_output, num_scheduled_tokens, *a, **kw)

        def execute_model(*a, **kw):
            try:
                return execute(*a, **kw)
            finally:
                self.layout = None  # warm-up and dummy forwards are never attributed

        runner._prepare_inputs = prepare_inputs
        runner.execute_model = execute_model

    def capture(self, layer: int, topk_ids: torch.Tensor) -> None:
        if self.layout is None or topk_ids.shape[0] < self.rows:
            return
        ids = topk_ids[: self.rows].to("cpu", torch.int16).numpy()
        offset = 0
        for req_id, start, n in self.layout:
            record = self.requests.get(req_id)
            if record is None:
                record = self.requests[req_id] = RequestRouting(self.layers, self.top_k)
                while len(self.requests) > MAX_REQUESTS:
                    self.requests.popitem(last=False)
            record.write(start, layer, ids[offset : offset + n])
            offset += n

    def take(self, prefix: str) -> np.ndarray | None:
        """Remove and return the routing of the request whose internal id starts with `prefix`
        (the API's response id), [positions, moe_layers, top_k]; None if unknown."""
        for req_id in list(self.requests):
            if req_id.startswith(prefix):
                return self.requests.pop(req_id).array()
        return None
