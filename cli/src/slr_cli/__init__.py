"""The ``slr`` command line.

Help is rendered by rich-click when it is installed (litestar's CLI brings it; slr does not
depend on it): the same commands, options and text, laid out in panels. It has to patch
click before any command is defined, hence here, at the package's import. Without it, help
is click's plain text.
"""

try:
    from rich_click.patch import patch
    from rich_click.rich_help_configuration import RichHelpConfiguration
except ImportError:  # pragma: no cover - plain click help
    pass
else:
    # one line of help text per line of the docstring: the examples stay one per line
    patch(RichHelpConfiguration(text_paragraph_linebreaks="\n"))
