"""GET and POST /lora-adapters: the loaded adapters and their global scales
(server/adapters.py).  A POST sets the scale of every adapter it lists and
drops the others to 0, as upstream; requests parsed after it run with the
new scales, requests already running keep theirs."""

from __future__ import annotations

from typing import Any

from quart import Response

from ..adapters import AdapterTable
from ..http.errors import json_response


def list_adapters(table: AdapterTable) -> Response:
    return json_response(table.entries())


def set_adapters(table: AdapterTable, body: Any) -> Response:
    table.apply(body)
    return json_response({"success": True})
