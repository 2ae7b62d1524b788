"""engine/vocab.py: the checkpoint's chat template sources, read as
transformers reads them (rendering is chat/template.py's)."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from mlxcel_trio.engine.vocab import GIL_FREE_CHARS, Vocab, checkpoint_templates


def test_checkpoint_template_sources():
    assert checkpoint_templates({"chat_template": "a"}, None) == ("a", None)
    assert checkpoint_templates({"chat_template": "a"}, "file") == ("file", None)
    named = [{"name": "default", "template": "d"}, {"name": "tool_use", "template": "t"}]
    assert checkpoint_templates({"chat_template": named}, None) == ("d", "t")
    assert checkpoint_templates({}, None) == (None, None)


def test_a_long_text_tokenizes_to_the_same_ids_with_the_gil_released(tiny_model):
    """Past GIL_FREE_CHARS the batch call is used (it releases the GIL); the
    ids, special-token parsing and BOS handling are tokenizers' own encode."""
    vocab = Vocab(Path(tiny_model))
    reference = Tokenizer.from_file(str(Path(tiny_model) / "tokenizer.json"))
    literal = Tokenizer.from_str(reference.to_str())
    literal.encode_special_tokens = True
    text = " ".join(f"word{i} <|im_start|> {i * 7919 % 1000}" for i in range(3000))
    assert len(text) > GIL_FREE_CHARS
    for add_special, parse_special in ((True, True), (False, True), (False, False)):
        tok = reference if parse_special else literal
        assert vocab.tokenize(text, add_special, parse_special) == \
            tok.encode(text, add_special_tokens=add_special).ids
