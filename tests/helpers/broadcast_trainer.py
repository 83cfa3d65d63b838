"""A trainer process killed mid-broadcast, for the transport's unit test and the real server's."""

from __future__ import annotations

import time
from typing import Any

from rlkit.protocol.credentials import digest_key, token_from_env
from rlkit.protocol.weights import Named, PublishedVersion
from rlkit.weights import broadcast
from rlkit.weights.broadcast import Sender

STALLED = "stalled"


def broadcast_record(
    sender: Sender, version: int, tensors: list[Named], bucket_bytes: int
) -> PublishedVersion:
    """The record the trainer publishes for a broadcast of `tensors` from `sender`."""
    return PublishedVersion.build(
        version,
        broadcast.Broadcast.name,
        tensors,
        digest_key(token_from_env()),
        delivery=sender.delivery(tensors, bucket_bytes).model_dump(mode="json"),
    ).signed(token_from_env())


def sender_stalled_after_first_bucket(
    tensors: list[Named],
    version: int,
    bucket_bytes: int,
    timeout_s: float,
    out: Any,
    go: Any,
    secret: str = "",
) -> None:
    """A spawn target playing the trainer: hosts a `Sender`, puts the record of update
    `version` on `out`, waits for `go`, sends the first bucket, then puts `STALLED` on `out`
    and waits for the test to SIGKILL it mid-broadcast (store and group die with it)."""
    sender = Sender("127.0.0.1", timeout_s, secret=secret)
    real = broadcast._start_broadcast
    sent: list[Any] = []  # the first bucket's pending work

    def first_bucket_only(group: Any, buffer: Any, timeout: Any) -> Any:
        if sent:  # the first bucket is through; the second is never posted
            broadcast._wait(sent[0], timeout)
            out.put(STALLED)
            time.sleep(600)  # killed long before: the test's timeouts are seconds
        sent.append(real(group, buffer, timeout))
        return sent[-1]

    broadcast._start_broadcast = first_bucket_only
    record = broadcast_record(sender, version, tensors, bucket_bytes)
    out.put(record)
    go.wait()
    sender.send(record, tensors)


def sender_trickling(
    tensors: list[Named], version: int, bucket_bytes: int, delay_s: float, out: Any, go: Any
) -> None:
    """A spawn target playing a (signed, willing) trainer that sends every bucket `delay_s` late,
    asking receivers to wait an hour: it puts the record on `out`, waits for `go`, then sends."""
    sender = Sender("127.0.0.1", 3600.0)
    real = broadcast._start_broadcast

    def late(*args: Any) -> Any:
        time.sleep(delay_s)
        return real(*args)

    broadcast._start_broadcast = late
    record = broadcast_record(sender, version, tensors, bucket_bytes)
    out.put(record)
    go.wait()
    sender.send(record, tensors)
