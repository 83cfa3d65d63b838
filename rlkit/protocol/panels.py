"""The panels of a run's plots: which `metrics.jsonl` keys are drawn together, under which title.

Shared by the orchestrator's `metrics.png` (`rlkit.orchestrator.metrics`) and the HTML report of
`rlkit runs show` (`rlkit.runs.show`), which must not import the orchestrator to read a run.
"""

# (title, keys) of the curves people look at: metrics.png and `rlkit runs show --html`
PLOT_PANELS = (
    ("reward", ("reward_mean",)),
    ("mismatch KL (k3)", ("mismatch_kl", "weights_canary_kl")),
    ("IcePop masked fraction", ("icepop_masked_low_frac", "icepop_masked_high_frac")),
    ("step time (s)", ("rollout_time_s", "train_time_s")),
    ("loss", ("loss",)),
    ("gradient norm", ("grad_norm",)),
    ("entropy (nats per token)", ("entropy",)),
    ("completion length (tokens)", ("completion_len_mean", "completion_len_max")),
    ("learning rate", ("lr",)),
    ("throughput (completion tokens/s)", ("tokens_per_s",)),
    ("errored rollouts", ("rollouts_errored",)),
)
