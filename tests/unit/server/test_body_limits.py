"""server/http/body.py nesting limit and server/http/limits.py per-token field limits."""

from __future__ import annotations

import pytest

from mlxcel_trio.server.http import limits
from mlxcel_trio.server.http.body import MAX_DEPTH, nesting_depth, parse_body
from mlxcel_trio.server.http.errors import ApiError


def test_nesting_depth_ignores_brackets_inside_strings():
    assert nesting_depth('{"a": "' + "[" * 500 + '"}') == 1
    deep = "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1)
    assert nesting_depth(deep) == MAX_DEPTH + 1
    assert nesting_depth('["\\"[[[", ' + deep + "]") == MAX_DEPTH + 2


def test_too_deep_is_a_400_before_parsing():
    ok = ("[" * MAX_DEPTH + "]" * MAX_DEPTH).encode()
    assert parse_body(ok) is not None
    with pytest.raises(ApiError) as err:
        parse_body(b'{"response_fields": ' + b"[" * 5000 + b"]" * 5000 + b"}")
    assert err.value.status == 400 and f"{MAX_DEPTH} levels" in err.value.message


@pytest.mark.parametrize(("body", "needle"), [
    ({"stop": ["x"] * (limits.MAX_STOPS + 1)}, "Field 'stop': at most"),
    ({"stop": ["y" * limits.MAX_STOP_CHARS, "z"]}, "Field 'stop': the stop strings"),
    ({"stop": "y" * (limits.MAX_STOP_CHARS + 1)}, "Field 'stop': a stop string"),
    ({"logit_bias": {str(i): 1 for i in range(limits.MAX_LOGIT_BIAS + 1)}}, "Field 'logit_bias'"),
    ({"response_fields": ["a"] * (limits.MAX_RESPONSE_FIELDS + 1)}, "Field 'response_fields'"),
])
def test_per_token_fields_past_their_limit_are_400(body, needle):
    with pytest.raises(ApiError) as err:
        limits.check(body)
    assert err.value.status == 400 and err.value.message.startswith(needle)


def test_fields_within_limits_pass():
    limits.check({"stop": ["x"] * limits.MAX_STOPS, "logit_bias": [[1, 2.0]],
                  "response_fields": ["content"]})
    limits.check([1, 2])


def test_the_media_routes_get_the_image_budgets_ceiling():
    """The chat, responses and Anthropic routes (and their token counters)
    carry inline images; every other route keeps the general limit."""
    from mlxcel_trio.server.http.body_limits import media_body_limits
    from mlxcel_trio.protocol.routes import ROUTES

    mib = 1024 * 1024
    uploads = {"/api/v1/audio/transcriptions", "/api/audio/transcriptions"}
    table = media_body_limits(ROUTES, "/api", 20 * mib, 16, general=64 * mib)
    assert set(table) - uploads == {f"/api{p}" for p in (
        "/chat/completions", "/v1/chat/completions", "/chat/completions/input_tokens",
        "/v1/chat/completions/input_tokens", "/v1/messages", "/v1/messages/count_tokens",
        "/v1/responses", "/responses", "/responses/input_tokens",
        "/v1/responses/input_tokens")}
    assert {table[p] for p in set(table) - uploads} == {-(-20 * mib * 16 * 4 // 3) + mib}
    # a small budget never shrinks what a text-only body may send
    small = media_body_limits(ROUTES, "", 1000, 1, general=64 * mib)
    assert {v for p, v in small.items() if "/audio/" not in p} == {64 * mib}


def test_an_audio_upload_is_held_to_one_clip_whatever_the_image_budget():
    """The transcription routes take one multipart clip: their limit is that
    clip and its text fields, under the general limit, so a chunked upload
    is cut once it passes it rather than buffered to the general limit."""
    from mlxcel_trio.media.limits import AUDIO_FILE_BYTES, UPLOAD_BODY_BYTES
    from mlxcel_trio.server.http.body_limits import media_body_limits
    from mlxcel_trio.protocol.routes import ROUTES

    mib = 1024 * 1024
    for budget in ((20 * mib, 16), (1000, 1)):
        table = media_body_limits(ROUTES, "", *budget, general=64 * mib)
        assert table["/v1/audio/transcriptions"] == table["/audio/transcriptions"] \
            == UPLOAD_BODY_BYTES == AUDIO_FILE_BYTES + mib
