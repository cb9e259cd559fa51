"""``[proxy] http_parser``: which uvicorn HTTP/1.1 protocol the proxy serves with.

httptools (C) by default, h11 (pure Python) when asked or when httptools cannot be
imported; asking for httptools without it fails with the fix. Both parsers meet the
hostile-input and slow-reader suites (tests/security), with the proxy's deadlines mixed in.
"""

from __future__ import annotations

import sys

import pytest
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from slr.errors import UsageError
from slr.proxy.server import http_protocol

pytestmark = pytest.mark.timeout(10)


def test_auto_and_httptools_parse_with_httptools_and_h11_with_h11():
    for parser in ("auto", "httptools"):
        protocol = http_protocol(parser, header_timeout=3.0, write_timeout=4.0)
        assert issubclass(protocol, HttpToolsProtocol)
        assert (protocol.header_timeout, protocol.write_timeout) == (3.0, 4.0)
    h11 = http_protocol("h11")
    assert issubclass(h11, H11Protocol) and not issubclass(h11, HttpToolsProtocol)


def test_without_httptools_auto_falls_back_to_h11_and_asking_for_it_names_the_fix(
    monkeypatch,
):
    # A None entry in sys.modules makes the import fail, as if httptools were not installed.
    monkeypatch.setitem(sys.modules, "uvicorn.protocols.http.httptools_impl", None)
    assert issubclass(http_protocol("auto"), H11Protocol)
    with pytest.raises(UsageError, match=r"pip install httptools.*http_parser = 'h11'"):
        http_protocol("httptools")
