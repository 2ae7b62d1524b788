"""Image input on the engine: the tower's features reach the language model,
a batched image job decodes as it does alone, and the prompt cache never
hands one picture's KV to another."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from mlxcel_trio.engine.prompt_cache import PromptCache
from mlxcel_trio.protocol.records import Failed, Finished, ImageInput, Job, SamplingParams
from mlxcel_trio.server.http.errors import ApiError

from .test_scheduler import of, run

GREEDY = SamplingParams(temperature=0.0)
TEXT = tuple(range(40, 60))


def picture(seed: int, size=(40, 48)) -> ImageInput:
    h, w = size
    rgb = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8).tobytes()
    return ImageInput(rgb, w, h, hashlib.sha256(rgb).hexdigest(), start=len(TEXT))


@pytest.fixture(scope="module")
def vlm(tiny_vlm_model):
    import mlx.core as mx
    from mlx_lm.utils import load_model

    from mlxcel_trio.engine import vision
    from mlxcel_trio.engine.towers.llava import LlavaTower
    from mlxcel_trio.engine.vocab import Vocab

    model, config = load_model(tiny_vlm_model, get_model_classes=vision.model_classes)
    encoder = LlavaTower.load(tiny_vlm_model, config, mx.float32)
    facts = json.loads((tiny_vlm_model / "fixture_facts.json").read_text())
    return model, Vocab(tiny_vlm_model), encoder, facts


def make(vlm, cache=None, slots=3, with_vision=True):
    from mlxcel_trio.engine.scheduler import Scheduler

    model, vocab, encoder, _ = vlm
    return Scheduler(model, vocab, n_slots=slots, n_ctx_slot=256, batch_size=16,
                     prompt_cache=cache, vision=encoder if with_vision else None)


def image_job(i, vlm, *images, ns=None):
    facts = vlm[3]
    n = facts["tokens_per_image"]
    prompt = list(TEXT)
    placed = []
    for im in images:
        placed.append(ImageInput(im.rgb, im.width, im.height, im.digest, start=len(prompt)))
        prompt += [facts["image_token"]] * n + [70, 71]
    return Job(i, tuple(prompt), n_predict=10, sampling=GREEDY, ignore_eos=True,
               cache_ns=ns, images=tuple(placed))


def solo(s, job):
    out = []
    s.submit(job, out)
    run(s, out)
    (fin,) = of(out, Finished, job.id)
    return fin.tokens


def test_the_picture_changes_the_answer(vlm):
    s = make(vlm)
    a = solo(s, image_job(1, vlm, picture(1)))
    b = solo(s, image_job(2, vlm, picture(2)))
    plain = image_job(3, vlm, picture(1))
    text_only = solo(s, Job(3, plain.prompt, n_predict=10, sampling=GREEDY, ignore_eos=True))
    assert a != b
    assert a != text_only
    # deterministic: the same picture again gives the same tokens
    assert solo(s, image_job(4, vlm, picture(1))) == a


def test_batched_image_and_text_jobs_match_their_solo_runs(vlm):
    s = make(vlm)
    jobs = [image_job(1, vlm, picture(1)), image_job(2, vlm, picture(2), picture(3)),
            Job(3, TEXT + (80, 81), n_predict=10, sampling=GREEDY, ignore_eos=True)]
    alone = [solo(make(vlm), j) for j in jobs]
    out = []
    for j in jobs:
        s.submit(j, out)
    run(s, out)
    assert [of(out, Finished, j.id)[0].tokens for j in jobs] == alone


def test_prompt_cache_keys_kv_by_picture(vlm):
    cache = PromptCache(None)
    s = make(vlm, cache)
    first = solo(s, image_job(1, vlm, picture(1), ns="chat"))
    assert len(cache) == 1
    other = solo(s, image_job(2, vlm, picture(2), ns="chat"))
    cold_other = solo(make(vlm), image_job(3, vlm, picture(2)))
    assert other == cold_other and other != first
    # the same picture again adopts its own prefix and agrees with the cold run
    out = []
    again = image_job(4, vlm, picture(1), ns="chat")
    s.submit(again, out)
    run(s, out)
    (fin,) = of(out, Finished, 4)
    assert fin.timings.cache_n > again.images[0].start and fin.tokens == first


def test_a_checkpoint_without_a_tower_refuses_images(vlm):
    s = make(vlm, with_vision=False)
    out = []
    s.submit(image_job(1, vlm, picture(1)), out)
    (failed,) = of(out, Failed, 1)
    err = ApiError.from_failed(failed)
    assert err.type == "not_supported_error"
    assert err.message.startswith("image input is not supported")
