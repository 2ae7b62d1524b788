"""Hostile-input limits on request fields whose cost grows per generated token.

Upstream bounds none of these.  Each is a value a client can make huge in a
body well under the size limit, and each costs work on every decode step of
the request (stop strings are searched after every token, bias entries are
applied to every step's logits, response_fields paths are walked for every
frame), so one request could slow every other stream sharing the batch.
Past a limit the request is refused with a 400 naming the field, the limit
and what was sent, before any generation starts.  Nesting depth and the
whole body's size are bounded earlier (body.py, app.py).

The limits are far above what any real client sends (OpenAI accepts 4 stop
sequences); they exist to keep per-token work bounded, not to shape usage.
"""

from __future__ import annotations

from typing import Any

from .errors import ApiError

MAX_STOPS = 1024
MAX_STOP_CHARS = 256 * 1024
MAX_LOGIT_BIAS = 1 << 18
MAX_RESPONSE_FIELDS = 1024


def _refuse(field: str, what: str) -> ApiError:
    return ApiError(f"Field '{field}': {what}")


def check(body: Any) -> None:
    """Raise a 400 ApiError if a per-token field of `body` is past its limit."""
    if not isinstance(body, dict):
        return
    stop = body.get("stop")
    if isinstance(stop, list):
        if len(stop) > MAX_STOPS:
            raise _refuse("stop", f"at most {MAX_STOPS} stop strings are accepted, "
                                  f"got {len(stop)}")
        size = sum(len(s) for s in stop if isinstance(s, str))
        if size > MAX_STOP_CHARS:
            raise _refuse("stop", f"the stop strings may total at most {MAX_STOP_CHARS} "
                                  f"characters, got {size}")
    elif isinstance(stop, str) and len(stop) > MAX_STOP_CHARS:
        raise _refuse("stop", f"a stop string may be at most {MAX_STOP_CHARS} characters, "
                              f"got {len(stop)}")
    bias = body.get("logit_bias")
    if isinstance(bias, (list, dict)) and len(bias) > MAX_LOGIT_BIAS:
        raise _refuse("logit_bias", f"at most {MAX_LOGIT_BIAS} entries are accepted, "
                                    f"got {len(bias)}")
    fields = body.get("response_fields")
    if isinstance(fields, list) and len(fields) > MAX_RESPONSE_FIELDS:
        raise _refuse("response_fields", f"at most {MAX_RESPONSE_FIELDS} paths are accepted, "
                                         f"got {len(fields)}")
