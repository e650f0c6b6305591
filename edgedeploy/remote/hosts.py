"""Device host specs (``[TARGET=]user@host[:port]``) and which output folder each one completes."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from edgedeploy.errors import ConfigError

_SPEC = re.compile(
    r"^(?:(?P<target>[A-Za-z0-9][\w.-]*)=)?(?P<user>[\w.-]+)@(?P<host>[\w.-]+|\[[0-9a-fA-F:]+\])(?::(?P<port>\d+))?$"
)


@dataclass(frozen=True)
class DeviceHost:
    """One device reachable over SSH; ``target`` (optional) names the target profile it runs."""

    user: str
    hostname: str
    port: int = 22
    target: str | None = None

    @property
    def label(self) -> str:
        port = "" if self.port == 22 else f":{self.port}"
        return f"{self.user}@{self.hostname}{port}"


def parse_host(spec: str) -> DeviceHost:
    """``[TARGET=]user@host[:port]`` -> :class:`DeviceHost`.

    Raises:
        ConfigError: not of that form, or a port outside 1..65535.
    """
    m = _SPEC.match(spec.strip())
    if m is None:
        raise ConfigError(
            f"--host {spec!r} is not [TARGET=]user@host[:port]",
            hint="e.g. --host jetson-orin=ci@orin-01.lab or --host ci@10.0.0.7:2222",
        )
    port = int(m.group("port") or 22)
    if not 1 <= port <= 65535:
        raise ConfigError(f"--host {spec!r}: port {port} is outside 1..65535")
    return DeviceHost(m.group("user"), m.group("host").strip("[]"), port, m.group("target"))


def assign_hosts(outputs: dict[Path, str], hosts: list[DeviceHost]) -> list[tuple[Path, DeviceHost]]:
    """Pair each output folder (-> its target) with the one host that completes it.

    A host's ``TARGET=`` names the target an output folder was built for, or the folder's own name
    (``--host orin=...`` for ``out/orin``); a host without one is allowed only when there is one output
    folder and one host.

    Raises:
        ConfigError: a target no output folder was built for, two folders of one target, two hosts for
            one folder, a folder without a host, or an unnamed host among several.
    """
    by_target: dict[str, list[Path]] = {}
    for out, target in outputs.items():
        for key in {target, out.name}:
            by_target.setdefault(key, []).append(out)
    pairs: list[tuple[Path, DeviceHost]] = []
    for host in hosts:
        if host.target is None:
            if len(outputs) != 1 or len(hosts) != 1:
                raise ConfigError(
                    f"--host {host.label} names no target, and there are {len(outputs)} output folders and "
                    f"{len(hosts)} hosts",
                    hint="name the target of each host: --host TARGET=user@host",
                )
            pairs.append((next(iter(outputs)), host))
            continue
        folders = by_target.get(host.target, [])
        if len(folders) != 1:
            known = ", ".join(f"{o} ({t})" for o, t in outputs.items())
            why = "no output folder was built for it" if not folders else "several output folders were built for it"
            import difflib

            close = difflib.get_close_matches(host.target, list(by_target), n=1)
            raise ConfigError(
                f"--host {host.target}={host.label}: {why} (given: {known})",
                hint=f"did you mean --host {close[0]}={host.label}?"
                if close and not folders
                else "give one output folder per target"
                if folders
                else "name the target of one of the folders given: --host TARGET=user@host",
            )
        pairs.append((folders[0], host))
    taken = [out for out, _ in pairs]
    for out in outputs:
        if taken.count(out) > 1:
            raise ConfigError(f"{out}: several --host options complete it", hint="give one host per output folder")
        if out not in taken:
            raise ConfigError(
                f"{out} ({outputs[out]}): no --host completes it", hint=f"add --host {outputs[out]}=user@host"
            )
    return pairs
