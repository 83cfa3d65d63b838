"""A user's own rollout scheduler, sandbox backends and weight transport, outside rlkit, one
class each.

With this folder on PYTHONPATH, `rlkit train` takes `[orchestrator] scheduler =
"my_plugins:OneGroupScheduler"`, `[sandbox] backend = "my_plugins:TaggedBwrap"` and
`[inference] weight_transfer = "my_plugins:FilePerTensor"`; nothing in rlkit names them.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

from rlkit.orchestrator.scheduler import SCHEDULERS, Counters, Group, SchedulerParams
from rlkit.protocol.weights import PublishedVersion
from rlkit.sandbox.backends import BACKENDS, Bwrap
from rlkit.sandbox.launch import Launch

RECORD = "one_group_batches.jsonl"


class OneGroupParams(SchedulerParams):
    """The plugin's own table, `[orchestrator.schedulers."my_plugins:OneGroupScheduler"]`."""

    record: str = RECORD


@SCHEDULERS.register("one-group", params=OneGroupParams)
class OneGroupScheduler:
    """Written against the `Scheduler` protocol alone: each step trains on one group, generated
    after the previous step's weights are live (fully on-policy, nothing in flight while the
    trainer works). Appends each batch's group uid to run_dir/<record> (its own parameter)."""

    def __init__(self, source: Any, processor: Any, prompts: Any, version: int, record: Path):
        self.source = source
        self.processor = processor
        self.prompts = prompts
        self.version = version
        self.record = record
        self.counters = Counters()
        self._since = time.monotonic()
        self._busy_s = 0.0  # seconds spent generating since the last take_idle_s()

    @classmethod
    def from_config(
        cls, cfg: Any, source: Any, processor: Any, prompts: Any, version: int
    ) -> OneGroupScheduler:
        record = cfg.orchestrator.scheduler_settings.record
        return cls(source, processor, prompts, version, Path(cfg.log.run_dir) / record)

    @staticmethod
    def groups_per_batch(o: Any, max_tokens: int) -> int:
        return 1

    async def next_batch(self) -> list[Group]:
        """The next group with trainable samples (groups without are dropped, as in rlkit's)."""
        while True:
            group = Group(prompt=self.prompts.take(), start_version=self.version)
            self.counters.launched += self.source.group_size
            start = time.monotonic()
            group.rollouts = await self.source.next_group(group.prompt)
            self._busy_s += time.monotonic() - start
            self.counters.finished += len(group.rollouts)
            self.processor(group)
            if group.samples:
                self.prompts.trained(group.prompt)
                with self.record.open("a") as out:
                    out.write(json.dumps([group.uid]) + "\n")
                return [group]
            self.prompts.drop(group.prompt, "no_samples")

    def on_policy_update(self, version: int) -> None:
        self.version = version

    def take_counters(self) -> Counters:
        counters, self.counters = self.counters, Counters()
        return counters

    def take_idle_s(self) -> float:
        """Seconds without generation since the last call (inference idles while training)."""
        now = time.monotonic()
        idle = max(0.0, now - self._since - self._busy_s)
        self._since, self._busy_s = now, 0.0
        return idle

    async def close(self) -> None:
        """Nothing runs between calls of next_batch."""


@BACKENDS.register("tagged-bwrap")
class TaggedBwrap(Bwrap):
    """Bubblewrap, every program started with SANDBOX_BACKEND=tagged-bwrap in its environment."""

    name: ClassVar[str] = "tagged-bwrap"

    @contextlib.contextmanager
    def prepare(self, *args: Any, **kwargs: Any) -> Iterator[Launch]:
        with super().prepare(*args, **kwargs) as launch:
            # bwrap applies its options in order: after the option file (`--args FD`, which
            # clears the environment), before the command
            at = launch.argv.index("--args") + 2
            launch.argv[at:at] = ["--setenv", "SANDBOX_BACKEND", self.name]
            yield launch


class MissingTool(TaggedBwrap):
    """A backend whose tool is absent here: the sandbox must refuse to run anything."""

    name: ClassVar[str] = "missing-tool"

    def problem(self) -> str | None:
        return "the missing-tool runtime is not installed"


class FilePerTensor:
    """A weight transport written against `rlkit.weights.WeightTransport` alone: one
    safetensors file per tensor under `tensors/`, listed in the record's delivery (the engine
    worker imports this module by the name the record carries)."""

    name: ClassVar[str] = "my_plugins:FilePerTensor"

    def __init__(self, settings: Any, model_files: Any = None) -> None:
        self.published_versions: list[int] = []

    def publish(self, tmp: Path, record: PublishedVersion, tensors: list) -> PublishedVersion:
        from safetensors.torch import save_file

        (tmp / "tensors").mkdir()
        files = []
        for i, (name, tensor) in enumerate(tensors):
            files.append(f"tensors/{i:05d}.safetensors")
            save_file({name: tensor}, str(tmp / files[-1]))
        return record.model_copy(update={"delivery": {"files": files}})

    def published(self, out: Path, record: PublishedVersion, tensors: list) -> None:
        self.published_versions.append(record.version)

    def settle(self) -> None:
        return None

    @classmethod
    def receive(cls, record: PublishedVersion, directory: Path, rank: int) -> list:
        from safetensors.torch import load_file

        out = []
        for file in record.delivery["files"]:
            out += list(load_file(str(Path(directory) / file)).items())
        return out

    @classmethod
    async def deliver(cls, servers: list, directory: str, record: PublishedVersion) -> list:
        from rlkit.weights.filesystem import load_files

        return await load_files(servers, directory, record.version)

    @classmethod
    async def catch_up(cls, server: Any, directory: str, record: PublishedVersion) -> bool:
        await server.update_weights(directory, record.version)
        return True
