"""The rollout schedulers, one file each; `rlkit.orchestrator.scheduler` is their face."""
