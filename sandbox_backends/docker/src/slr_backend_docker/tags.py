"""Image names of task sandboxes: one owner for the tag a task's image is built and found under.

Apart from the backend so the preflight (``slr_backend_docker.preflight``) reads them too
without importing the backend.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

# One path component of an image reference, as the daemon parses it: lowercase letters and
# digits, joined by a single "." or "_", a double "__", or a run of "-". Nothing else ("-_",
# "..", a leading or trailing separator) is accepted.
_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_SLUG_MAX = 100  # a repository name may be 255 characters; the prefix and the hash need room


def image_tag(prefix: str, task: Any) -> str:
    """The image a task's sandboxes run: its prebuilt ``docker_image``, else the image built
    from its Dockerfile, tagged with the environment's content hash."""
    env = task.environment
    if env.docker_image:
        return env.docker_image
    return f"{_repo_name(prefix, task.id)}:{env.content_hash[:16]}"


def _repo_name(prefix: str, task_id: str) -> str:
    """The image repository for a task: ``<prefix>-<task id>``, valid for any task id.

    An id that is already a valid component (``django__django-11099``) is kept as it is; any
    other is reduced to letters, digits and ``-`` and gets a short hash of the original, so
    two ids that differ only in the characters dropped still name different images.
    """
    slug = task_id.lower()
    if _COMPONENT.fullmatch(slug) and len(slug) <= _SLUG_MAX:
        return f"{prefix}-{slug}"
    digest = hashlib.sha256(task_id.encode()).hexdigest()[:10]
    slug = re.sub(r"[^a-z0-9]+", "-", slug)[:_SLUG_MAX].strip("-")
    return f"{prefix}-{slug}-{digest}" if slug else f"{prefix}-{digest}"
