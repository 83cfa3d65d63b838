"""Who may publish a version: the record is signed with the run's credential, and the broadcast
rendezvous acts on no store value that a process without it planted. A process of another user
can reach the trainer's store (torch's store has no authentication and lists its keys), but
what it sets there is ignored; and the store listens only on the interface it was given."""

from __future__ import annotations

import socket
import threading
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from rlkit.protocol.credentials import new_token, rendezvous_secret
from rlkit.protocol.weights import PublishedVersion
from rlkit.weights.broadcast import Channel, FilesReady, Peers, Sender, Verdict

KEY = bytes(range(32))  # the key of the tensor tags (a run derives it from its token)

TENSORS = [("w", torch.arange(12, dtype=torch.float32).view(3, 4))]


def record() -> PublishedVersion:
    return PublishedVersion.build(
        3, "broadcast", TENSORS, KEY, delivery={"address": ["127.0.0.1", 1234], "timeout_s": 10}
    )


def test_a_signed_record_verifies_only_unchanged_and_with_its_token() -> None:
    token, other = new_token(), new_token()
    signed = record().signed(token)
    assert signed.signed_by(token)
    assert not signed.signed_by(other)  # an attacker's self-signed copy: another key
    assert not record().signed_by(token)  # unsigned
    assert not record().signed(other).signed_by(token)
    moved = signed.model_copy(update={"delivery": {**signed.delivery, "timeout_s": 3600}})
    assert not moved.signed_by(token)  # any field changed after signing
    readdressed = signed.model_copy(update={"delivery": {"address": ["10.0.0.9", 1]}})
    assert not readdressed.signed_by(token)
    assert not signed.model_copy(update={"version": 999999}).signed_by(token)
    reread = PublishedVersion.model_validate_json(signed.model_dump_json())
    assert reread.signed_by(token)  # the JSON round trip keeps it verifiable


def attacker_store(sender: Sender) -> dist.TCPStore:
    """Another local process's client of the trainer's store: no credential needed."""
    host, port = sender.address
    return dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=5))


def test_store_values_planted_without_the_secret_are_ignored() -> None:
    secret = rendezvous_secret(new_token())
    sender = Sender("127.0.0.1", timeout_s=5.0, secret=secret)
    trainer = sender.channel(3)
    attacker = attacker_store(sender)
    keys = {trainer.key(kind) for kind in (Peers, Verdict, FilesReady)}
    forged = Channel(attacker, 3, rendezvous_secret(new_token()))  # the attacker's own secret
    forged.put(Peers(labels=["attacker"]))
    forged.put(Verdict(files_needed=True))
    forged.put(FilesReady(path="/attacker/weights"))
    attacker.set(trainer.key(Verdict), '{"body": "{\\"files_needed\\": true}", "mac": "00"}')
    assert keys <= set(attacker.list_keys())  # the keys themselves are no secret
    assert trainer.peek(Peers) is None and trainer.peek(Verdict) is None
    assert trainer.peek(FilesReady) is None
    with pytest.raises(RuntimeError, match="no valid"):
        trainer.get(FilesReady, timeout_s=0.3)
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    assert trainer.poll(Verdict, stop) is None  # the forged verdict never counts

    orchestrator = Channel(attacker_store(sender), 3, secret)  # the run's own process
    orchestrator.put(Verdict(files_needed=False))
    assert trainer.get(Verdict, timeout_s=2) == Verdict(files_needed=False)


def other_interface_address() -> str | None:
    """An address of this machine that is not loopback, if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))  # no packet is sent: picks the outgoing interface
            address = s.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") else address


def test_the_trainer_store_listens_only_on_its_host() -> None:
    sender = Sender("127.0.0.1", timeout_s=5.0)
    port = sender.address[1]
    with socket.create_connection(("127.0.0.1", port), timeout=2):
        pass
    address = other_interface_address()
    if address is None:
        pytest.skip("this machine has no interface but loopback to try")
    with pytest.raises(OSError):
        socket.create_connection((address, port), timeout=2).close()
