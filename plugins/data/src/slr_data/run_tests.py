"""The verifier of a generated task, run inside the task's sandbox (standard library only).

Copied into every generated task as ``tests/run_tests.py`` and called by ``tests/test.sh``;
``slr data mine`` / ``synth`` call it too, to learn which tests pass before and after a fix.

1. The test files the task grades with go back to the repository's own version (HEAD,
   the history the verifier phase gets back), and the hidden ``test.patch`` is applied, so
   an agent that edited or deleted tests gains nothing.
2. pytest runs the files of the graded tests; each test id gets its outcome from the
   ``-rA`` summary (a file that does not even import marks its tests as errors).
3. ``--reward FILE``: reward 1 when every FAIL_TO_PASS and PASS_TO_PASS test passed, else 0,
   with the outcome of each graded test beside it. ``--report FILE``: every outcome seen.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys

_SUMMARY = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS) (.+?)(?: - .*)?$")


def git(*args, check=True):
    return subprocess.run(
        ["git", "-c", "safe.directory=*", *args], capture_output=True, text=True, check=check
    )


def reset_tests(files, patch):
    for path in files:
        if git("cat-file", "-e", f"HEAD:{path}", check=False).returncode == 0:
            git("checkout", "HEAD", "--", path)
        elif os.path.lexists(path):
            os.remove(path)
    if patch and os.path.isfile(patch) and os.path.getsize(patch):
        done = git("apply", "--whitespace=nowarn", patch, check=False)
        if done.returncode != 0:
            print("the hidden test patch does not apply:", done.stderr, file=sys.stderr)
            return False
    return True


def run_pytest(python, targets, timeout):
    env = dict(os.environ, COLUMNS="10000", PYTHONDONTWRITEBYTECODE="1")
    cmd = [python, "-m", "pytest", "-rA", "--tb=no", "-q", "-p", "no:cacheprovider", *targets]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
        out = proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else ""
        out += "\n[run_tests] pytest timed out\n"
    outcomes = {}
    for line in out.splitlines():
        m = _SUMMARY.match(line.strip())
        if m:
            status = {"PASSED": "passed", "XFAIL": "passed"}.get(m.group(1), "failed")
            outcomes[m.group(2).strip()] = status
    return outcomes, out


def file_of(test_id):
    return test_id.split("::", 1)[0]


def main(argv=None):
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--config", required=True, help="config.json of the task")
    ap.add_argument("--reward", help="write reward.json here")
    ap.add_argument("--report", help="write every test outcome (JSON) here")
    ap.add_argument("--no-reset", action="store_true", help="leave the test files as they are")
    ap.add_argument("--files", nargs="*", help="test files to run (default: the graded ones)")
    args = ap.parse_args(argv)
    with open(args.config) as fh:
        config = json.load(fh)
    os.chdir(config.get("workdir") or ".")
    graded = list(config.get("fail_to_pass", [])) + list(config.get("pass_to_pass", []))
    ok = True
    if not args.no_reset:
        patch = os.path.join(os.path.dirname(os.path.abspath(args.config)), "test.patch")
        ok = reset_tests(config.get("test_files", []), patch)
    targets = args.files or sorted({file_of(t) for t in graded})
    outcomes, log = run_pytest(
        config.get("python", "python3"), targets, float(config.get("timeout_s", 1800))
    )
    print(log[-20000:])
    if args.report:
        with open(args.report, "w") as fh:
            json.dump({"outcomes": outcomes, "applied": ok}, fh, indent=1, sort_keys=True)
    if args.reward:
        graded_out = {t: outcomes.get(t, "missing") for t in graded}
        reward = 1.0 if ok and graded and all(s == "passed" for s in graded_out.values()) else 0.0
        os.makedirs(os.path.dirname(args.reward) or ".", exist_ok=True)
        with open(args.reward, "w") as fh:
            json.dump({"reward": reward}, fh)
        with open(os.path.join(os.path.dirname(args.reward) or ".", "tests.json"), "w") as fh:
            json.dump(graded_out, fh, indent=1, sort_keys=True)
        print(
            f"[run_tests] reward {reward}: {sum(s == 'passed' for s in graded_out.values())}"
            f"/{len(graded_out)} graded tests passed"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
