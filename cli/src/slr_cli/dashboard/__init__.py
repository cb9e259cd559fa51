"""``slr dashboard``: a live web view of run directories, and its static export.

Every panel reads the run directory through ``slr.run.directory.RunDir`` (as ``slr status`` and
resume do): ``data`` holds the views, ``app`` the litestar server and its event stream,
``page`` the one HTML page (plain JS and SVG in ``static/``, no build step), ``export`` the
self-contained file, ``command`` the click command.
"""
