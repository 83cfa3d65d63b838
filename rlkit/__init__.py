"""rlkit: environment-hub-centric RL toolkit for language models."""

__version__ = "0.1.0"
