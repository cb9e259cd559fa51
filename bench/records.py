"""Writing and reading one trial record: the old path (cattrs + json) beside msgspec.

    .venv/bin/python bench/records.py [--tokens 32768] [--segments 4] [--repeat 15] [--json]

A trial of ``--tokens`` tokens split over ``--segments`` segments (token ids, loss mask,
log-probabilities, weight versions; no routing), as the proxy records one. Each repeat
encodes + writes it to a file in a temporary run directory and reads it back, old path then
new path alternating so load drift hits both alike. It reports the median milliseconds of
encode (to bytes), decode (from bytes, to the attrs record), and the whole ``write_trial`` +
``trial`` round trip through ``RunDir`` (new path) or its previous code (old path), and the
old/new ratio of each.
"""

from __future__ import annotations

import json
import random
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path

import attrs
import harness

from slr.contracts import Reward, Segment, Trajectory, TrialResult, from_dict, to_dict
from slr.contracts.serialize import decode, encode
from slr.run.directory import RunDir, atomic_write


def make_trial(tokens: int, segments: int, seed: int = 0) -> TrialResult:
    rng = random.Random(seed)
    per = tokens // segments
    segs = []
    for _ in range(segments):
        mask = [0] * (per // 4) + [1] * (per - per // 4)
        segs.append(
            Segment(
                token_ids=[rng.randrange(150_000) for _ in range(per)],
                loss_mask=mask,
                logprobs=[-rng.random() * 3 if m else 0.0 for m in mask],
                weights_versions=[7] * per,
            )
        )
    return TrialResult(
        trial_id="bench",
        task_id="task",
        termination="completed",
        reward=Reward(value=1.0, details={"tests": 12}),
        timings={"total_s": 100.0},
        trajectory=Trajectory(session_id="s", segments=segs, num_calls=segments),
        logs={"agent": "x" * 4000},
    )


def old_encode(t: TrialResult) -> bytes:
    return json.dumps(to_dict(t), sort_keys=True).encode()


def old_decode(data: bytes) -> TrialResult:
    return from_dict(json.loads(data), TrialResult)


def main() -> None:
    p = harness.parser(__doc__, whole_doc=True)
    p.add_argument("--tokens", type=int, default=32768)
    p.add_argument("--segments", type=int, default=4)
    p.add_argument("--repeat", type=int, default=15)
    a = p.parse_args()
    out = harness.Output(a)

    trial = make_trial(a.tokens, a.segments)
    times: dict[str, dict[str, list[float]]] = {
        path: {"encode": [], "decode": [], "round_trip": []} for path in ("old", "new")
    }
    with tempfile.TemporaryDirectory() as tmp:
        run = RunDir.create(Path(tmp), "bench", "")
        for i in range(a.repeat):
            # old path: what RunDir did before (cattrs dict, json with sorted keys)
            data, s = harness.timed(partial(old_encode, trial))
            times["old"]["encode"].append(s * 1000)
            back, s = harness.timed(partial(old_decode, data))
            times["old"]["decode"].append(s * 1000)
            assert back == trial
            path = run.path / "trials" / f"old-{i}.json"
            t0 = time.perf_counter()
            atomic_write(path, old_encode(trial))
            assert old_decode(path.read_bytes()) == trial
            times["old"]["round_trip"].append((time.perf_counter() - t0) * 1000)

            data, s = harness.timed(partial(encode, trial))
            times["new"]["encode"].append(s * 1000)
            back, s = harness.timed(partial(decode, data, TrialResult))
            times["new"]["decode"].append(s * 1000)
            assert back == trial
            t = attrs.evolve(trial, trial_id=f"new-{i}")
            t0 = time.perf_counter()
            run.write_trial(t)
            assert run.trial(t.trial_id) == t
            times["new"]["round_trip"].append((time.perf_counter() - t0) * 1000)
        size_old = len(old_encode(trial))
        size_new = len(encode(trial))

    med = {
        path: {k: statistics.median(v) for k, v in parts.items()} for path, parts in times.items()
    }
    rows: list[list[object]] = [
        [k, med["old"][k], med["new"][k], med["old"][k] / med["new"][k]]
        for k in ("encode", "decode", "round_trip")
    ]
    rows.append(["bytes", str(size_old), str(size_new), None])
    out.table(
        [("ms", "<"), ("cattrs+json", ">.2f"), ("msgspec", ">.2f"), ("old/new", harness.ratio)],
        rows,
        title=f"one trial record: {a.tokens} tokens, {a.segments} segments; median of {a.repeat}",
    )
    out.result(
        {
            "tokens": a.tokens,
            "segments": a.segments,
            "repeat": a.repeat,
            "median_ms": med,
            "ratio_old_over_new": {k: med["old"][k] / med["new"][k] for k in med["old"]},
            "bytes": {"old": size_old, "new": size_new},
        }
    )


if __name__ == "__main__":
    main()
