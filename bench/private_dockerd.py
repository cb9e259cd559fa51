"""A private docker daemon for the soak's ``docker-restart`` fault, and nothing else's.

The soak restarts a docker daemon under a running ``slr run``; on a shared machine that
daemon must be one the bench started itself, never the machine's: its own socket, data
root, exec root (with its own managed containerd), pid file, and its own bridge interface
(``--bridge``, created here with an address range of its own, no iptables rules), so that
nothing it does touches the shared daemon's containers, images or network.

``PrivateDockerd`` is a context manager: entering starts the daemon and waits for it to
answer; ``copy_images`` loads images from the shared daemon (``docker save | docker -H
private load``: there is no registry to pull from); ``restart`` is SIGTERM, wait for the
exit, start again on the same data root; leaving (also on Ctrl-C or an error) stops the
daemon, removes the bridge and deletes its folders.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

#: How long the daemon has to come up (a cold start makes its data root) or to stop.
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 60.0
#: Seconds the daemon gives its containers on shutdown before it kills them.
SHUTDOWN_TIMEOUT_S = 5


class PrivateDockerd:
    def __init__(self, *, bridge: str = "slrsoak0", cidr: str = "10.213.7.1/24") -> None:
        # short: the sockets under it must fit a unix socket path (108 bytes)
        self.root = Path(tempfile.mkdtemp(prefix="slr-dkd-", dir="/tmp"))
        self.sock = self.root / "docker.sock"
        self.url = f"unix://{self.sock}"
        self.bridge, self.cidr = bridge, cidr
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = self.root / "dockerd.log"
        self.restarts = 0

    # -- the daemon -------------------------------------------------------------------------

    def argv(self) -> list[str]:
        (self.root / "daemon.json").write_text("{}")  # never the machine's /etc/docker one
        return [
            "dockerd",
            f"--host={self.url}",
            f"--data-root={self.root / 'data'}",
            f"--exec-root={self.root / 'exec'}",
            f"--pidfile={self.root / 'dockerd.pid'}",
            f"--config-file={self.root / 'daemon.json'}",
            f"--bridge={self.bridge}",
            "--iptables=false",
            "--ip6tables=false",
            "--ip-masq=false",
            f"--shutdown-timeout={SHUTDOWN_TIMEOUT_S}",
        ]

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv(), stdout=out, stderr=out, start_new_session=True
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.answers():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = self.log.read_text(errors="replace").splitlines()[-10:]
                raise RuntimeError(
                    f"the private dockerd ({self.url}) did not start: " + " | ".join(tail)
                )
            time.sleep(0.2)

    def answers(self) -> bool:
        res = subprocess.run(
            ["docker", "-H", self.url, "version", "--format", "{{.Server.Version}}"],
            capture_output=True,
            check=False,
        )
        return res.returncode == 0

    def stop(self) -> None:
        """SIGTERM and wait for the exit (SIGKILL past ``STOP_TIMEOUT_S``)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def restart(self) -> None:
        self.stop()
        self.start()
        self.restarts += 1

    # -- images -----------------------------------------------------------------------------

    def copy_images(self, tags: list[str]) -> None:
        """Load ``tags`` from the shared daemon (read only there: ``docker save``)."""
        save = subprocess.Popen(["docker", "save", *tags], stdout=subprocess.PIPE)
        assert save.stdout is not None
        load = subprocess.run(
            ["docker", "-H", self.url, "load"], stdin=save.stdout, capture_output=True
        )
        save.stdout.close()
        if save.wait() != 0 or load.returncode != 0:
            raise RuntimeError(
                f"could not copy {tags} into the private dockerd: {load.stderr.decode().strip()}"
                f"; build them on the shared daemon first (`slr images base`)"
            )

    # -- set-up and clean-up ----------------------------------------------------------------

    def _ip(self, *args: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(["ip", *args], capture_output=True, check=False)

    def __enter__(self) -> PrivateDockerd:
        try:
            if self._ip("link", "show", self.bridge).returncode == 0:
                raise RuntimeError(
                    f"a network interface {self.bridge} exists already (another soak, or one "
                    f"left behind): remove it with `ip link del {self.bridge}`"
                )
            for cmd in (
                ("link", "add", self.bridge, "type", "bridge"),
                ("addr", "add", self.cidr, "dev", self.bridge),
                ("link", "set", self.bridge, "up"),
            ):
                res = self._ip(*cmd)
                if res.returncode != 0:
                    raise RuntimeError(f"ip {' '.join(cmd)}: {res.stderr.decode().strip()}")
            self._made_bridge = True
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.stop()
        if getattr(self, "_made_bridge", False):
            self._ip("link", "del", self.bridge)
            self._made_bridge = False
        # a daemon killed hard can leave its overlay mounts under the data root
        mounts = Path("/proc/self/mounts").read_text().splitlines()
        for line in reversed(mounts):
            target = line.split()[1]
            if target.startswith(str(self.root) + "/"):
                subprocess.run(["umount", "-l", target], check=False)
        shutil.rmtree(self.root, ignore_errors=True)
