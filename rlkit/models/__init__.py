"""Tiny model and tokenizer factory for tests and demos (no downloads)."""

from rlkit.models.tiny import init_tiny

__all__ = ["init_tiny"]
