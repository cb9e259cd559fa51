"""Image names and labels of task sandboxes: one owner for the tag a task's image is built and
found under, and for the labels that mark an image as slr's.

Apart from the backend so the preflight (``slr_backend_docker.preflight``), ``slr images``
and the k8s backend read them too without importing the backend.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from slr.sandboxing.labels import TASK

# One path component of an image reference, as the daemon parses it: lowercase letters and
# digits, joined by a single "." or "_", a double "__", or a run of "-". Nothing else ("-_",
# "..", a leading or trailing separator) is accepted.
_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_SLUG_MAX = 100  # a repository name may be 255 characters; the prefix and the hash need room

#: On every task image slr builds: the environment content hash it was built from.
LABEL_HASH = "slr.content_hash"
#: On every image slr makes: what it is (``task`` for a task image). ``slr images prune``
#: removes only images carrying ``slr.image=task``, so nothing it did not build is touched.
LABEL_IMAGE = "slr.image"
TASK_IMAGE = "task"
#: On the base image (``slr images base``). Labels are inherited: every image built FROM the
#: base carries it too, and an image built FROM a task image carries ``LABEL_IMAGE``.
LABEL_BASE = "slr.base"


def task_image_labels(task: Any) -> dict[str, str]:
    """The labels of a task's built image (``TASK`` as on its sandboxes)."""
    return {
        TASK: task.id,
        LABEL_HASH: task.environment.content_hash,
        LABEL_IMAGE: TASK_IMAGE,
    }


def registry_ref(registry: str, tag: str) -> str:
    """``tag`` under ``registry`` (``host:port/prefix``): what is pushed there and pulled."""
    return f"{registry.strip().rstrip('/')}/{tag}"


def image_tag(prefix: str, task: Any) -> str:
    """The image a task's sandboxes run: its prebuilt ``docker_image``, else the image built
    from its Dockerfile, tagged with the environment's content hash."""
    env = task.environment
    if env.docker_image:
        return env.docker_image
    return built_tag(prefix, task.id, env.content_hash)


def built_tag(prefix: str, task_id: str, content_hash: str) -> str:
    """The tag slr builds a task's Dockerfile under: its name and content hash."""
    return f"{_repo_name(prefix, task_id)}:{content_hash[:16]}"


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
