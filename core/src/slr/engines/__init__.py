"""What engines that talk to HTTP inference servers share (the vLLM and SGLang plugins).

Each plugin keeps its own protocol (request bodies, response parsing, weight-update
routes); the parts that do not depend on which server answers live here once:
``slr.engines.server`` (launching a server process with a log file, waiting for its
health, stopping its process group), ``slr.engines.remote`` (the engine object's
plumbing: one HTTP client per event loop, start / health / close, the replica set behind
the load balancer), ``slr.engines.options`` (the ``[engine]`` options both share) and
``slr.engines.preflight`` (the checks both run).
"""
