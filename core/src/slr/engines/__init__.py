"""Engines, seen from the core: what sits in front of them and what they share.

``slr.engines.balancer`` (one ``Engine`` in front of N replicas, sticky per session, with
failover) and ``slr.engines.lora`` (the LoRA adapter folder every engine and optimizer
reads and writes). What the engines that talk to HTTP inference servers share (the vLLM
and SGLang plugins), each plugin keeping its own protocol: ``slr.engines.server``
(launching a server process with a log file, waiting for its health, stopping its process
group), ``slr.engines.remote`` (the engine object's plumbing: one HTTP client per event
loop, start / health / close, the replica set behind the load balancer) and
``slr.engines.options`` (the ``[engine]`` options both share); the checks both run are
``slr.preflight.engines``. The engine contract itself is ``slr.contracts.engine``.
"""
