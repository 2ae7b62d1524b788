"""The native kernels, built once (cached across runs, see
mlxcel_trio/engine/native/build.py); tests that need them skip with the reason
where this machine cannot build them."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def kernels():
    from mlxcel_trio.engine import native

    st = native.status()
    if not st.available:
        pytest.skip(f"native kernels unavailable here: {st.detail}")
    return native
