"""The proxy under hostile input, the CI version of ``bench/proxy_fuzz.py``.

Hundreds of generated and raw attacks (schema-driven bodies, broken JSON and HTTP, huge
bodies and ``max_tokens``, wrong tokens and path tricks, disconnects) while slow clients
trickle bytes and a well-behaved session holds a conversation. No 5xx, no crash, no wrong
token let in, every slow client cut off, the good session's calls all answered and
recorded exactly.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

BENCH = Path(__file__).resolve().parents[2] / "bench" / "proxy_fuzz.py"


def _fuzz():
    sys.path.insert(0, str(BENCH.parent))  # its harness module
    spec = importlib.util.spec_from_file_location("proxy_fuzz", BENCH)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_hostile_input_gets_no_5xx_and_harms_no_session(proxy):
    figures = _fuzz().run_fuzz(proxy, n=800, seed=17, slow_clients=4)
    summary = {k: v for k, v in figures.items() if k != "by_kind"}
    assert figures["requests"] == 800
    assert figures["status_5xx"] == 0, figures["by_kind"]
    assert figures["crashes"] == 0, figures["crash_logs"]
    assert figures["wrong_token_let_in"] == 0, figures["by_kind"]["bad_token"]
    assert figures["slow_clients"] >= 4
    assert figures["slow_clients_cut_off"] == figures["slow_clients"], summary
    good = figures["good_session"]
    assert good["calls_ok"] >= 3 and good["calls_failed"] == 0, good
    assert good["recorded_exactly"], good
    assert figures["rss_growth_mb"] < 50, summary
