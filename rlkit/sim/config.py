"""`[simulate]`: the simulated cluster and workload of `rlkit simulate` (ignored by `rlkit train`).

The rest of the config (`[orchestrator]`: scheduler, G, batch_groups, Omega, Phi, sigma,
max_off_policy_steps, max_steps, seed; `[[env]]`: environments and weights) is read exactly as
`rlkit train` reads it. Times are seconds of simulated time.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rlkit.config import Config


class SimConfig(Config):
    servers: int = Field(
        0, ge=0, description="Simulated inference servers N (0: inference.num_servers)."
    )
    max_seqs: int = Field(128, ge=1, description="Sequences one server decodes at once.")
    tick_base_s: float = Field(
        0.02, gt=0, description="Decode step time of a server with one running sequence."
    )
    tick_per_seq_s: float = Field(
        1.5e-4, ge=0, description="Extra decode step time per running sequence (batching cost)."
    )
    prompt_tokens: int = Field(512, ge=0, description="Prompt tokens of every request.")
    prefill_per_token_s: float = Field(
        2e-5, ge=0, description="Prefill time per prompt token; stalls the server's decoding."
    )
    update_s: float = Field(
        5.0, ge=0, description="Weight update: every server pauses this long per policy update."
    )
    update_per_seq_s: float = Field(
        0.0,
        ge=0,
        description="Extra weight-update pause per sequence the server has in flight (vLLM "
        "CPU: ~1 ms, docs/benchmarks.md).",
    )
    train_base_s: float = Field(30.0, ge=0, description="Trainer step time: fixed part.")
    train_per_token_s: float = Field(
        2e-4, ge=0, description="Trainer step time per trained completion token."
    )
    lengths: Literal["lognormal", "trace"] = Field(
        "lognormal", description="Completion lengths: lognormal with a cap, or a recorded trace."
    )
    median: float = Field(2000.0, gt=0, description="lognormal: median completion tokens.")
    sigma: float = Field(1.0, ge=0, description="lognormal: shape (tail heaviness).")
    at_cap: float = Field(
        0.05, ge=0, le=1, description="lognormal: share of completions that run to the cap."
    )
    max_tokens: int = Field(
        0, ge=0, description="Length cap (0: orchestrator.sampling.max_tokens, else 65536)."
    )
    trace: str = Field(
        "",
        description="trace: a run directory (its batches' completion lengths) or a text file "
        "with one completion length per line.",
    )
    token_unit: int = Field(
        0,
        ge=0,
        description="Real tokens per token of the simulated records (0: cap / 256, at least 1); "
        "keeps records small, Phi is counted in the same unit.",
    )
    dataset_size: int = Field(
        100_000, ge=1, description="Rows per environment the prompt sampler draws from."
    )
    lose_fraction: float = Field(
        0.0, ge=0, lt=1, description="Share of servers lost at lose_at_step (0: none)."
    )
    lose_at_step: int = Field(0, ge=0, description="Step in which the servers are lost.")
    lose_after_s: float = Field(
        0.0, ge=0, description="Seconds into that step when they go down (mid-batch if > 0)."
    )
    rejoin_at_step: int = Field(0, ge=0, description="Step at whose start they rejoin (0: never).")
    schedulers: list[str] = Field(
        default_factory=lambda: ["sync", "c3po"],
        description="Schedulers to compare (orchestrator.scheduler is added when missing).",
    )
    sweep_phi: list[float] = Field(
        default_factory=lambda: [0.5, 1.0, 2.0],
        description="Sweep: Phi as multiples of a sync batch's expected tokens.",
    )
    sweep_omega: list[float] = Field(
        default_factory=lambda: [0.5, 1.0, 2.0],
        description="Sweep: Omega as multiples of the cluster's slots (servers x max_seqs).",
    )
    sweep_sigma: list[int] = Field(
        default_factory=lambda: [1, 2, 4], description="Sweep: retention sigma values."
    )
    sweep_steps: int = Field(30, ge=2, description="Steps of each sweep run.")

    @model_validator(mode="after")
    def _consistent(self) -> SimConfig:
        if self.lengths == "trace" and not self.trace:
            raise ValueError("simulate.trace: lengths = 'trace' needs a trace path")
        if self.rejoin_at_step and self.rejoin_at_step <= self.lose_at_step:
            raise ValueError(
                f"simulate.rejoin_at_step ({self.rejoin_at_step}) must come after "
                f"simulate.lose_at_step ({self.lose_at_step})"
            )
        if self.lose_fraction and not self.lose_at_step:
            raise ValueError("simulate.lose_at_step: set the step at which servers are lost")
        return self
