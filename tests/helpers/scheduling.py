"""How `bash scripts/test.sh` hands tests to its xdist workers: whole files, as `--dist loadfile`
does (a file's module fixtures stay on one worker), except that the files marked with one
`xdist_group` go to one worker together.

The files on the session's LoRA server (`lora_server`, group "lora-server") share a worker: each
worker that ran one of them would otherwise keep a LoRA engine (three processes) of its own
until the suite ends (tests/unit/test_test_tiers.py checks the files carry the mark).
"""

from __future__ import annotations

from xdist.scheduler import LoadScopeScheduling


class FilesAndGroups(LoadScopeScheduling):
    """`--dist loadgroup`'s groups (xdist suffixes a marked test's id with "@GROUP"), and every
    other test with the rest of its file."""

    def _split_scope(self, nodeid: str) -> str:
        if nodeid.rfind("@") > nodeid.rfind("]"):  # a parameter may hold an "@"
            return nodeid.rsplit("@", 1)[1]
        return nodeid.split("::", 1)[0]
