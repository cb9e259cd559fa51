"""`slr dashboard`: the live web UI and its static export, in a real headless Chromium.

The run directory is a real one: `slr run`'s ``train`` on the tiny model (oracle agent: real steps,
metrics, events, trials, checkpoint), plus a session served through the real proxy (real
policy tokens, loss mask, log-probs and transcript) recorded in the same run directory.
The timeouts include building that run once per module (seconds on an idle machine).
Screenshots go to $SLR_TEST_ARTIFACTS (else the test's tmp folder); their paths are printed.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from click.testing import CliRunner
from headless_chromium import chromium, find
from litestar.testing import TestClient

from slr.config import load_config
from slr.contracts import Reward, TrialResult
from slr.plugins import get_plugin_manager
from slr.rollout.recorder import TrialRecorder
from slr.run.directory import RunDir
from slr.run.training import train
from slr_cli.dashboard.app import build_app
from slr_cli.dashboard.data import Run, tokenizer_decode
from slr_cli.main import cli

ROOT = Path(__file__).resolve().parents[2]
SLR = str(Path(sys.executable).with_name("slr"))
BROWSER = find()
skip_without_browser = pytest.mark.skipif(isinstance(BROWSER, str), reason=str(BROWSER))


def needs_browser(test):
    return pytest.mark.browser(skip_without_browser(test))


SERVED = "served-0"


def artifacts(tmp_path: Path) -> Path:
    return Path(os.environ.get("SLR_TEST_ARTIFACTS") or tmp_path) / "dashboard"


@pytest.fixture(scope="module")
def real_run(tmp_path_factory) -> Path:
    """One step of `slr run` on the tiny model, plus one real proxy session in the run."""
    from slr_engine_hf.engine import HfEngine

    from slr_testkit import tiny

    base = tmp_path_factory.mktemp("dash")
    model, tok = tiny.tiny_model(hidden=32, layers=1)
    model_dir = tiny.save(model, tok, base / "model")
    cfg = base / "run.toml"
    cfg.write_text(
        f"""
[run]
name = "dash"
runs_dir = "{base / "runs"}"
steps = 1
[tasks]
path = "{ROOT / "examples" / "tasks"}"
include = ["hello-world", "make-directory"]
[rollout]
tasks_per_step = 2
n_per_task = 2
concurrency = 2
max_tokens = 12
[agent]
name = "oracle"
[backend]
name = "local"
[engine]
name = "hf"
model = "{model_dir}"
"""
    )
    # `slr run`'s own entry (in this process: the model's libraries are imported once)
    run_dir = train(load_config(cfg, plugins=get_plugin_manager()))
    run_dir.close()
    path = run_dir.path
    config = load_config(path / "config.toml", plugins=get_plugin_manager())

    async def serve_one_session() -> None:
        engine = HfEngine.from_model(model, tok)
        run = RunDir.open(path)
        async with TrialRecorder(
            run, plugins=get_plugin_manager(), config=config, engine=engine
        ) as s:
            opened = s.open_session(SERVED)
            client = openai.AsyncOpenAI(
                base_url=opened.openai_base_url, api_key=opened.token, max_retries=0
            )
            history: list[Any] = [
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": "List the files."},
            ]
            first = await client.chat.completions.create(model="policy", messages=history)
            history += [
                {"role": "assistant", "content": first.choices[0].message.content},
                {"role": "user", "content": "README.md setup.py"},
            ]
            await client.chat.completions.create(model="policy", messages=history)
            await s.close_session(opened)
        run.close()

    asyncio.run(serve_one_session())
    return path


@pytest.fixture
def served(real_run, tmp_path) -> Iterator[tuple[Path, str]]:
    """A copy of the run (the test writes to it), and the URL `slr dashboard RUNS_DIR
    --port 0 --token T` prints, started as a user starts it (with a token, so the page's
    every request and its event stream must carry it)."""
    copy = tmp_path / "runs" / real_run.name
    shutil.copytree(real_run, copy)
    with _serve(copy, "--token", "t0ken-for-the-page") as (_, url):
        assert url.endswith("/?token=t0ken-for-the-page")  # the page and its stream carry it
        yield copy, url


@contextmanager
def _serve(path: Path, *args: str) -> Iterator[tuple[subprocess.Popen, str]]:
    with tempfile.TemporaryFile("w+") as stderr:
        proc = subprocess.Popen(
            [SLR, "dashboard", str(path.parent), "--port", "0", *args],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()  # blocks until the server listens (or exits)
            match = re.fullmatch(r"dashboard: (http://\S+)\n", line)
            if match is None:
                proc.wait(timeout=20)
                stderr.seek(0)
                raise AssertionError(f"no URL line: {line!r}; stderr: {stderr.read()[-3000:]}")
            yield proc, match.group(1)
        finally:
            proc.terminate()
            proc.wait(timeout=20)


# -- without a browser ----------------------------------------------------------------------


@pytest.mark.timeout(240)
def test_a_trials_detail_holds_its_real_tokens_mask_and_text(real_run):
    record = RunDir.open(real_run).trial(SERVED)
    assert record.trajectory is not None
    run = Run(real_run)
    run.decode = tokenizer_decode(None, run.config())
    detail = run.trial_detail(SERVED)
    (seg,) = detail["segments"]
    recorded = record.trajectory.segments[0]
    assert seg["ids"] == list(recorded.token_ids) and seg["mask"] == list(recorded.loss_mask)
    assert 0 < sum(seg["mask"]) < len(seg["mask"])
    assert seg["text"] is not None and "List the files." in "".join(seg["text"])
    assert [c["call"] for c in detail["calls"]] == [1, 2]
    snap = Run(real_run).snapshot()  # a fresh follower: nothing read before
    plugins = {p["role"]: p for p in snap["plugins"]}
    assert plugins["engine"]["distribution"] == "slr-engine-hf"
    assert plugins["agent, as recorded"]["name"] == "oracle"
    assert [m["step"] for m in snap["metrics"]] == [1] and snap["latest_checkpoint"]
    rows = {r["id"]: r for r in run.trial_rows()}
    assert len(rows) == 5 and rows[SERVED]["policy_tokens"] == recorded.num_policy_tokens


@pytest.mark.timeout(240)
def test_off_loopback_without_the_token_is_refused(real_run):
    with _serve(real_run, "--host", "0.0.0.0") as (_, url):
        token = re.search(r"\?token=(\S+)$", url)
        assert token, f"off loopback the URL must carry a generated token: {url}"
        port = int(url.split(":")[2].split("/")[0])
        local = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{local}/api/runs").status_code == 401
        assert httpx.get(f"{local}/?token=wrong").status_code == 401
        assert (
            httpx.get(f"{local}/api/runs", headers={"Authorization": "Bearer x"}).status_code == 401
        )
        ok = httpx.get(f"{local}/api/runs", headers={"Authorization": f"Bearer {token.group(1)}"})
        assert ok.status_code == 200 and ok.json() == [real_run.name]
        assert httpx.get(f"{local}/?token={token.group(1)}").status_code == 200


@pytest.mark.timeout(240)
def test_on_loopback_a_request_naming_another_host_is_refused(real_run):
    app = build_app(real_run.parent)
    with TestClient(app, base_url="http://rebound.example:8265") as c:
        assert c.get("/api/runs").status_code == 400  # DNS rebinding onto 127.0.0.1
    with TestClient(app, base_url="http://127.0.0.1:8265") as c:
        assert c.get("/api/runs").json() == [real_run.name]


def test_a_missing_runs_folder_is_one_line_with_the_fix(tmp_path):
    res = CliRunner().invoke(cli, ["dashboard", str(tmp_path / "nope"), "--no-open"])
    assert res.exit_code != 0
    assert "does not exist; pass a run directory" in str(res.exception or res.output)


# -- in a real headless Chromium ------------------------------------------------------------

POINTS = "return document.querySelector(`figure[data-metric='reward/mean']`)?.dataset.points"


@needs_browser
@pytest.mark.timeout(240)
def test_curves_update_live_and_the_viewer_shows_a_trials_tokens(served, tmp_path):
    path, url = served
    shots = artifacts(tmp_path)
    run = RunDir.open(path)
    with chromium(*BROWSER) as b:
        b.get(url)
        assert b.wait_for(POINTS, what="the reward chart") == "1"
        assert b.run("return document.getElementById('live').textContent") == "live"
        status = "return document.querySelector(`td[data-fact='status']`).textContent"
        assert b.run(status) == "completed"
        # the run goes on while the page is open: a step's metrics, a trial, an event
        run.append_metrics(2, {"reward/mean": 0.25, "actor/entropy": 1.5})
        b.wait_for(POINTS.replace("?.dataset.points", "?.dataset.points === '2'"), what="step 2")
        b.wait_for("return document.querySelector(`figure[data-metric='actor/entropy']`)")
        run.write_trial(
            TrialResult(
                trial_id="s00002-00-hello-world-0",
                task_id="hello-world",
                step=2,
                termination="agent_timeout",
                reward=Reward(value=0.0),
            )
        )
        run.append_event("resumed", from_step=1)  # as `slr run --resume` writes them
        run.append_event("started", resumed=True, step=1)
        b.wait_for(
            "return document.querySelector(`tr[data-trial='s00002-00-hello-world-0']`)"
            " && document.querySelector(`td[data-fact='status']`).textContent === 'running'"
            " && document.querySelector(`td.cell[data-task='hello-world'][data-step='2']`)"
            "?.className === 'cell failed'",
            what="the new trial in the list and the grid, and the run's status",
        )
        b.run("document.getElementById('curves').scrollIntoView()")
        b.screenshot(shots / "live-curves.png")

        b.run(f"document.querySelector(`tr[data-trial='{SERVED}']`).click()")
        b.wait_for(
            "return document.querySelectorAll('#viewer .segment .tok').length", what="tokens"
        )
        seen = b.run(
            "const t = [...document.querySelectorAll('#viewer .segment .tok')];"
            "return {pol: t.filter(e => e.dataset.mask === '1').length, all: t.length,"
            " coloured: t.filter(e => e.dataset.mask === '1' && e.style.background).length,"
            " text: t.map(e => e.textContent).join(''), versions:"
            " document.querySelectorAll('#viewer .version').length}"
        )
        seg = run.trial(SERVED).trajectory.segments[0]  # type: ignore[union-attr]
        assert seen["all"] == len(seg.token_ids) and seen["pol"] == seg.num_policy_tokens
        assert seen["coloured"] == seen["pol"] and seen["versions"] >= 1
        assert "List the files." in seen["text"]
        b.screenshot(shots / "trajectory.png")
    run.close()


@needs_browser
@pytest.mark.timeout(240)
def test_the_static_export_opens_from_disk_and_compares_two_runs(real_run, tmp_path):
    runs = tmp_path / "runs"
    for name in ("a-run", "b-run"):
        shutil.copytree(real_run, runs / name)
    RunDir.open(runs / "b-run").append_metrics(2, {"reward/mean": 0.5})
    out = tmp_path / "run.html"
    res = CliRunner().invoke(cli, ["dashboard", str(runs), "--export", str(out)])
    assert res.exit_code == 0, res.output
    assert "exported 2 run(s), 10 trial(s)" in res.output
    with chromium(*BROWSER) as b:
        b.get(out.as_uri())  # file://, no server anywhere
        b.wait_for("return document.getElementById('live').textContent === 'static export'")
        assert b.wait_for(POINTS) == "1"
        reasons = "return [...document.querySelectorAll('#no-signal li')].map(li => li.textContent)"
        # the page's rule, on rows it did not see: only a group with reward variance teaches
        rule = b.run(
            "const row = (id, group, reward, term = 'completed') => ({id, group, reward,"
            " termination: term, infra: term !== 'completed', trainable: term === 'completed',"
            " policy_tokens: 5});"
            "return Object.fromEntries(noSignal([row('a', 'g', 1), row('b', 'g', 0),"
            " row('c', 'h', 1), row('d', 'h', 1), row('e', 'h', null, 'sandbox_error')]));"
        )
        assert rule == {
            "c": "group without reward variance",
            "d": "group without reward variance",
            "e": "infrastructure failure (not in the loss)",
        }
        # the oracle agent calls no model; the served session has no reward
        assert sorted(b.run(reasons)) == ["no policy tokens: 4", "no reward: 1"]
        cells = b.run(
            "return [...document.querySelectorAll('#task-grid td.cell')]"
            ".map(td => [td.dataset.task, td.dataset.step, td.className])"
        )
        assert sorted(cells) == [  # the oracle solves both tasks; the served session has no reward
            ["hello-world", "1", "cell solved"],
            ["make-directory", "1", "cell solved"],
            ["serve", "-1", "cell unscored"],
        ]
        b.run("document.querySelector(`input[data-run='b-run']`).click()")
        assert b.wait_for(POINTS.replace("?.dataset.points", "?.dataset.points === '3'"))
        lines = "return document.querySelectorAll(`figure[data-metric='reward/mean'] path`).length"
        assert b.run(lines) == 2  # one line per run on the same chart
        b.run("document.getElementById('curves').scrollIntoView()")
        b.screenshot(artifacts(tmp_path) / "export-compare.png")
        b.run(f"document.querySelector(`tr[data-trial='{SERVED}']`).click()")
        assert b.wait_for("return document.querySelectorAll('#viewer .segment .tok.pol').length")
        b.screenshot(artifacts(tmp_path) / "export-trajectory.png")
