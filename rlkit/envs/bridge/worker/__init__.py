"""Files run inside bridge worker venvs (never imported by rlkit's own process)."""
