"""The vLLM worker extension asks Linux for AMX tile state on CPUs that have it: vLLM's CPU
attention uses AMX tiles there, and without the grant an eager engine dies of SIGILL."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

# arch_prctl(ARCH_GET_XCOMP_PERM, &mask): the extended state components this process may use,
# printed after torch alone and again after the worker extension, in one fresh interpreter
PERMITTED_XSTATE = """
import ctypes, sys
def permitted():
    mask = ctypes.c_uint64()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(158, 0x1022, ctypes.byref(mask)) != 0:
        sys.exit(f"arch_prctl failed: errno {ctypes.get_errno()}")
    print(mask.value)
import torch
permitted()
import rlkit.inference.worker_ext
permitted()
"""
XTILEDATA = 1 << 18


@pytest.mark.skipif(
    not (sys.platform == "linux" and torch.cpu._is_amx_tile_supported()),
    reason="the CPU has no AMX tiles (the grant exists only on x86-64 Linux with AMX)",
)
def test_importing_the_worker_extension_grants_amx_tiles() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PERMITTED_XSTATE], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    torch_alone, with_extension = (int(line) for line in done.stdout.split()[-2:])
    assert not torch_alone & XTILEDATA  # torch alone does not ask
    assert with_extension & XTILEDATA
