"""The agent toolkit: what agent adapters build on, and the agents that ship with the core.

- ``slr.agents.bundles``: runtime bundles, built once on the host into the cache folder
  and mounted read-only into every sandbox; ``slr.agents.bundle_recipes`` builds their
  contents (npm packages, a relocatable CPython with packages, host tools).
- ``slr.agents.headless``: running a scaffold in a sandbox (files in, one command under a
  timeout, its own logs out); ``run_scaffold`` is most adapters' whole ``run``.
- ``slr.agents.bundles_cli``: the ``slr bundles`` command group adapters add.
- ``slr.agents.model_free``: the ``oracle`` and ``nop`` agents (no model), registered by
  the core itself (``slr.agents.plugin``, one of ``slr.plugins.BUILTIN_PLUGINS``).

The toolkit knows no particular scaffold: what is a scaffold's own (its environment, a
daemon it starts and must be ended) comes from its adapter as parameters.
"""
