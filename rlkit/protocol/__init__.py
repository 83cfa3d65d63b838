"""The contract between the orchestrator and the trainer, in one place both sides import.

`layout`: the run directory's files; `batch`: the batch record and its on-disk format;
`routing`: how a batch carries MoE expert ids; `handoff`: the markers, notes and doorbells by
which the processes hand those files over. It imports nothing of the orchestrator or the trainer, so
data flows one way: orchestrator -> protocol <- trainer.
"""
