"""verifiers 0.4.x: a `Taskset` package played by a local chat agent.

0.4 environments export a `vf.Taskset` subclass (via `__all__`) instead of `load_environment`;
verifiers builds its `Env` around it (`vf.resolve_env_config` + `vf.load_environment`), runs
each rollout as an agent program talking to its interception server, launches the task's MCP
tool servers, and scores `@vf.reward` / `@vf.metric` methods on the finished trace. This shim
picks the local shapes of that loop: every agent seat runs in the `subprocess` runtime (not a
remote sandbox) with the taskset's own harness, else verifiers' `null` harness (its plain chat
agent, no bash); tool servers are subprocesses of this worker.

The model is reached through rlkit's recording transport: the interception server's client for
rlkit's endpoint is an `EvalClient` on the worker's httpx client, so each model call asks for
token ids + logprobs and becomes an rlkit turn of the rollout whose trace id the call carries
(`X-Session-ID`). The agent program streams; the engine is asked for the whole reply and the
interception server gets it framed as one SSE event (what verifiers itself serves when its
training client generates a turn whole).
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import verifiers
import verifiers.v1 as vf
import verifiers.v1.interception.server as interception_server
from recording import CALLS
from verifiers.v1.clients.client import RelayReply
from verifiers.v1.clients.eval import EvalClient

API_KEY_VAR = "RLKIT_BRIDGE_API_KEY"  # children never inherit it (verifiers drops *API_KEY*)
MAX_TASKS = 10000  # rows taken from an infinite taskset
SPLITS = ("train", "eval")  # a 0.4 taskset has one task stream; both splits read it


class RlkitClient(EvalClient):
    """verifiers' relay client on the worker's recording httpx client (see the module doc)."""

    def __init__(self, config: Any, http: Any, sessions: dict[str, list]) -> None:
        super().__init__(config)
        self.client = http
        self.sessions = sessions

    async def get_response(self, dialect: Any, body: dict, *args: Any, **kwargs: Any) -> Any:
        session_id = kwargs.get("session_id")
        token = CALLS.set(self.sessions.get(session_id or ""))
        try:
            return await super().get_response(dialect, body, *args, **kwargs)
        finally:
            CALLS.reset(token)

    async def relay(
        self, dialect: Any, body: dict, session_id: str | None = None, headers: Any = None
    ) -> RelayReply:
        whole = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
        response = await self.get_response(
            dialect, whole, vf.SamplingConfig(), session_id=session_id, headers=headers
        )
        events = dialect.stream_events(response.raw or {})

        async def chunks():
            for event in events:
                yield event

        async def close() -> None:
            return None

        return RelayReply("text/event-stream", chunks(), close)


def _message(message: Any) -> dict[str, Any]:
    """A verifiers 0.4 message as an OpenAI chat message (tool calls under `function`)."""
    data = message.model_dump(mode="json", exclude_none=True)
    calls = data.get("tool_calls")
    if calls:
        data["tool_calls"] = [
            {
                "id": call.get("id", ""),
                "type": "function",
                "function": {"name": call.get("name"), "arguments": call.get("arguments")},
            }
            for call in calls
        ]
    return data


def _prompt(data: Any) -> list[dict[str, Any]]:
    messages = [{"role": "system", "content": data.system_prompt}] if data.system_prompt else []
    if isinstance(data.prompt, str):
        messages.append({"role": "user", "content": data.prompt})
    else:
        messages.extend(_message(m) for m in data.prompt or [])
    return messages


class Shim:
    era = "0.4.x tasksets"

    def __init__(self, env: Any, taskset_id: str) -> None:
        self.env = env
        self.taskset_id = taskset_id
        taskset = env.taskset if env.taskset.bounded else env.taskset.take(MAX_TASKS)
        self.tasks = list(taskset)
        for task in self.tasks:
            if task.NEEDS_CONTAINER or task.data.image:
                raise ValueError(
                    f"task {task.data.idx} of {taskset_id} needs a container; the bridge "
                    "runs 0.4 agents in the local subprocess runtime only"
                )
        self.sessions: dict[str, list] = {}  # trace id -> the rollout's recorded turns
        self.http: dict[str, Any] = {}  # base url -> the worker's recording httpx client
        self.serving: Any = None
        self.serving_lock = asyncio.Lock()

    @classmethod
    def load(cls, module: Any, env_args: dict[str, Any]) -> Shim:
        """verifiers' own Env for the taskset `module` exports, its agents run locally."""
        taskset_id = module.__name__
        # tool servers are `python -m <module>` children: they import the package from here
        root = Path(module.__file__).parent
        if hasattr(module, "__path__"):
            root = root.parent
        os.environ["PYTHONPATH"] = str(root)
        # verifiers prepares its chat agent with uv; the venv carries one
        os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
        os.environ.setdefault("UV_COMPILE_BYTECODE", "1")  # the agent starts once per rollout
        harness = taskset_id if vf.default_harness_id(taskset_id) == taskset_id else "null"
        config_cls = vf.env_config_type(taskset_id)
        roles: dict[str, Any] = {}
        for name, field in config_cls.model_fields.items():
            if isinstance(field.default, vf.AgentConfig):
                role: dict[str, Any] = {"runtime": {"type": "subprocess"}}
                if field.default.harness is None:
                    role["harness"] = {"id": harness}
                roles[name] = role
        config = vf.resolve_env_config({"taskset": {"id": taskset_id, **env_args}, **roles})
        shim = cls(vf.load_environment(config), taskset_id)
        interception_server.resolve_client = shim.client_for  # where rlkit's HTTP layer plugs in
        return shim

    def client_for(self, config: Any) -> RlkitClient:
        return RlkitClient(config, self.http[config.base_url], self.sessions)

    async def aclose(self) -> None:
        """Stop the interception and shared tool servers (the worker's stdin closed)."""
        if self.serving is not None:
            await self.serving.__aexit__(None, None, None)
            self.serving = None

    def describe(self) -> dict[str, Any]:
        return {
            "era": self.era,
            "verifiers_version": verifiers.__version__,
            "env_class": f"{type(self.env).__name__}({type(self.env.taskset).__name__})",
            "multi_turn": True,
            "max_turns": None,
            "sampling_defaults": {},
            "splits": {split: len(self.tasks) for split in SPLITS},
        }

    def row(self, split: str, index: int) -> dict[str, Any]:
        return {"index": index}

    def rows(self, split: str, start: int, count: int) -> list[dict[str, Any]]:
        out = []
        for task in self.tasks[start : start + count]:
            answer = getattr(task.data, "answer", None)
            out.append(
                {
                    "prompt": _prompt(task.data),
                    "answer": "" if answer is None else str(answer),
                    "info": {
                        "task": type(task).__name__,
                        "key": task.key,
                        "data": task.data.model_dump(mode="json", exclude_none=True),
                    },
                    "example_id": task.data.idx,
                }
            )
        return out

    async def rollout(self, row: dict[str, Any], client: Any, model: str, sampling: dict) -> Any:
        async with self.serving_lock:  # the interception server, up for the worker's life
            if self.serving is None:
                serving = self.env.serving()
                await serving.__aenter__()
                self.serving = serving
        base_url = str(client.base_url)
        self.http[base_url] = client._client
        os.environ[API_KEY_VAR] = client.api_key or "EMPTY"
        ctx = vf.ModelContext(
            model=model,
            client=vf.EvalClientConfig(base_url=base_url, api_key_var=API_KEY_VAR),
            sampling=vf.SamplingConfig.model_validate(sampling),
        )
        calls = CALLS.get()
        traces: list[str] = []

        def minted(trace: Any) -> None:
            traces.append(trace.id)
            self.sessions[trace.id] = calls if calls is not None else []

        task = self.tasks[row["index"]]
        try:
            episode = await self.env.run_slot(self.env.slots(task)[0], ctx, on_trace=minted)
        finally:
            for trace_id in traces:
                self.sessions.pop(trace_id, None)
        if not episode.ok:
            errors = [*episode.errors, *(e for t in episode.traces for e in t.errors)]
            text = "; ".join(f"{e.type}: {e.message}" for e in errors) or "episode not ok"
            raise RuntimeError(f"verifiers recorded an error: {text}")
        trace = episode.traces[-1]
        prompt_len = len(_prompt(task.data))
        completion = [_message(m) for m in trace.messages[prompt_len:]]
        return completion, episode

    async def score(self, items: list[tuple[dict, Any, Any]]) -> list[tuple[float, dict]]:
        """verifiers scored each trace when its rollout finished; this reads the scores."""
        out = []
        for _, _, episode in items:
            reward = sum(t.reward for t in episode.traces)
            metrics: dict[str, float] = {}
            for trace in episode.traces:
                metrics.update({k: float(r.score) for k, r in trace.rewards.items() if r})
                metrics.update({k: float(v) for k, v in trace.metrics.items() if v is not None})
            out.append((float(reward), metrics))
        return out
