"""Run a Harbor task's tests in the sandbox after the agent phase; read the reward."""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path
from typing import Any

from slr.contracts import Reward, Sandbox, VerifierError, VerifierTimeout
from slr.tasks import TESTS_DIR, VERIFIER_LOGS_DIR
from slr_verifier_harbor import HarborVerifierConfig

TAIL = 4000


class HarborVerifier:
    """``Verifier``: ``tests/test.sh`` decides; ``reward.txt`` or ``reward.json`` says how."""

    def __init__(self, config: HarborVerifierConfig | None = None) -> None:
        self.config = config or HarborVerifierConfig()

    async def verify(self, sandbox: Sandbox, task: Any) -> Reward:
        # Wipe first: whatever the agent planted in /tests or /logs/verifier is gone.
        prep = await sandbox.exec(
            f"rm -rf {TESTS_DIR} {VERIFIER_LOGS_DIR} && mkdir -p {VERIFIER_LOGS_DIR} "
            f"&& chmod 777 {VERIFIER_LOGS_DIR}",
            user="root",
            cwd="/",
        )
        if not prep.ok:
            raise VerifierError(f"could not prepare {VERIFIER_LOGS_DIR}: {prep.stderr.strip()}")
        await sandbox.upload(task.tests_dir, TESTS_DIR)
        await sandbox.exec(["chmod", "-R", "a+rX", TESTS_DIR], user="root", cwd="/")

        timeout = task.verifier.timeout_s * self.config.timeout_multiplier
        res = await sandbox.exec(
            ["bash", f"{TESTS_DIR}/test.sh"],
            timeout_s=timeout,
            user=task.verifier.user,
            env=task.verifier.env,
        )
        details: dict[str, Any] = {
            "exit_code": res.exit_code,
            "duration_s": round(res.duration_s, 3),
            "stdout": res.stdout[-TAIL:],
            "stderr": res.stderr[-TAIL:],
        }
        if res.timed_out:
            raise VerifierTimeout(
                f"tests/test.sh of task {task.id} ran past verifier.timeout_sec = {timeout:g}s"
            )
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "verifier"
            try:
                await sandbox.download(VERIFIER_LOGS_DIR, out)
            except FileNotFoundError:
                pass
            value, rewards = _read_reward(out, task.id, res)
        details["rewards"] = rewards
        return Reward(value=value, details=details)


def _read_reward(folder: Path, task_id: str, res) -> tuple[float, dict[str, float]]:
    txt, js = folder / "reward.txt", folder / "reward.json"
    if txt.is_file():
        raw = txt.read_text().strip()
        try:
            value = float(raw)
        except ValueError:
            raise VerifierError(
                f"task {task_id}: reward.txt holds {raw[:100]!r}, not a number"
            ) from None
        return _finite(value, task_id, "reward.txt"), {"reward": value}
    if js.is_file():
        try:
            data = json.loads(js.read_text())
        except json.JSONDecodeError as exc:
            raise VerifierError(f"task {task_id}: reward.json is not JSON: {exc}") from None
        if isinstance(data, int | float) and not isinstance(data, bool):
            return _finite(float(data), task_id, "reward.json"), {"reward": float(data)}
        if not isinstance(data, dict):
            raise VerifierError(f"task {task_id}: reward.json holds {data!r}, not an object")
        numbers = {
            k: float(v)
            for k, v in data.items()
            if isinstance(v, int | float) and not isinstance(v, bool)
        }
        if "reward" in numbers:
            return _finite(numbers["reward"], task_id, "reward.json"), numbers
        if len(numbers) == 1:
            (value,) = numbers.values()
            return _finite(value, task_id, "reward.json"), numbers
        raise VerifierError(
            f"task {task_id}: reward.json {data!r} has no 'reward' key and not exactly one "
            f"number; name the scalar reward 'reward'"
        )
    raise VerifierError(
        f"task {task_id}: tests/test.sh exited {res.exit_code} without writing "
        f"{VERIFIER_LOGS_DIR}/reward.txt or reward.json. stderr: {res.stderr.strip()[-800:]}"
    )


def _finite(value: float, task_id: str, name: str) -> float:
    if not math.isfinite(value):
        raise VerifierError(f"task {task_id}: {name} holds {value}, not a finite number")
    return value
