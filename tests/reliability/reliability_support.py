"""Shared by the reliability tests: an engine whose steps take a real model's time."""

from __future__ import annotations

import time

#: the floor on one forward pass: a 0.5B-parameter model's decode step on a laptop CPU
STEP_S = 0.04
#: far more tokens than a test waits for: a generation nobody stops runs ~LONG * STEP_S
LONG = 250


def slow_steps(model, seconds: float) -> None:
    """Make every forward pass of ``model`` last at least ``seconds``."""

    def hook(module, args, kwargs, output):
        elapsed = time.perf_counter() - module._slr_started
        if elapsed < seconds:
            time.sleep(seconds - elapsed)
        return output

    def start(module, args, kwargs):
        module._slr_started = time.perf_counter()

    model.register_forward_pre_hook(start, with_kwargs=True)
    model.register_forward_hook(hook, with_kwargs=True)
