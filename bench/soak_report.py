"""``bench/soak.py --report``: docs/reliability.md, every figure generated, none typed.

Three sources: a soak's JSON (``--soak-json``, or a soak run now with the given sizes), the
proxy fuzz (``--fuzz-json``, or ``bench/proxy_fuzz.py --n N --json`` run now) and the
dead-client tests (tests/reliability/test_dead_client.py, run now; each case asserts the
engine stopped within one decode step of the client leaving, so its outcome is the figure).

The JSON behind the page is kept in ``bench/results/`` (``soak-*.json``, ``proxy-fuzz.json``)
so the page can be written again with one more soak without re-running the others:

    .venv/bin/python bench/soak.py --report --fuzz-json bench/results/proxy-fuzz.json \
        --soak-json bench/results/soak-mini-swe-agent.json --soak-json ... \
        --soak-json bench/results/soak-docker-restart.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "reliability.md"


def _fuzz(args: argparse.Namespace) -> dict[str, Any]:
    if args.fuzz_json is not None:
        return json.loads(Path(args.fuzz_json).read_text())
    res = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "proxy_fuzz.py"), "--n", str(args.fuzz_n), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(res.stdout.strip().splitlines()[-1])


def _dead_client() -> list[tuple[str, str]]:
    """(case, outcome) of every dead-client test."""
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "junit.xml"
        subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
             str(ROOT / "tests" / "reliability" / "test_dead_client.py"), f"--junitxml={xml}"],
            capture_output=True, cwd=ROOT, check=False,
        )  # fmt: skip
        cases = []
        for case in ET.parse(xml).getroot().iter("testcase"):
            bad = case.find("failure") is not None or case.find("error") is not None
            outcome = "skipped" if case.find("skipped") is not None else "FAIL" if bad else "pass"
            cases.append((case.get("name", "?"), outcome))
        return cases


def _soaks(args: argparse.Namespace) -> list[dict[str, Any]]:
    if args.soak_json:
        return [json.loads(Path(p).read_text()) for p in args.soak_json]
    from soak import run_soak

    return [run_soak(args)]


def _goal(value: Any, goal: Any) -> str:
    return "met" if value == goal else "**not met**"


def _soak_rows(soak: dict[str, Any]) -> list[tuple[str, str, Any, str]]:
    area = (
        f"Faults under load ({soak.get('agent')}, {soak.get('backend', 'local')} backend, "
        f"{soak.get('rollout_workers') or 0} rollout workers, {soak.get('wall_s')} s)"
    )
    rows = [
        (area, "trials recorded", soak.get("trials_recorded"),
         f"{soak.get('discarded')} of them moved aside by a resume"),
        ("", "completed", soak.get("completed"), ""),
        ("", "recorded as infrastructure failures", soak.get("infra_failures"),
         ", ".join(f"{k} {v}" for k, v in soak.get("terminations", {}).items())),
        ("", "trials trained on", soak.get("trained_trials"), f"{soak.get('steps')} steps"),
        ("", "lost", soak.get("lost"), f"goal 0: {_goal(soak.get('lost'), 0)}"),
        ("", "counted twice", soak.get("counted_twice"),
         f"goal 0: {_goal(soak.get('counted_twice'), 0)}"),
        ("", "steps trained on an infrastructure failure", soak.get("steps_trained_on_infra"),
         f"goal 0: {_goal(soak.get('steps_trained_on_infra'), 0)}"),
        ("", "corrupt trial records", soak.get("corrupt_records"), "goal 0"),
        ("", "run finished", soak.get("finished"),
         f"unplanned stops: {soak.get('crashes')}, resumes: {soak.get('resumes')}"),
    ]  # fmt: skip
    for kind, f in soak.get("faults", {}).items():
        rows.append(
            ("", f"fault `{kind}`: injected / recovered", f"{f['injected']} / {f['recovered']}",
             f"time to recover: mean {f['recover_mean_s']} s, max {f['recover_max_s']} s"))  # fmt: skip
    return rows


def render(soaks: list[dict[str, Any]], fuzz: dict[str, Any], dead: list[tuple[str, str]]) -> str:
    good = fuzz.get("good_session", {})
    dead_ok = sum(o == "pass" for _, o in dead)
    rows = [row for soak in soaks for row in _soak_rows(soak)]
    rows += [
        ("Proxy under hostile input", "requests", fuzz.get("requests"), ""),
        ("", "5xx", fuzz.get("status_5xx"), f"goal 0: {_goal(fuzz.get('status_5xx'), 0)}"),
        ("", "crashes", fuzz.get("crashes"), f"goal 0: {_goal(fuzz.get('crashes'), 0)}"),
        ("", "wrong session token let in", fuzz.get("wrong_token_let_in"), "goal 0"),
        ("", "slow clients cut off",
         f"{fuzz.get('slow_clients_cut_off')} / {fuzz.get('slow_clients')}",
         f"slowest after {fuzz.get('slow_client_max_seconds')} s"),
        ("", "RSS growth (MB)", fuzz.get("rss_growth_mb"), "goal < 50"),
        ("", "well-behaved session calls ok", good.get("calls_ok"),
         f"{good.get('calls_failed')} failed; recorded exactly: {good.get('recorded_exactly')}"),
        ("A dead client frees the engine", "cases within one decode step",
         f"{dead_ok} / {len(dead)}", "; ".join(f"{n}: {o}" for n, o in dead)),
    ]  # fmt: skip
    lines = [
        "# Reliability figures",
        "",
        "<!-- generated by `python bench/soak.py --report`; do not edit by hand -->",
        "",
        "Figures of the reliability suite (faults under load, hostile proxy input, dead",
        "clients), from one run of each bench on the machine that wrote this page.",
        "",
        "Soak (`bench/soak.py`): a real `slr run` in async mode (a tiny model, two engine",
        "replicas and the trainer as Ray actors) while a seeded injector kills, one fault at a",
        "time, engine replicas, rollout workers, running sandboxes and the coordinator (then",
        "`slr run --resume`), makes the run directory's disk full, and (docker backend)",
        "restarts the docker daemon: a private `dockerd` the bench starts for the soak (its own",
        "socket, data root, exec root and bridge; the images copied in from the machine's",
        "daemon), SIGTERMed and started again on the same data root. Every",
        "count is read from the run directory after the run (`bench/soak_audit.py`); time to",
        "recover is from the fault's end to the next completed trial recorded, or to the run",
        "finishing (in soaks written before that rule, a fault after the last trial shows as",
        "not recovered although the run finished). For the coordinator it includes a fresh",
        "`slr run --resume` starting Ray, the engine replicas, the trainer and its preflight",
        "on the machine as loaded as it was.",
        "",
    ]
    for soak in soaks:
        lines.append(
            f"- {soak.get('agent')}, {soak.get('backend', 'local')} backend: "
            f"concurrency {soak.get('concurrency')}, "
            f"{soak.get('rollout_workers') or 0} rollout workers, seed {soak.get('seed')}, "
            f"{sum(f['injected'] for f in soak.get('faults', {}).values())} faults, "
            f"run directory on a tmpfs: "
            f"{soak.get('tmpfs')}" + (f" ({soak['source']})" if soak.get("source") else "")
        )
    lines += [
        "",
        f"Proxy fuzz (`bench/proxy_fuzz.py`): {fuzz.get('requests')} requests against a live",
        "proxy with a real engine. Dead clients: tests/reliability/test_dead_client.py.",
        "",
        "| area | figure | value | note |",
        "| --- | --- | --- | --- |",
    ]
    lines += [f"| {a} | {f} | {v} | {n} |" for a, f, v, n in rows]
    if not any("docker-restart" in soak.get("faults", {}) for soak in soaks):
        lines += ["", "Not injected: a docker daemon restart (`--backend docker`)."]
    lines.append("")
    return "\n".join(lines)


def write_report(args: argparse.Namespace) -> Path:
    text = render(_soaks(args), _fuzz(args), _dead_client())
    DOC.write_text(text)
    return DOC
