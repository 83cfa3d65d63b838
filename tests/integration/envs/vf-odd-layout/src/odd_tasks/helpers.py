"""Helpers that are not an environment (no load_environment here)."""


def shout(word: str) -> str:
    return word.upper()
