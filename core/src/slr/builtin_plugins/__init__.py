"""Plugins that ship inside slr-core and that the plugin manager registers itself.

They are ordinary plugin modules (hook implementations), listed by ``slr plugins`` with the
distribution ``slr-core``; no separate distribution or entry point is needed, so a bare
``pip install slr-core`` (and the core's own tests) has them.
"""
