"""The trainer processes' allocator (`rlkit.trainer.allocator`): which `LD_PRELOAD` each choice
gives, and that the process really runs with it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rlkit.errors import UsageError
from rlkit.trainer import allocator
from rlkit.trainer.allocator import AUTO_ORDER, PACKAGES, find_allocator, with_allocator
from tests.helpers.system import require_system

TC, JE = "libtcmalloc_minimal.so.4", "libjemalloc.so.2"


def installed(monkeypatch: pytest.MonkeyPatch, **libraries: str) -> None:
    """Pretend exactly these allocators are installed."""
    monkeypatch.setattr(allocator, "find_allocator", lambda name: libraries.get(name))


def test_auto_prefers_tcmalloc_then_jemalloc(monkeypatch: pytest.MonkeyPatch) -> None:
    installed(monkeypatch, tcmalloc=TC, jemalloc=JE)
    assert with_allocator({}, "auto", cuda=False)["LD_PRELOAD"] == TC
    assert with_allocator({}, "jemalloc", cuda=False)["LD_PRELOAD"] == JE
    installed(monkeypatch, jemalloc=JE)
    assert with_allocator({}, "auto", cuda=False)["LD_PRELOAD"] == JE
    kept = with_allocator({"LD_PRELOAD": "/opt/libtrace.so"}, "auto", cuda=False)
    assert kept["LD_PRELOAD"] == f"{JE}:/opt/libtrace.so"


def test_auto_leaves_a_gpu_trainer_on_the_system_allocator(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    installed(monkeypatch, tcmalloc=TC, jemalloc=JE)
    assert with_allocator({"A": "1"}, "auto", cuda=True) == {"A": "1"}
    assert with_allocator({}, "jemalloc", cuda=True)["LD_PRELOAD"] == JE


def test_tcmalloc_does_not_report_large_allocations(monkeypatch: pytest.MonkeyPatch) -> None:
    installed(monkeypatch, tcmalloc=TC)
    env = with_allocator({}, "auto", cuda=False)
    assert int(env["TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD"]) >= 1 << 40
    own = with_allocator({"TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD": "5"}, "auto", cuda=False)
    assert own["TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD"] == "5"


def test_system_and_a_users_own_allocator_are_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    installed(monkeypatch, tcmalloc=TC, jemalloc=JE)
    assert with_allocator({"A": "1"}, "system", cuda=False) == {"A": "1"}
    own = {"LD_PRELOAD": "/usr/lib/libmimalloc.so.2"}
    assert with_allocator(own, "auto", cuda=False) == own
    assert with_allocator(own, "tcmalloc", cuda=False) == own


def test_a_missing_allocator_falls_back_on_auto_and_is_an_error_when_asked_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    installed(monkeypatch)
    assert with_allocator({"A": "1"}, "auto", cuda=False) == {"A": "1"}
    for name in AUTO_ORDER:
        with pytest.raises(UsageError, match=PACKAGES[name]):
            with_allocator({}, name, cuda=False)


@pytest.mark.system
@pytest.mark.parametrize("choice", ["auto", "tcmalloc", "jemalloc", "system"])
def test_the_process_runs_on_the_allocator_chosen(choice: str) -> None:
    """Through the real loader: the child maps the library and says so (CI installs both)."""
    for name in AUTO_ORDER:
        fix = f"apt-get install {PACKAGES[name]}"
        require_system(name, find_allocator(name) is not None, fix)
    env = with_allocator({"PATH": "/usr/bin:/bin"}, choice, cuda=False)  # type: ignore[arg-type]
    code = "from rlkit.trainer.allocator import loaded_allocator; print(loaded_allocator())"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == {"auto": AUTO_ORDER[0]}.get(choice, choice)
