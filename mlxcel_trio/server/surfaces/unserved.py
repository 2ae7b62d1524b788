"""Routes llama-server always mounts for features this server does not serve
yet, answered exactly as upstream answers them when the feature is absent:

* POST /v1/audio/transcriptions, /audio/transcriptions: a model without
  audio input answers 501 before the (multipart) body is read.
"""

from __future__ import annotations

from quart import Response

from ..http.errors import ApiError, error_response


def transcriptions() -> Response:
    return error_response(ApiError("The current model does not support audio input.",
                                   "not_supported_error"))
