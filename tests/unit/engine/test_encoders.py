"""engine/encoders: the BERT and XLM-RoBERTa forwards, their cross-encoder
heads and the 2_Dense head against an independent NumPy reference
(_encoder_reference.py), batched == single, and what the loader reads from
the sentence-transformers files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from tokenizers import Tokenizer

from mlxcel_trio.engine.encoders import EncoderLoadError, load

from ._encoder_reference import Reference

KINDS = ["tiny-bert", "tiny-bert-reranker", "tiny-xlmr", "tiny-xlmr-reranker"]
RERANKERS = ["tiny-bert-reranker", "tiny-xlmr-reranker"]
TEXTS = [
    "The cat jumps over the fence.",
    "a",
    ("Our team builds seven stones near the harbour while the kettle boils, "
     "and the old sailor remembers the last train before sunset; café, 你好, 🚀!"),
    "def count(items):\n    return total + 1",
]
QUERY = "where does the old sailor go?"
DOCS = ["The old sailor visits the harbour every single day.",
        "Three apples",
        "def price(node): return node.left + node.right  # 東京タワー"]


@pytest.fixture(scope="module")
def dirs() -> dict[str, Path]:
    from fixtures.build import ensure
    return {kind: ensure(kind) for kind in KINDS}


@pytest.fixture(scope="module")
def models(dirs):
    return {kind: load(path) for kind, path in dirs.items()}


def _tok(path: Path) -> Tokenizer:
    return Tokenizer.from_file(str(path / "tokenizer.json"))


def _batch(encodings, pad: int):
    """Right-padded ids, mask and type ids for a list of tokenizers Encodings."""
    L = max(len(e.ids) for e in encodings)
    ids = np.full((len(encodings), L), pad, np.int32)
    mask = np.zeros((len(encodings), L), np.int32)
    types = np.zeros((len(encodings), L), np.int32)
    for i, e in enumerate(encodings):
        n = len(e.ids)
        ids[i, :n], mask[i, :n], types[i, :n] = e.ids, 1, e.type_ids
    return mx.array(ids), mx.array(mask), mx.array(types)


def _pad_id(path: Path) -> int:
    return json.loads((path / "config.json").read_text())["pad_token_id"]


# --- the tokenizers --------------------------------------------------------

def test_bert_tokenizer_wraps_in_cls_and_sep(dirs):
    for kind in ("tiny-bert", "tiny-bert-reranker"):
        tok = _tok(dirs[kind])
        enc = tok.encode("The cat jumps over the fence.")
        assert enc.tokens[0] == "[CLS]" and enc.tokens[-1] == "[SEP]"
        assert [tok.token_to_id(t) for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")] == [0, 1, 2, 3, 4]
        pair = tok.encode("a query", "a document")
        assert pair.tokens.count("[SEP]") == 2 and pair.tokens[0] == "[CLS]"
        first_sep = pair.tokens.index("[SEP]")
        assert set(pair.type_ids[:first_sep + 1]) == {0} and set(pair.type_ids[first_sep + 1:]) == {1}


def test_xlmr_tokenizer_wraps_in_s_tags(dirs):
    for kind in ("tiny-xlmr", "tiny-xlmr-reranker"):
        tok = _tok(dirs[kind])
        enc = tok.encode("The cat jumps over the fence.")
        assert enc.tokens[0] == "<s>" and enc.tokens[-1] == "</s>"
        assert [tok.token_to_id(t) for t in ("<s>", "<pad>", "</s>", "<unk>")] == [0, 1, 2, 3]
        pair = tok.encode("a query", "a document").tokens
        assert pair[0] == "<s>" and pair[-1] == "</s>" and pair.count("</s>") == 3
        config = json.loads((dirs[kind] / "tokenizer_config.json").read_text())
        assert config["tokenizer_class"] == "XLMRobertaTokenizer" and config["pad_token"] == "<pad>"


# --- forwards against the NumPy reference ------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_hidden_states_match_numpy_reference(kind, dirs, models):
    model, _ = models[kind]
    ref = Reference(dirs[kind])
    encs = [_tok(dirs[kind]).encode(t) for t in TEXTS]
    ids, mask, types = _batch(encs, _pad_id(dirs[kind]))
    hidden = np.array(model(ids, mask, types))
    for row, enc in enumerate(encs):
        want = ref.hidden(enc.ids, enc.type_ids)
        np.testing.assert_allclose(hidden[row, :len(enc.ids)], want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kind", RERANKERS)
def test_classifier_logits_match_numpy_reference(kind, dirs, models):
    model, info = models[kind]
    ref = Reference(dirs[kind])
    encs = [_tok(dirs[kind]).encode(QUERY, doc) for doc in DOCS]
    logits = np.array(model.classify(*_batch(encs, _pad_id(dirs[kind]))))
    assert logits.shape == (len(DOCS), info.num_labels) == (3, 1)
    want = np.stack([ref.logits(e.ids, e.type_ids) for e in encs])
    np.testing.assert_allclose(logits, want, atol=1e-4, rtol=1e-4)
    assert len(set(np.round(logits[:, 0], 3))) == len(DOCS), "scores should tell documents apart"


def test_bert_classifier_reads_the_segment_ids(dirs, models):
    """A BERT cross-encoder's second segment has token type 1: dropping it changes the score."""
    model, _ = models["tiny-bert-reranker"]
    ids, mask, types = _batch([_tok(dirs["tiny-bert-reranker"]).encode(QUERY, DOCS[0])], 0)
    assert abs(float(model.classify(ids, mask, types)[0, 0]) - float(model.classify(ids, mask)[0, 0])) > 1e-3


def test_dense_head_matches_numpy_reference(dirs, models):
    model, info = models["tiny-xlmr"]
    assert (info.dense_layers, info.embedding_size) == (1, 32)
    ref = Reference(dirs["tiny-xlmr"])
    encs = [_tok(dirs["tiny-xlmr"]).encode(t) for t in TEXTS]
    ids, mask, _ = _batch(encs, 1)
    projected = np.array(model.project(model(ids, mask)[:, 0]))   # cls pooling
    want = np.stack([ref.dense_head(ref.hidden(e.ids)[0]) for e in encs])
    assert projected.shape == (len(TEXTS), 32)
    np.testing.assert_allclose(projected, want, atol=1e-4, rtol=1e-4)


def test_project_is_identity_without_dense(models):
    model, _ = models["tiny-bert"]
    x = mx.arange(128, dtype=mx.float32).reshape(2, 64)
    assert mx.array_equal(model.project(x), x)


# --- batching ----------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_batched_rows_equal_single_inputs(kind, dirs, models):
    model, info = models[kind]
    tok, pad = _tok(dirs[kind]), _pad_id(dirs[kind])
    encs = ([tok.encode(QUERY, d) for d in DOCS] if info.is_classifier
            else [tok.encode(t) for t in TEXTS])
    batch = _batch(encs, pad)
    hidden = np.array(model(*batch))
    for row, enc in enumerate(encs):
        single = np.array(model(*_batch([enc], pad)))[0]
        np.testing.assert_allclose(hidden[row, :len(enc.ids)], single, atol=1e-5, rtol=0)
    if info.is_classifier:
        singles = np.concatenate([np.array(model.classify(*_batch([e], pad))) for e in encs])
        np.testing.assert_allclose(np.array(model.classify(*batch)), singles, atol=1e-5, rtol=0)


def test_padding_id_does_not_matter_under_the_mask(dirs, models):
    """XLM-R positions skip padding: padding with another id changes nothing for real tokens."""
    model, _ = models["tiny-xlmr"]
    encs = [_tok(dirs["tiny-xlmr"]).encode(t) for t in TEXTS[:2]]
    ids, mask, _ = _batch(encs, 1)
    other = mx.where(mask.astype(mx.bool_), ids, 5)
    a, b = np.array(model(ids, mask)), np.array(model(other, mask))
    n = len(encs[1].ids)
    np.testing.assert_allclose(a[1, :n], b[1, :n], atol=1e-6)


# --- the loader ----------------------------------------------------------------

def test_info_of_each_fixture(models):
    bert, xlmr = models["tiny-bert"][1], models["tiny-xlmr"][1]
    assert (bert.architecture, bert.default_pooling, bert.pooling_source) == (
        "BertModel", "mean", "1_Pooling/config.json")
    assert bert.normalize and not bert.is_classifier and bert.max_positions == 512
    assert (xlmr.architecture, xlmr.default_pooling, xlmr.max_positions) == ("XLMRobertaModel", "cls", 512)
    assert not xlmr.normalize and xlmr.hidden_size == 64 and xlmr.dtype == "float32"
    for kind in RERANKERS:
        info = models[kind][1]
        assert info.architecture.endswith("ForSequenceClassification")
        assert (info.default_pooling, info.num_labels, info.labels) == ("rank", 1, ("LABEL_0",))


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize("flag,pooling", [("pooling_mode_lasttoken", "last"),
                                          ("pooling_mode_cls_token", "cls")])
def test_pooling_comes_from_1_pooling(flag, pooling, dirs, tmp_path):
    root = _copy(dirs["tiny-bert"], tmp_path / "m")
    path = root / "1_Pooling" / "config.json"
    cfg = json.loads(path.read_text())
    cfg.update({"pooling_mode_mean_tokens": False, flag: True})
    path.write_text(json.dumps(cfg))
    assert load(root)[1].default_pooling == pooling


def test_pooling_llama_server_cannot_name_falls_back_with_a_note(dirs, tmp_path):
    root = _copy(dirs["tiny-bert"], tmp_path / "m")
    path = root / "1_Pooling" / "config.json"
    cfg = json.loads(path.read_text())
    cfg.update({"pooling_mode_mean_tokens": False, "pooling_mode_max_tokens": True})
    path.write_text(json.dumps(cfg))
    info = load(root)[1]
    assert info.default_pooling == "mean" and "max_tokens" in info.notes[0]


@pytest.mark.parametrize("kind", ["tiny-bert", "tiny-xlmr"])
def test_plain_checkpoint_defaults_to_mean(kind, dirs, tmp_path, models):
    """No modules.json: sentence-transformers' own default (mean), no Dense, no Normalize."""
    root = _copy(dirs[kind], tmp_path / "m")
    (root / "modules.json").unlink()
    _, info = load(root)
    assert (info.default_pooling, info.pooling_source) == ("mean", "architecture default")
    assert (info.dense_layers, info.embedding_size, info.normalize) == (0, 64, False)


@pytest.mark.parametrize("prefix", ["model.", "bert."])
def test_prefixed_weight_names_load_alike(prefix, dirs, models, tmp_path):
    root = _copy(dirs["tiny-bert"], tmp_path / "m")
    w = mx.load(str(root / "model.safetensors"))
    mx.save_safetensors(str(root / "model.safetensors"), {prefix + k: v for k, v in w.items()})
    ids, mask, _ = _batch([_tok(root).encode(TEXTS[0])], 0)
    assert mx.array_equal(load(root)[0](ids, mask), models["tiny-bert"][0](ids, mask))


def test_unprefixed_classifier_body_loads_alike(dirs, models, tmp_path):
    root = _copy(dirs["tiny-xlmr-reranker"], tmp_path / "m")
    w = mx.load(str(root / "model.safetensors"))
    mx.save_safetensors(str(root / "model.safetensors"),
                        {k.removeprefix("roberta."): v for k, v in w.items()})
    ids, mask, _ = _batch([_tok(root).encode(QUERY, DOCS[0])], 1)
    assert mx.array_equal(load(root)[0].classify(ids, mask),
                          models["tiny-xlmr-reranker"][0].classify(ids, mask))


def test_bf16_weights_are_computed_in_float32(dirs, tmp_path):
    root = _copy(dirs["tiny-bert-reranker"], tmp_path / "m")
    w = mx.load(str(root / "model.safetensors"))
    mx.save_safetensors(str(root / "model.safetensors"), {k: v.astype(mx.bfloat16) for k, v in w.items()})
    model, info = load(root)
    assert info.dtype == "float32"
    from mlx.utils import tree_flatten
    assert {p.dtype for _, p in tree_flatten(model.parameters())} == {mx.float32}
    ids, mask, types = _batch([_tok(root).encode(QUERY, DOCS[0])], 0)
    assert model.classify(ids, mask, types).dtype == mx.float32


def test_a_missing_tensor_is_named(dirs, tmp_path):
    root = _copy(dirs["tiny-bert"], tmp_path / "m")
    w = mx.load(str(root / "model.safetensors"))
    del w["encoder.layer.1.output.LayerNorm.bias"]
    mx.save_safetensors(str(root / "model.safetensors"), w)
    with pytest.raises(EncoderLoadError, match="encoder.layer.1.output.LayerNorm.bias"):
        load(root)


def test_other_model_types_are_refused(dirs, tmp_path):
    root = _copy(dirs["tiny-bert"], tmp_path / "m")
    cfg = json.loads((root / "config.json").read_text())
    (root / "config.json").write_text(json.dumps({**cfg, "model_type": "qwen3"}))
    with pytest.raises(EncoderLoadError, match="unsupported encoder model_type 'qwen3'"):
        load(root)


def test_transformers_reads_the_fixture_tokenizers_alike(dirs):
    """tokenizer_config.json names HF's classes; what transformers builds from
    them must tokenize as tokenizer.json does (the engine may load either)."""
    transformers = pytest.importorskip("transformers")
    for kind in ("tiny-bert", "tiny-xlmr"):
        hf = transformers.AutoTokenizer.from_pretrained(str(dirs[kind]))
        ours = _tok(dirs[kind])
        for a, b in [(QUERY, DOCS[2]), (TEXTS[2], None), ("  two  spaces\tand\nlines", "x")]:
            want = ours.encode(a, b).ids if b else ours.encode(a).ids
            assert hf(a, b)["input_ids"] == want, (kind, a, b)


@pytest.mark.parametrize("kind", ["tiny-bert", "tiny-xlmr"])
def test_an_input_longer_than_the_positions_is_refused(kind, models):
    model, info = models[kind]
    assert model.max_length == info.max_positions == 512
    model(mx.full((1, 512), 7), mx.ones((1, 512)))
    with pytest.raises(ValueError, match="513 tokens exceeds the 512 positions"):
        model(mx.full((1, 513), 7), mx.ones((1, 513)))


def test_old_sentence_transformers_layout_reads_0_transformer(dirs, models, tmp_path):
    """Early sentence-transformers saved the body under 0_Transformer/."""
    root = _copy(dirs["tiny-xlmr"], tmp_path / "m")
    (root / "0_Transformer").mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (root / name).rename(root / "0_Transformer" / name)
    modules = json.loads((root / "modules.json").read_text())
    modules[0]["path"] = "0_Transformer"
    (root / "modules.json").write_text(json.dumps(modules))
    model, info = load(root)
    assert info == models["tiny-xlmr"][1]
    ids, mask, _ = _batch([_tok(root / "0_Transformer").encode(TEXTS[0])], 1)
    assert mx.array_equal(model.project(model(ids, mask)[:, 0]),
                          models["tiny-xlmr"][0].project(models["tiny-xlmr"][0](ids, mask)[:, 0]))


def test_an_unknown_dense_activation_is_refused(dirs, tmp_path):
    root = _copy(dirs["tiny-xlmr"], tmp_path / "m")
    path = root / "2_Dense" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()),
                                "activation_function": "torch.nn.modules.activation.Mish"}))
    with pytest.raises(EncoderLoadError, match="Mish"):
        load(root)
