"""engine/vocab.py: the checkpoint's chat template sources, read as
transformers reads them (rendering is chat/template.py's)."""

from __future__ import annotations

from mlxcel_trio.engine.vocab import checkpoint_templates


def test_checkpoint_template_sources():
    assert checkpoint_templates({"chat_template": "a"}, None) == ("a", None)
    assert checkpoint_templates({"chat_template": "a"}, "file") == ("file", None)
    named = [{"name": "default", "template": "d"}, {"name": "tool_use", "template": "t"}]
    assert checkpoint_templates({"chat_template": named}, None) == ("d", "t")
    assert checkpoint_templates({}, None) == (None, None)
