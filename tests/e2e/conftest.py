"""Fixtures shared by the end-to-end tests of the OpenAI-shaped routes."""

from __future__ import annotations

import openai
import pytest


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    """The official OpenAI SDK pointed at the shared server (no retries, so a
    failure is the server's answer, not the SDK's second try)."""
    with openai.OpenAI(base_url=server.url + "/v1", api_key="x", timeout=60,
                       max_retries=0) as c:
        yield c
