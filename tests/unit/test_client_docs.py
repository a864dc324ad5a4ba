"""docs/client.md names functions step by step: every ``Class.attribute`` and ``module.function`` it
names must exist, so the page cannot drift from the client's code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from meshd import transport
from meshd.client import agent as client
from meshd.client import (
    batching,
    blocking,
    call_slots,
    gather,
    handler_slots,
    publish_window,
    resend,
    send_pause,
)
from meshd.client import handlers as dispatch
from meshd.client import incoming as client_incoming
from meshd.client import session as client_session
from meshd.wire import payloads

DOC = Path(__file__).resolve().parents[2] / "docs" / "client.md"
MODULES = {"batching": batching, "payloads": payloads, "dispatch": dispatch, "transport": transport,
           "client": client, "blocking": blocking, "publish_window": publish_window, "resend": resend,
           "handler_slots": handler_slots, "call_slots": call_slots,
           "client_session": client_session, "send_pause": send_pause}
CLASSES = {"Agent": client.Agent, "Batcher": batching.Batcher, "Dispatcher": dispatch.Dispatcher,
           "SendQueue": transport.SendQueue, "Reactor": transport.Reactor, "Message": dispatch.Message,
           "PublishWindow": publish_window.PublishWindow, "ResendHold": resend.ResendHold,
           "Incoming": client_incoming.Incoming, "HandlerSlots": handler_slots.HandlerSlots,
           "CallSlots": call_slots.CallSlots, "SendPauses": send_pause.SendPauses,
           "Session": client_session.Session, "AgentEvents": client_incoming.AgentEvents,
           "Gather": gather.Gather, "BlockingAgent": blocking.BlockingAgent}
DOTTED = re.compile(r"`([A-Za-z_]+)\.([A-Za-z_]+)(?:\([^`]*\))?`")


def named() -> list[tuple[str, str]]:
    return sorted(set(DOTTED.findall(DOC.read_text())) - {("meshd", "Agent"), ("meshd", "BlockingAgent"),
                                                          ("loop", "call_soon")})


def test_the_page_names_functions() -> None:
    assert len(named()) >= 20


@pytest.mark.parametrize(("owner", "attr"), named())
def test_every_named_function_exists(owner: str, attr: str) -> None:
    target = CLASSES.get(owner) or MODULES.get(owner)
    assert target is not None, f"docs/client.md names {owner}.{attr}: unknown owner {owner!r}"
    if owner == "SendQueue" and attr == "writable":  # an instance attribute
        assert "self.writable" in Path(transport.__file__).read_text()
        return
    assert hasattr(target, attr), f"docs/client.md names {owner}.{attr}, which does not exist"
