"""The bridge worker: runs one verifiers environment inside its own venv and serves rlkit.

Started by `rlkit.envs.bridge.process.WorkerProcess` as `<venv python> vf_worker.py SPEC_JSON`.
It imports only the standard library, httpx, openai and verifiers (never rlkit: the venv holds
an exact verifiers version and nothing of rlkit's). The protocol is JSON lines on the worker's
original stdin/stdout (see `rlkit/envs/bridge/PROTOCOL.md`); file descriptors 0 and 1 are then
pointed at /dev/null and stderr, so an environment that prints cannot corrupt the channel.

Every model call a rollout makes through the client handed to verifiers passes a recording
transport: it asks the server for token ids and logprobs, and keeps each reply (token ids,
logprobs, finish reason, the X-Policy-Version header) on the rollout that made it, found through
a context variable. Those records become rlkit turns; verifiers' own state is not parsed.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from recording import CALLS, RecordingTransport, httpx

MAX_KEPT_STATES = 20000  # rollouts awaiting `score`; the oldest are dropped beyond this


def jsonable(value: Any) -> Any:
    """verifiers messages (dicts holding OpenAI pydantic objects) as plain JSON values."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return jsonable(dump(exclude_none=True))
    return str(value)


def _is_api_error(exc: BaseException | None) -> bool:
    """An OpenAI client error (server down, 4xx/5xx), here or as a verifiers error's cause."""
    import openai

    while exc is not None:
        if isinstance(exc, (openai.APIError, httpx.HTTPError)):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


class Worker:
    """Loads the environment, then answers requests concurrently until stdin closes."""

    def __init__(self, spec: dict[str, Any], out: Any) -> None:
        self.spec = spec
        self.out = out
        self.transport: asyncio.WriteTransport | None = None
        self.clients: dict[tuple[str, str, float], Any] = {}
        self.states: dict[int, tuple[dict[str, Any], Any, Any]] = {}
        self.next_handle = 0
        self.tasks: dict[int, asyncio.Task] = {}
        self.shim: Any = None

    def send(self, message: dict[str, Any]) -> None:
        """Write one reply: through the loop's non-blocking pipe transport once serving (a
        blocking write would stall every rollout whenever rlkit reads late)."""
        line = (json.dumps(message, default=str) + "\n").encode()
        if self.transport is not None:
            self.transport.write(line)
            return
        self.out.write(line)
        self.out.flush()

    def load(self) -> None:
        for path in self.spec.get("sys_path") or []:
            sys.path.insert(0, path)
        module = importlib.import_module(self.spec["module"])
        shim_module = importlib.import_module(self.spec["shim"])
        self.shim = shim_module.Shim.load(module, self.spec.get("env_args") or {})

    def client(self, base_url: str, api_key: str, timeout: float) -> Any:
        from openai import AsyncOpenAI

        key = (base_url, api_key, timeout)
        if key not in self.clients:
            transport = RecordingTransport(int(self.spec.get("max_connections") or 256))
            http = httpx.AsyncClient(transport=transport, timeout=timeout)
            self.clients[key] = AsyncOpenAI(
                base_url=base_url, api_key=api_key or "EMPTY", http_client=http, max_retries=3
            )
        return self.clients[key]

    async def rollout(self, req: dict[str, Any]) -> dict[str, Any]:
        client = self.client(
            req["base_url"], req.get("api_key") or "", float(req["request_timeout"])
        )
        calls: list[dict[str, Any]] = []
        CALLS.set(calls)
        t0 = time.perf_counter()
        error = None
        completion: Any = []
        state: Any = None
        row: Any = None
        try:  # a row verifiers would reject fails here, naming the row and field
            row = self.shim.row(req["split"], int(req["index"]))
            completion, state = await self.shim.rollout(
                row, client, req["model"], dict(req.get("sampling") or {})
            )
        except Exception as exc:  # the rollout failed inside verifiers or the environment
            kind = "generation failed" if _is_api_error(exc) else "environment error"
            error = f"{kind}: {type(exc).__name__}: {exc}"
        handle = self.next_handle
        self.next_handle += 1
        if error is None:
            self.states[handle] = (row, completion, state)
            while len(self.states) > MAX_KEPT_STATES:
                self.states.pop(next(iter(self.states)))
        return {
            "handle": handle,
            "completion": jsonable(completion) if isinstance(completion, list) else [],
            "turns": calls,
            "error": error,
            "total_s": time.perf_counter() - t0,
        }

    async def score(self, req: dict[str, Any]) -> list[dict[str, Any]]:
        handles = [int(h) for h in req["handles"]]
        kept = [self.states.pop(h, None) for h in handles]
        present = [k for k in kept if k is not None]
        scores = await self.shim.score(present) if present else []
        it = iter(scores)
        out = []
        for k in kept:
            if k is None:
                out.append({"error": "the worker no longer holds this rollout's state"})
            else:
                reward, metrics = next(it)
                out.append({"reward": reward, "metrics": metrics})
        return out

    async def handle(self, req: dict[str, Any]) -> None:
        rid = req.get("id")
        op = req.get("op")
        try:
            if op == "rollout":
                result: Any = await self.rollout(req)
            elif op == "score":
                result = await self.score(req)
            elif op == "rows":
                result = self.shim.rows(req["split"], int(req["start"]), int(req["count"]))
            elif op == "describe":
                result = self.shim.describe()
            elif op == "ping":
                result = "pong"
            elif op == "cancel":
                task = self.tasks.get(int(req["target"]))
                if task is not None:
                    task.cancel()
                result = task is not None
            else:
                raise ValueError(f"unknown op {op!r}")
            self.send({"id": rid, "ok": True, "result": jsonable(result)})
        except asyncio.CancelledError:
            self.send({"id": rid, "ok": False, "error": "cancelled"})
        except Exception as exc:
            tail = traceback.format_exc(limit=-3)
            self.send({"id": rid, "ok": False, "error": f"{type(exc).__name__}: {exc}\n{tail}"})
        finally:
            self.tasks.pop(rid, None)

    async def serve(self, proto_in: Any) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=2**30)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), proto_in)
        self.transport, _ = await loop.connect_write_pipe(asyncio.Protocol, self.out)
        while True:
            line = await reader.readline()
            if not line:
                break
            try:
                req = json.loads(line)
            except ValueError:
                self.send({"id": None, "ok": False, "error": f"bad request line: {line[:200]!r}"})
                continue
            task = asyncio.create_task(self.handle(req))
            if isinstance(req.get("id"), int):
                self.tasks[req["id"]] = task
        close = getattr(self.shim, "aclose", None)  # servers a shim keeps up while serving
        if close is not None:
            await close()


def main() -> None:
    spec = json.loads(sys.argv[1])
    proto_in = os.fdopen(os.dup(0), "rb")
    proto_out = os.fdopen(os.dup(1), "wb")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(2, 1)  # stray prints from the environment go to stderr
    sys.stdout = sys.stderr
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    worker = Worker(spec, proto_out)
    try:
        worker.load()
        ready = {"id": 0, "ok": True, "result": jsonable(worker.shim.describe())}
    except BaseException as exc:
        tail = traceback.format_exc(limit=-4)
        worker.send({"id": 0, "ok": False, "error": f"{type(exc).__name__}: {exc}\n{tail}"})
        sys.exit(1)
    worker.send(ready)
    asyncio.run(worker.serve(proto_in))


if __name__ == "__main__":
    main()
