"""The busy-wait patch on vLLM's real shared-memory queue reader (`SpinCondition`)."""

from __future__ import annotations

import shutil
import tempfile
import time

import pytest
import zmq
from vllm.distributed.device_communicators.shm_broadcast import SpinCondition
from vllm.utils.network_utils import get_open_zmq_ipc_path

from rlkit.inference import polling


@pytest.fixture
def restore_wait():
    original = SpinCondition.wait
    yield original
    SpinCondition.wait = original


@pytest.fixture
def socket_folder(monkeypatch):
    """vLLM names its sockets in VLLM_RPC_BASE_PATH (the temporary folder itself by default) and
    a closed socket's file stays: the test's go in a folder of its own, removed afterwards. Not
    pytest's tmp_path: under xdist its path with a socket name passes the 107 bytes a UNIX
    socket's path may have."""
    sockets = tempfile.mkdtemp(prefix="rlkit-zmq-")
    monkeypatch.setenv("VLLM_RPC_BASE_PATH", sockets)
    yield
    shutil.rmtree(sockets, ignore_errors=True)


def reader_wait_s(timeout_ms: int | None = 200) -> float:
    """Seconds a reader that has just read waits for a message that never comes."""
    ctx = zmq.Context()
    try:
        address = get_open_zmq_ipc_path()
        _writer = SpinCondition(is_reader=False, context=ctx, notify_address=address)  # binds it
        reader = SpinCondition(is_reader=True, context=ctx, notify_address=address)
        reader.record_read()
        t0 = time.monotonic()
        reader.wait(timeout_ms=timeout_ms)
        return time.monotonic() - t0
    finally:
        # every socket of the context, whatever failed: a context left to the garbage collector
        # with a socket open blocks the process wherever the collector runs it
        ctx.destroy(linger=0)


def test_vllm_default_spins_and_patch_sleeps(restore_wait, socket_folder, monkeypatch) -> None:
    # vLLM's own reader returns at once (it spins: sched_yield, then the caller loops) ...
    assert reader_wait_s() < 0.05
    # ... with the window at 0 it sleeps on the notification socket, but wakes to re-read the
    # ring every IDLE_RECHECK_MS (a lost notification would otherwise cost vLLM's 5 s) ...
    monkeypatch.setenv(polling.ENV_VAR, "0")
    assert polling.apply_from_env() == 0.0
    recheck_s = polling.IDLE_RECHECK_MS / 1000
    assert 0.75 * recheck_s <= reader_wait_s() < 0.15
    assert 0.75 * recheck_s <= reader_wait_s(timeout_ms=None) < 0.15  # also without a deadline
    assert reader_wait_s(timeout_ms=5) < recheck_s  # a shorter deadline is kept
    polling.apply_from_env()  # applying twice wraps vLLM's method once, not the wrapper
    assert SpinCondition.wait.__rlkit_original__ is restore_wait


def test_window_chosen_per_device(monkeypatch) -> None:
    assert polling.busy_loop_env(None, on_gpu=False) == {polling.ENV_VAR: "0.005"}
    assert polling.busy_loop_env(None, on_gpu=True) == {}
    assert polling.busy_loop_env(0.25, on_gpu=True) == {polling.ENV_VAR: "0.25"}
    monkeypatch.setenv(polling.ENV_VAR, "-1")
    with pytest.raises(ValueError, match=polling.ENV_VAR):
        polling.apply_from_env()
