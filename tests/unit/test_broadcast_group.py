"""The broadcast group is kept across updates while the same worker processes join, and opened
anew when one of them is a new process (even under the same label): no update waits on a group
some rank does not hold. Two long-lived receiver processes and the `Sender` on gloo."""

from __future__ import annotations

import multiprocessing as mp
from typing import Any

import pytest
import torch

from rlkit.protocol.credentials import digest_key, token_from_env
from rlkit.protocol.weights import PublishedVersion, mismatches
from rlkit.weights import Reception, broadcast
from rlkit.weights.broadcast import Sender, announce_peers, receive
from tests.helpers.broadcast_trainer import broadcast_record

KEY = digest_key(token_from_env())  # the tests' run token's, as broadcast_record tags

pytestmark = pytest.mark.slow  # spawns receiver processes that import torch
TIMEOUT_S = 10.0
LABELS = ["server-a worker 0", "server-b worker 0"]


def tensors(version: int) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(version)
    return [("w", torch.randn(64, 64, generator=g)), ("b", torch.randn(64, generator=g).half())]


def long_lived_receiver(rank: int, inbox: Any, out: Any) -> None:
    """Receive every record put on `inbox` (JSON; None ends); report the tensor check and the
    id of the group this process holds afterwards."""
    while (record_json := inbox.get()) is not None:
        record = PublishedVersion.model_validate_json(record_json)
        got = [
            (n, t.clone()) for bucket in receive(record, Reception(rank=rank)) for n, t in bucket
        ]
        held = broadcast.Broadcast.receiver.held(tuple(record.delivery["address"]))
        out.put((rank, mismatches(got, record, KEY), held))


class Receivers:
    def __init__(self) -> None:
        self.ctx = mp.get_context("spawn")
        self.out = self.ctx.Queue()
        self.procs: dict[int, tuple[Any, Any]] = {}

    def start(self, rank: int) -> None:
        inbox = self.ctx.Queue()
        proc = self.ctx.Process(target=long_lived_receiver, args=(rank, inbox, self.out))
        proc.start()
        self.procs[rank] = (proc, inbox)

    def update(self, sender: Sender, version: int) -> list[tuple[int, list[str], int]]:
        sent = tensors(version)
        record = broadcast_record(sender, version, sent, 1024)
        for _, inbox in self.procs.values():
            inbox.put(record.model_dump_json())
        announce_peers(record, LABELS)
        assert sender.send(record, sent) == LABELS
        return sorted(self.out.get(timeout=60) for _ in self.procs)

    def stop(self, rank: int) -> None:
        proc, inbox = self.procs.pop(rank)
        inbox.put(None)
        proc.join(30)

    def stop_all(self) -> None:
        for rank in list(self.procs):
            self.stop(rank)


def test_the_group_is_kept_while_the_same_processes_join() -> None:
    sender = Sender("127.0.0.1", TIMEOUT_S)
    receivers = Receivers()
    try:
        receivers.start(1)
        receivers.start(2)
        assert receivers.update(sender, 1) == [(1, [], 1), (2, [], 1)]
        assert sender.group_id == 1
        assert receivers.update(sender, 2) == [(1, [], 1), (2, [], 1)]  # kept: no new group
        assert sender.group_id == 1

        receivers.stop(2)  # a relaunched server: a new process under the same label
        receivers.start(2)
        assert receivers.update(sender, 3) == [(1, [], 2), (2, [], 2)]  # a new group
        assert sender.group_id == 2
        assert receivers.update(sender, 4) == [(1, [], 2), (2, [], 2)]
        assert sender.group_id == 2
    finally:
        receivers.stop_all()
