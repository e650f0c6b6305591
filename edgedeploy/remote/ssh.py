"""One SSH connection to a device (paramiko): strict host keys, key authentication, timeouts, clean errors.

Host keys come only from the given known_hosts file and are never added (``RejectPolicy``): an unknown or
changed key stops the run (:class:`DeviceTrustError`, exit 11), as does a refused key. No password is ever
sent. Connection failures (refused, no route, no answer within the connect timeout, a dropped link) are
:class:`DeviceUnreachableError` (exit 12); a command past its deadline is stopped and is
:class:`DeviceTimeoutError` (exit 13). paramiko is imported lazily (``pip install 'edgedeploy[device]'``).
"""

from __future__ import annotations

import posixpath
import shlex
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgedeploy.errors import DeviceTimeoutError, DeviceTrustError, DeviceUnreachableError, InputError
from edgedeploy.remote.hosts import DeviceHost

KNOWN_HOSTS_HINT = (
    "check the device's host key fingerprint out of band (on the device: ssh-keygen -lf "
    "/etc/ssh/ssh_host_ed25519_key.pub), then add it to known_hosts (ssh-keyscan -p PORT HOST >> known_hosts)"
)


def _paramiko() -> Any:
    try:
        import paramiko
    except ImportError as exc:
        raise InputError(f"deploy device run needs paramiko ({exc})", hint="pip install 'edgedeploy[device]'") from None
    return paramiko


class DeviceConnection:
    """An open SSH connection to ``host``; use as a context manager.

    Raises (constructor):
        InputError: no paramiko, or the known_hosts / identity file is unreadable.
        DeviceTrustError: host key not in known_hosts or different, or key authentication refused.
        DeviceUnreachableError: the host cannot be reached or does not speak SSH in time.
    """

    def __init__(
        self,
        host: DeviceHost,
        *,
        known_hosts: Path,
        identity: Path | None = None,
        connect_timeout: float = 15.0,
    ) -> None:
        paramiko = _paramiko()
        self.host = host
        self.connect_timeout = connect_timeout
        if not known_hosts.is_file():
            raise InputError(f"known_hosts file not found: {known_hosts}", hint="pass --known-hosts PATH")
        if identity is not None and not identity.is_file():
            raise InputError(f"SSH identity file not found: {identity}", hint="pass --identity PATH to a private key")
        client = paramiko.SSHClient()
        try:
            client.load_host_keys(str(known_hosts))
        except (OSError, paramiko.SSHException) as exc:
            raise InputError(f"known_hosts unreadable: {known_hosts} ({exc})") from None
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        where = f"{host.label}"
        try:
            client.connect(
                host.hostname,
                port=host.port,
                username=host.user,
                key_filename=str(identity) if identity is not None else None,
                look_for_keys=identity is None,
                allow_agent=identity is None,
                timeout=connect_timeout,
                banner_timeout=connect_timeout,
                auth_timeout=connect_timeout,
                channel_timeout=connect_timeout,
            )
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise DeviceTrustError(
                f"{where}: host key {exc.key.get_name()} {exc.key.fingerprint} differs from the one known_hosts "
                f"({known_hosts}) holds for it; refusing to connect (a different machine, or a reinstalled one)",
                hint=KNOWN_HOSTS_HINT,
            ) from None
        except paramiko.AuthenticationException as exc:
            client.close()
            raise DeviceTrustError(
                f"{where}: key authentication refused for user {host.user} ({exc})",
                hint="install your public key in the device's ~/.ssh/authorized_keys or pass --identity KEY",
            ) from None
        except TimeoutError:
            client.close()
            raise DeviceUnreachableError(
                f"{where}: no answer within {connect_timeout:g}s", hint="check that the device is on and reachable"
            ) from None
        except paramiko.SSHException as exc:
            client.close()
            text = " ".join(str(exc).split())
            if "known_hosts" in text:
                raise DeviceTrustError(
                    f"{where}: host key not in {known_hosts}; refusing to connect to an unknown host",
                    hint=KNOWN_HOSTS_HINT,
                ) from None
            raise DeviceUnreachableError(f"{where}: SSH failed: {text[:300]}") from None
        except OSError as exc:  # refused, no route, name not resolved (NoValidConnectionsError is an OSError)
            client.close()
            raise DeviceUnreachableError(
                f"{where}: cannot connect ({' '.join(str(exc).split())[:300]})",
                hint="check the host name and port, and that sshd runs on the device",
            ) from None
        transport = client.get_transport()
        if transport is not None:
            transport.set_keepalive(30)  # a device that vanishes mid-build drops the link instead of hanging
        self.client = client
        self.sftp = client.open_sftp()
        self.sftp.get_channel().settimeout(max(60.0, connect_timeout))  # per read / write, not per file

    def __enter__(self) -> DeviceConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        try:
            self.sftp.close()
        finally:
            self.client.close()

    # ---- files ----------------------------------------------------------------------------------

    def makedirs(self, remote: str) -> None:
        """``mkdir -p`` over SFTP (relative paths are under the login's home)."""
        path = ""
        for part in remote.split("/"):
            path = posixpath.join(path, part) if path else (part or "/")
            if part in ("", "."):
                continue
            try:
                self.sftp.stat(path)
            except OSError:
                self.sftp.mkdir(path, 0o700)

    def upload(self, local: Path, remote: str) -> None:
        self._io(lambda: self.sftp.put(str(local), remote), f"copying {local.name} to the device")

    def download(self, remote: str, local: Path) -> None:
        self._io(lambda: self.sftp.get(remote, str(local)), f"fetching {posixpath.basename(remote)}")

    def exists(self, remote: str) -> bool:
        try:
            self.sftp.stat(remote)
        except OSError:
            return False
        return True

    def _io(self, call: Callable[[], object], what: str) -> None:
        try:
            call()
        except (OSError, EOFError) as exc:
            raise DeviceUnreachableError(f"{self.host.label}: {what} failed ({exc})") from None

    # ---- commands -------------------------------------------------------------------------------

    def run(self, argv: list[str], *, cwd: str, timeout: float, log: Callable[[str], None]) -> int:
        """Run ``argv`` in ``cwd`` on the device; stream its output lines to ``log``; return its exit code.

        The command runs under ``timeout`` (coreutils) on the device, so it is stopped there too when the
        deadline passes, and the host stops waiting a little after.

        Raises:
            DeviceTimeoutError: it ran past ``timeout`` seconds.
            DeviceUnreachableError: the connection dropped.
        """
        limit = max(1, int(timeout))
        command = f"cd {shlex.quote(cwd)} && exec timeout -k 5 {limit} " + " ".join(shlex.quote(a) for a in argv)
        transport = self.client.get_transport()
        if transport is None or not transport.is_active():
            raise DeviceUnreachableError(f"{self.host.label}: connection lost before the device step")
        channel = transport.open_session(timeout=self.connect_timeout)
        channel.set_combine_stderr(True)
        channel.exec_command(command)
        deadline = time.monotonic() + limit + 10
        pending = b""
        try:
            while True:
                while channel.recv_ready():
                    pending += channel.recv(65536)
                    *lines, pending = pending.split(b"\n")
                    for line in lines:
                        log(line.decode("utf-8", "replace").rstrip("\r"))
                if channel.exit_status_ready() and not channel.recv_ready():
                    break
                if not transport.is_active():
                    raise DeviceUnreachableError(f"{self.host.label}: connection lost during the device step")
                if time.monotonic() > deadline:
                    raise DeviceTimeoutError(
                        f"{self.host.label}: the device step ran past {limit}s and was stopped",
                        hint="raise --timeout, or check the device's load",
                    )
                time.sleep(0.05)
            if pending:
                log(pending.decode("utf-8", "replace").rstrip("\r"))
            code = channel.recv_exit_status()
        finally:
            channel.close()
        if code == 124 or code == 137:  # timeout(1): TERM'd (124) or KILL'd after the grace period (137)
            raise DeviceTimeoutError(
                f"{self.host.label}: the device step ran past {limit}s and was stopped",
                hint="raise --timeout, or check the device's load",
            )
        return int(code)

    def remove_tree(self, remote: str) -> None:
        """``rm -rf`` a folder this run created (best effort: the run's result does not depend on it)."""
        transport = self.client.get_transport()
        if transport is None or not transport.is_active():
            return
        try:
            channel = transport.open_session(timeout=self.connect_timeout)
            channel.exec_command(f"rm -rf -- {shlex.quote(remote)}")
            channel.recv_exit_status()
            channel.close()
        except (OSError, EOFError):
            return
