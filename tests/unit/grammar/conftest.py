"""A Compiler over the tiny fixture's vocabulary, and acceptance helpers:
a text is accepted when its tokens all pass the matcher and the matcher can
stop there (any tokenization of the text will do: llguidance checks bytes)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def vocab(tiny_model):
    from mlxcel_trio.engine.vocab import Vocab
    return Vocab(tiny_model)


@pytest.fixture(scope="session")
def compiler(vocab):
    from mlxcel_trio.grammar.compile import Compiler
    return Compiler(vocab.tokenizer_json(), vocab.n_vocab, vocab.eos_ids, vocab.piece,
                    lambda t: vocab.tokenize(t, add_special=False, parse_special=True))


@pytest.fixture(scope="session")
def accepts(compiler):
    from mlxcel_trio.grammar.compile import GrammarSpec

    def check(src: str, text=None, tokens=None, kind="gbnf") -> bool:
        g = compiler.compile(GrammarSpec(kind, src))
        m = g.matcher()
        ids = list(tokens) if tokens is not None else compiler.tokenizer.tokenize_str(
            text, parse_special=True)
        return m.try_consume_tokens(ids) == len(ids) and m.is_accepting()

    return check
