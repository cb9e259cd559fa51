"""``slr images base``: a local Debian base image for machines with no registry access.

Task Dockerfiles start ``FROM slr-base:bookworm``. The image is made with debootstrap on the
host and loaded with ``docker import``; it is built only when the tag is missing (``--force``
rebuilds). Needs root, ``debootstrap`` and a reachable Debian mirror (plain http is enough).
"""

from __future__ import annotations

import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

import click

from slr_backend_docker.tags import LABEL_BASE

BASE_TAG = "slr-base:bookworm"
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
PACKAGES = (
    "python3",
    "python3-venv",
    "git",
    "ca-certificates",
    "bash",
    "procps",
    "coreutils",
    "findutils",
    "grep",
    "sed",
    "tar",
    "gzip",
    "curl",
    "patch",
)


def image_exists(client, tag: str) -> bool:
    import docker.errors

    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        return False
    return True


def build_base_image(
    client,
    *,
    tag: str = BASE_TAG,
    mirror: str = MIRROR,
    force: bool = False,
    echo=click.echo,
) -> bool:
    """Build ``tag`` with debootstrap + docker import. Returns False when it already existed."""
    if not force and image_exists(client, tag):
        return False
    if shutil.which("debootstrap") is None:
        raise click.ClickException(
            "debootstrap is not installed; install it (apt-get install debootstrap) or load a "
            f"Debian image tagged {tag} some other way"
        )
    with tempfile.TemporaryDirectory(prefix="slr-base-") as tmp:
        root = Path(tmp) / "rootfs"
        cmd = [
            "debootstrap",
            "--variant=minbase",
            f"--include={','.join(PACKAGES)}",
            SUITE,
            str(root),
            mirror,
        ]
        echo(f"==> {' '.join(cmd)}")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        tail: list[str] = []
        assert proc.stdout is not None
        for line in proc.stdout:
            tail = [*tail[-40:], line.rstrip()]
            if line.startswith("I: Retrieving") or line.startswith("I: Installing core"):
                echo(f"    {line.rstrip()}")
        if proc.wait() != 0:
            raise click.ClickException(
                f"debootstrap failed (exit {proc.returncode}); last lines:\n" + "\n".join(tail)
            )
        # apt caches and lists are not needed in a sandbox image and add ~100 MB.
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for p in (root / junk).glob("*"):
                if p.is_file():
                    p.unlink()
        echo(f"==> docker import -> {tag}")
        archive = Path(tmp) / "rootfs.tar"
        with tarfile.open(archive, "w") as tar:
            tar.add(root, arcname=".")
        with archive.open("rb") as fh:
            # A generator, so requests sends real chunked encoding (a file object would be
            # sent with a length but a chunked header, which the daemon rejects).
            client.api.import_image_from_stream(
                iter(lambda: fh.read(1 << 20), b""),
                repository=tag.partition(":")[0],
                tag=tag.partition(":")[2] or "latest",
                changes=[
                    'CMD ["/bin/bash"]',
                    "ENV LANG=C.UTF-8",
                    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                    f"LABEL {LABEL_BASE}=1",
                ],
            )
    if not image_exists(client, tag):
        raise click.ClickException(f"docker import did not produce {tag}")
    return True
