"""Task images for the pods: built by the docker backend's builder, then made visible to nodes.

``image_load`` picks how:

- ``containerd``: ``docker save`` piped into ``ctr images import`` on the node's containerd
  (what ``kind load`` does). Only for a single node that shares this machine (dev clusters);
  pods use ``imagePullPolicy: Never`` so a missing image fails at once, by name.
- ``registry``: tag ``<registry>/<repo>:<tag>`` and push; pods pull it (``IfNotPresent``).
- ``none``: nothing is built or moved; the task's ``environment.docker_image`` (or the
  builder's tag) must already be on the nodes or pullable.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from typing import Any

import structlog

from slr.contracts import SandboxError
from slr_backend_k8s.api import ImageUnavailable
from slr_backend_k8s.config import K8sBackendConfig

log = structlog.get_logger()

DEFAULT_CONTAINERD = "/run/containerd/containerd.sock"
IMPORT = ("images", "import", "-")


def normalize_ref(ref: str) -> str:
    """A short image name as containerd stores it (``busybox`` -> ``docker.io/library/busybox:latest``)."""
    name, _, digest = ref.partition("@")
    first, sep, _ = name.partition("/")
    if not sep:
        name = f"docker.io/library/{name}"
    elif "." not in first and ":" not in first and first != "localhost":
        name = f"docker.io/{name}"
    if not digest and ":" not in name.rsplit("/", 1)[-1]:
        name += ":latest"
    return f"{name}@{digest}" if digest else name


class ImageLoader:
    """Makes each task's image available to the cluster, once per image per process."""

    def __init__(self, config: K8sBackendConfig) -> None:
        self.config = config
        self._builder: Any = None
        self._done: set[str] = set()
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()

    @property
    def pull_policy(self) -> str:
        if self.config.image_pull_policy:
            return self.config.image_pull_policy
        return "Never" if self.config.image_load == "containerd" else "IfNotPresent"

    @property
    def containerd_address(self) -> str:
        return (
            self.config.containerd_address
            or os.environ.get("CONTAINERD_ADDRESS")
            or DEFAULT_CONTAINERD
        )

    @property
    def builder(self) -> Any:
        """The docker backend's image builder (imported only when a Dockerfile is built)."""
        if self._builder is None:
            try:
                from slr_backend_docker import DockerBackendConfig
                from slr_backend_docker.backend import DockerBackend
            except ImportError:
                raise SandboxError(
                    "the k8s backend builds task images with the docker backend's builder: "
                    "pip install slr-backend-docker (and run a docker daemon), or set "
                    "backend.image_load = 'none' with images already on the nodes"
                ) from None
            self._builder = DockerBackend(DockerBackendConfig(base_url=self.config.docker_url))
        return self._builder

    async def close(self) -> None:
        """Release the builder's daemon connection, if one was made."""
        if self._builder is not None:
            await self._builder.close()
            self._builder = None

    def local_tag(self, task: Any) -> str:
        """The tag the builder gives the task's image (or the task's own docker_image)."""
        env = task.environment
        if getattr(env, "docker_image", None):
            return env.docker_image
        return self.builder.image_tag(task)

    def pod_image(self, task: Any) -> str:
        """The image reference the pods of ``task`` run."""
        tag = self.local_tag(task)
        if self.config.image_load == "registry" and not getattr(
            task.environment, "docker_image", None
        ):
            from slr_backend_docker.tags import registry_ref

            return registry_ref(self.config.registry, tag)
        return tag

    async def prepare(self, task: Any, call) -> str:
        """Build (through the builder) and load/push the image; returns the pod's image ref.

        ``call`` runs a blocking function on the backend's thread pool.
        """
        ref = self.pod_image(task)
        if ref in self._done:
            return ref
        prebuilt = bool(getattr(task.environment, "docker_image", None))
        if self.config.image_load == "none":
            self._done.add(ref)
            return ref
        if self.config.image_load == "registry" and not self.config.registry:
            raise SandboxError(
                "backend.image_load = 'registry' needs backend.registry (e.g. "
                "'registry.example.com/slr') to push task images to"
            )
        if not prebuilt:
            await self.builder.prepare(task)
        await call(self._publish, task, ref, prebuilt)
        self._done.add(ref)
        return ref

    def _lock(self, ref: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(ref, threading.Lock())

    def _publish(self, task: Any, ref: str, prebuilt: bool) -> None:
        with self._lock(ref):
            if self.config.image_load == "containerd":
                if self.in_containerd(ref):
                    return
                self._import_into_containerd(task, ref)
            elif not prebuilt:
                self._push(ref)

    # -- containerd ----------------------------------------------------------------------

    def _ctr(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess:
        ctr = shutil.which(self.config.ctr) or self.config.ctr
        address = self.containerd_address
        if not os.path.exists(address):
            raise SandboxError(
                f"image_load = 'containerd' but there is no containerd socket at {address!r}: "
                f"set backend.containerd_address (or CONTAINERD_ADDRESS) to the node's "
                f"containerd socket; on a multi-node cluster use image_load = 'registry'"
            )
        try:
            return subprocess.run(
                [ctr, "-a", address, "-n", self.config.containerd_namespace, *args],
                capture_output=True,
                check=False,
                **kwargs,
            )
        except FileNotFoundError:
            raise SandboxError(
                f"the containerd CLI {self.config.ctr!r} is not installed; install containerd's "
                f"ctr (apt-get install containerd) or set backend.ctr"
            ) from None

    def in_containerd(self, ref: str) -> bool:
        full = normalize_ref(ref)
        res = self._ctr("images", "ls", "-q", f"name=={full}")
        if res.returncode != 0:
            raise SandboxError(
                f"ctr could not list images at {self.containerd_address}: "
                f"{res.stderr.decode(errors='replace').strip()}"
            )
        return full in res.stdout.decode().split()

    def _import_into_containerd(self, task: Any, ref: str) -> None:
        import docker.errors

        try:
            self.builder.client.images.get(ref)
        except docker.errors.NotFound as exc:
            raise ImageUnavailable(
                f"image {ref} for task {task.id} is neither in the cluster's containerd "
                f"({self.containerd_address}) nor on the docker daemon, so it cannot be loaded: "
                f"build it or `docker load` it first"
            ) from exc
        except docker.errors.DockerException as exc:
            raise SandboxError(f"docker daemon error looking up image {ref}: {exc}") from exc
        log.info("loading image into the node's containerd", image=ref, task_id=task.id)
        ctr = shutil.which(self.config.ctr) or self.config.ctr
        proc = subprocess.Popen(
            [ctr, "-a", self.containerd_address, "-n", self.config.containerd_namespace, *IMPORT],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        assert proc.stdin is not None
        try:
            for chunk in self.builder.client.api.get_image(ref):
                proc.stdin.write(chunk)
        except (BrokenPipeError, docker.errors.DockerException) as exc:
            proc.kill()
            raise SandboxError(f"could not export image {ref} from docker: {exc}") from exc
        finally:
            if proc.stdin and not proc.stdin.closed:
                try:
                    proc.stdin.close()
                except BrokenPipeError:
                    pass
        output = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
        if proc.wait() != 0 or not self.in_containerd(ref):
            raise SandboxError(
                f"ctr could not import image {ref} into {self.containerd_address}: "
                f"{output.strip()[-500:]}"
            )

    # -- registry ------------------------------------------------------------------------

    def _push(self, ref: str) -> None:
        # the docker backend's push: the same naming as `slr images build --push`
        from slr_backend_docker import registry

        local = ref.removeprefix(self.config.registry.strip().rstrip("/") + "/")
        registry.push(self.builder.client.api, local, self.config.registry)
