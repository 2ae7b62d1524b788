"""Routes llama-server always mounts for features this server does not serve
yet, answered exactly as upstream answers them when the feature is absent:

* GET /lora-adapters: the loaded adapters; with none loaded, `[]`.
* POST /lora-adapters: a body that is not an array is upstream's 400;
  any array answers `{"success": true}` (upstream scales the adapters it
  names by index, and with none loaded there is nothing to scale).
* POST /v1/audio/transcriptions, /audio/transcriptions: a model without
  audio input answers 501 before the (multipart) body is read.
"""

from __future__ import annotations

from typing import Any

from quart import Response

from ..http.errors import ApiError, error_response, json_response


def lora_adapters() -> Response:
    return json_response([])


def set_lora_adapters(body: Any) -> Response:
    if not isinstance(body, list):
        raise ApiError("Request body must be an array")
    return json_response({"success": True})


def transcriptions() -> Response:
    return error_response(ApiError("The current model does not support audio input.",
                                   "not_supported_error"))
