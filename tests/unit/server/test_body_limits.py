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
