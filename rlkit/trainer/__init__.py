"""FSDP2 trainer: losses, advantages, logprobs, batches, checkpoints and weight export."""
