"""MoE routing: record the trainer's expert choices, replay given ones, measure disagreement.

A forward hook on every MoE router (HF `Qwen3MoeTopKRouter`-style modules returning
`(logits, scores, indices)`) either leaves the router alone or *replays* given expert ids: the
router probabilities are computed as usual, the given experts' probabilities are gathered and
renormalised exactly as the model does after its own top-k, so the forward uses the recorded
experts while the router still receives a gradient. Replaying the indices a forward chose
reproduces that forward exactly (gather of the top-k values == the top-k values).

Routing is a tensor [tokens, moe_layers, top_k] of expert ids laid out like the input ids
(`rlkit.protocol.routing`); `UNKNOWN` (-1) marks tokens without a given routing (padding, the
engine's last sampled token): there the router's own top-k is used. Layer indices count MoE
layers only.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum

import torch
from torch import Tensor, nn


class RoutingReplay(StrEnum):
    """`[trainer] routing_replay`: whose expert choices the training forward uses."""

    NONE = "none"  # the router's own top-k
    R2 = "r2"  # the trainer's own routing before the step's first update
    R3 = "r3"  # the inference engine's routing returned with each completion


def moe_routers(lm: nn.Module) -> list[nn.Module]:
    """The top-k routers of an HF MoE causal LM, in MoE-layer order (dense layers skipped)."""
    return [m for m in lm.modules() if hasattr(m, "top_k") and hasattr(m, "norm_topk_prob")]


class RouterControl:
    """Hooks on every router; holds the routing to replay and the routing last chosen.

    The routing stays set until the next `set_routing`, so activation checkpointing's recompute
    in backward replays the same experts as the forward did.
    """

    def __init__(self, lm: nn.Module) -> None:
        self.routers = moe_routers(lm)
        layers = list(getattr(getattr(lm, "model", None), "layers", None) or [])
        self.num_hidden_layers = len(layers)
        # decoder-layer index of each MoE layer: vLLM's own routed experts count every layer
        self.layer_ids = [
            i for i, layer in enumerate(layers) for m in layer.modules() if m in self.routers
        ]
        self.given: Tensor | None = None  # [tokens, layers, k]: known routing of the batch
        self.replay = False  # use `given` instead of the routers' own top-k
        self.own: list[Tensor | None] = [None] * len(self.routers)  # [tokens, k] per layer
        self.logits: list[Tensor | None] = [None] * len(self.routers)  # for the aux loss
        self.keep_logits = False
        for layer, router in enumerate(self.routers):
            router.register_forward_hook(self._hook(layer))

    @property
    def num_layers(self) -> int:
        return len(self.routers)

    @property
    def top_k(self) -> int:
        return int(self.routers[0].top_k) if self.routers else 0

    def set_routing(self, given: Tensor | None, replay: bool) -> None:
        """Routing known for the next forward (compared with the routers' own choice) and
        whether to replay it. Routing over all decoder layers (vLLM's layout) is narrowed to
        the MoE layers."""
        if (
            given is not None
            and given.shape[1] == self.num_hidden_layers != self.num_layers
            and len(self.layer_ids) == self.num_layers
        ):
            given = given[:, self.layer_ids]
        if given is not None and given.shape[1:] != (self.num_layers, self.top_k):
            raise ValueError(
                f"routing has shape {tuple(given.shape)}, the model has {self.num_layers} MoE "
                f"layers with top_k {self.top_k}"
            )
        self.given = given
        self.replay = replay and given is not None

    def _hook(self, layer: int):
        def hook(module: nn.Module, args: tuple, output: tuple) -> tuple | None:
            logits, _, indices = output
            self.own[layer] = indices.detach()
            self.logits[layer] = logits if self.keep_logits else None
            if not self.replay:
                return None
            chosen = self._chosen(layer, indices)
            return logits, replay_weights(module, logits, chosen), chosen

        return hook

    def _chosen(self, layer: int, own: Tensor) -> Tensor:
        """The experts the forward uses in `layer`: the given ones where known, else `own`."""
        if not self.replay or self.given is None:
            return own
        given = self.given[:, layer].to(own.device)
        return torch.where(given[:, :1] >= 0, given, own)

    def own_routing(self) -> Tensor:
        """The routers' own top-k of the last forward, [tokens, layers, k]."""
        return torch.stack([t for t in self.own if t is not None], dim=1)

    def disagreement(self, valid: Tensor) -> tuple[float, float]:
        """(token-layer pairs whose own top-k set differs from the given one, pairs known)
        over the positions `valid` ([tokens] bool) of the last forward."""
        if self.given is None or not self.routers:
            return 0.0, 0.0
        given = self.given.to(valid.device)[valid]
        own = self.own_routing()[valid]
        known = given[..., 0] >= 0
        differ = (own.sort(-1).values != given.sort(-1).values).any(-1) & known
        return float(differ.sum()), float(known.sum())

    def aux_loss(self, valid: Tensor, total: Callable[[Tensor], Tensor] | None = None) -> Tensor:
        """Switch-style load-balancing loss, mean over MoE layers, on the `valid` positions:
        num_experts * sum_e (fraction of routed slots to e) * (mean router probability of e).

        `total` (context parallelism: a sum over the ranks that split the rows, differentiable)
        turns this rank's per-expert sums into the whole rows' before the fractions and means
        are taken, so every rank gets the loss of the whole rows; without it the positions here
        are the whole rows."""
        losses = []
        for layer, router in enumerate(self.routers):
            logits, own = self.logits[layer], self.own[layer]
            if logits is None or own is None:
                raise RuntimeError("aux_loss needs keep_logits = True during the forward")
            chosen = self._chosen(layer, own)
            probs = torch.softmax(logits.float(), dim=-1)[valid]
            slots = nn.functional.one_hot(chosen[valid], router.num_experts).float()
            # [E] routed slots, [E] probability sums, [1] tokens: all sums over positions
            counts = torch.cat([slots.sum((0, 1)), probs.new_tensor([probs.shape[0]])])
            prob_sum = probs.sum(0)
            if total is not None:
                counts, prob_sum = total(counts), total(prob_sum)
            tokens = counts[-1].clamp(min=1)
            fraction = counts[:-1] / (tokens * chosen.shape[-1])
            losses.append(router.num_experts * (fraction * prob_sum / tokens).sum())
        return torch.stack(losses).mean()


def replay_weights(router: nn.Module, logits: Tensor, chosen: Tensor) -> Tensor:
    """The routing weights of experts `chosen` [tokens, k], computed as the router does."""
    probs = torch.softmax(logits, dtype=torch.float, dim=-1)
    weights = probs.gather(1, chosen)
    if router.norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(logits.dtype)
