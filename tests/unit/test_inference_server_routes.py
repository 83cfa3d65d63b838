"""The inference server's update helpers, without an engine: what a kept prefix cache logs."""

from __future__ import annotations

import logging

import pytest

from rlkit.inference.server import reset_prefix_cache_or_warn


class Engine:
    def __init__(self, result: bool | Exception) -> None:
        self.result = result
        self.calls = 0

    async def reset_prefix_cache(self) -> bool:
        self.calls += 1
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


async def test_a_dropped_cache_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    engine = Engine(True)
    with caplog.at_level(logging.WARNING, logger="rlkit.inference.server"):
        await reset_prefix_cache_or_warn(engine)
    assert engine.calls == 1 and not caplog.records


@pytest.mark.parametrize(
    ("result", "message"),
    [(False, "old-weight prefixes may be reused"), (RuntimeError("busy"), "reset failed")],
)
async def test_a_kept_cache_is_reported(
    result: bool | Exception, message: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="rlkit.inference.server"):
        await reset_prefix_cache_or_warn(Engine(result))
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert message in caplog.records[0].getMessage()
