"""A stand-in HTTP service on its own event loop in a thread (aiohttp), so it can stop and start
again while a client's loop is not running: the client's kept connection then learns of the close
only when it is next used (as on a client whose loop was busy while the service restarted)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ThreadedService:
    """POST `path` answered by `handler` on 127.0.0.1:`port` (module doc)."""

    def __init__(self, port: int, handler: Handler, path: str = "/run") -> None:
        self.port, self.handler, self.path = port, handler, path
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.runner: web.AppRunner | None = None

    def _wait(self, work: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(work, self.loop).result(10)

    def start(self) -> None:
        async def up() -> web.AppRunner:
            app = web.Application()
            app.router.add_post(self.path, self.handler)
            runner_ = web.AppRunner(app)
            await runner_.setup()
            await web.TCPSite(runner_, "127.0.0.1", self.port).start()
            return runner_

        self.runner = self._wait(up())

    def stop(self) -> None:
        if self.runner is not None:
            self._wait(self.runner.cleanup())
            self.runner = None

    def close(self) -> None:
        self.stop()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()
