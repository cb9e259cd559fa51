"""``slr images prune``: remove the task images slr built that no task set still uses.

Only images labelled ``slr.image=task`` (``tags.LABEL_IMAGE``, set on every task image slr
builds) *and* tagged with exactly the name slr gives that task's image (``tags.built_tag``
of the labels' task id and content hash, under the prefix) are ever considered. Labels are
inherited, so an image of the user's own built FROM a task image carries the label too;
its name tells them apart. A user's own images, the base image and images a task names as
its prebuilt ``docker_image`` are never touched. A task image is
"used" by a task set when its task id and content hash (its labels) are one of the set's
tasks: the tag and any registry alias it was pushed under go with it.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from attrs import frozen

from slr.sandboxing.labels import TASK
from slr_backend_docker.tags import LABEL_HASH, LABEL_IMAGE, TASK_IMAGE, built_tag


@frozen(kw_only=True)
class PruneItem:
    """A task image that would go (or went), and why it is not kept."""

    image_id: str
    tags: tuple[str, ...]
    task_id: str
    content_hash: str
    created: datetime
    size: int
    """The image's size as the daemon reports it: shared layers (the base) included."""
    reason: str
    outcome: str = "would remove"
    """``would remove`` (dry run), ``removed``, or why it could not be (``in use by ...``)."""

    def as_json(self) -> dict[str, Any]:
        return {
            "image_id": self.image_id,
            "tags": list(self.tags),
            "task_id": self.task_id,
            "content_hash": self.content_hash,
            "created": self.created.isoformat(),
            "size": self.size,
            "reason": self.reason,
            "outcome": self.outcome,
        }


def created_at(image: Any) -> datetime:
    """When the daemon made the image (its ``Created``: RFC 3339, nanoseconds)."""
    raw = str(image.attrs.get("Created", ""))
    try:
        return datetime.strptime(raw[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC)
    except ValueError:
        return datetime.fromtimestamp(0, UTC)


def plan(
    client: Any,
    *,
    keep: Iterable[tuple[str, str]] | None,
    older_than_days: float | None,
    prefix: str = "slr-task",
    now: datetime | None = None,
) -> tuple[list[PruneItem], int]:
    """The task images to remove, and how many slr task images are kept.

    ``keep``: (task id, content hash) of every task in the given task sets; ``None`` when no
    set was given (then age alone decides). ``older_than_days``: only images made before
    that many days ago go. At least one of the two must be given. ``prefix``: the backend's
    ``image_prefix``; machines or projects that share a daemon under different prefixes
    leave each other's images alone.
    """
    if keep is None and older_than_days is None:
        raise ValueError("give the task sets to keep, or an age (older_than_days), or both")
    keep_set = set(keep) if keep is not None else None
    now = now or datetime.now(UTC)
    remove: list[PruneItem] = []
    kept = 0
    for image in client.images.list(filters={"label": f"{LABEL_IMAGE}={TASK_IMAGE}"}):
        labels = image.labels or {}
        key = (labels.get(TASK, ""), labels.get(LABEL_HASH, ""))
        if labels.get(LABEL_IMAGE) != TASK_IMAGE or not all(key):
            continue
        if not _named_as_built(image.tags, built_tag(prefix, *key)):
            continue
        created = created_at(image)
        age_days = (now - created).total_seconds() / 86400
        reasons = []
        if keep_set is not None:
            if key in keep_set:
                kept += 1
                continue
            reasons.append("not in the task sets")
        if older_than_days is not None:
            if age_days <= older_than_days:
                kept += 1
                continue
            reasons.append(f"{age_days:.1f} days old")
        remove.append(
            PruneItem(
                image_id=image.id,
                tags=tuple(image.tags),
                task_id=key[0],
                content_hash=key[1],
                created=created,
                size=int(image.attrs.get("Size") or 0),
                reason=", ".join(reasons),
            )
        )
    return sorted(remove, key=lambda i: (i.task_id, i.created)), kept


def _named_as_built(tags: list[str], name: str) -> bool:
    # the local tag, or its alias in a registry (``registry_ref``: ``<registry>/<name>``)
    return any(t == name or t.endswith(f"/{name}") for t in tags)


def remove(client: Any, items: list[PruneItem]) -> list[PruneItem]:
    """Remove each planned image; one a container still uses (even a stopped one) stays."""
    import attrs
    import docker.errors

    done = []
    for item in items:
        users = client.containers.list(all=True, filters={"ancestor": item.image_id})
        if users:
            names = ", ".join(c.name for c in users[:3])
            done.append(attrs.evolve(item, outcome=f"kept: in use by container {names}"))
            continue
        try:
            # by tag, never forced: the last tag's removal deletes the image, and the daemon
            # refuses one that another image is built on
            for tag in item.tags or (item.image_id,):
                client.images.remove(tag, noprune=False)
        except docker.errors.NotFound:
            pass  # removed meanwhile (another prune): gone either way
        except docker.errors.APIError as exc:
            done.append(attrs.evolve(item, outcome=f"kept: {exc.explanation or exc}"))
            continue
        done.append(attrs.evolve(item, outcome="removed"))
    return done
