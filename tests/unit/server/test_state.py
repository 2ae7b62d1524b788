"""server/state.py: one AppState per app, its chat settings built once."""

from __future__ import annotations

from types import SimpleNamespace

from mlxcel_trio.chat import settings as chat_settings
from mlxcel_trio.server.state import AppState


def test_chat_settings_are_built_once_per_app(monkeypatch):
    built: list[object] = []

    def build(config, vocab):
        built.append(vocab)
        return object()

    monkeypatch.setattr(chat_settings, "build", build)
    bridge = SimpleNamespace(vocab="vocab")
    one, two = AppState.create(None, bridge), AppState.create(None, bridge)
    assert one.chat_settings() is one.chat_settings()
    assert two.chat_settings() is not one.chat_settings()
    assert built == ["vocab", "vocab"]


def test_each_app_has_its_own_sessions():
    one, two = AppState.create(None, None), AppState.create(None, None)
    assert one.detached is not two.detached and one.streams is not two.streams
    assert one.control is not two.control and one.responses is not two.responses
    assert one.slot_identities is not two.slot_identities
