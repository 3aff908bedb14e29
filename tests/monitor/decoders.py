"""Run a decoding test under both protobuf decoders: the Python one (upb's parse and the
walk of ``records_from_request``) and the compiled one of native/ (``assaywatch_native``),
which must give the same records, counters and errors.

A module opts in with ``pytestmark = pytest.mark.usefixtures("each_decoder")`` after
importing :func:`each_decoder`; its tests then run once per decoder (``[python]`` and
``[native]`` in their ids). The native run is skipped, with the reason, when the compiled
module is not installed (README's test command installs it).
"""

from __future__ import annotations

import pytest

from assaywatch.monitor.receivers.otlp import decode as decode_module

NATIVE_INSTALLED = decode_module._native_module is not None
DECODERS = [
    pytest.param("python", id="python"),
    pytest.param("native", id="native", marks=pytest.mark.skipif(
        not NATIVE_INSTALLED,
        reason="the compiled decoder is not installed (pip install ./native, needs Rust)")),
]


@pytest.fixture(params=DECODERS)
def each_decoder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """``python`` or ``native``: the decoder ``decode_proto_request`` uses in this test."""
    monkeypatch.setenv(decode_module.NATIVE_ENV, "1" if request.param == "native" else "0")
    assert decode_module.native_available() == (request.param == "native")
    return str(request.param)
