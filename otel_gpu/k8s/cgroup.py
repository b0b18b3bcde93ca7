"""/proc/<pid>/cgroup text -> container id, runtime and (when the path carries it) pod uid.

One parser for every layout the kubelet and container runtimes produce:

- cgroup v1 (many `N:controllers:/path` lines) and v2 (one `0::/path` line), and the
  hybrid mix of both;
- the systemd cgroup driver (`kubepods-burstable-pod<uid with _>.slice/cri-containerd-<id>.scope`)
  and the cgroupfs driver (`/kubepods/burstable/pod<uid>/<id>`);
- containerd (`cri-containerd-<id>`), CRI-O (`crio-<id>`), Docker (`docker-<id>`),
  podman (`libpod-<id>`) and bare ids (cgroupfs driver, runtime not in the path);
- paths seen from inside a private cgroup namespace (`0::/../../kubepods-...`), which is
  what a containerised collector reads for other processes even with hostPID.

The parser looks at path components, never at fixed prefixes, so kind's
`kubelet.slice/kubelet-kubepods.slice` and custom `--cgroup-root`s work unchanged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

# Runtime names follow the scheme of status.containerStatuses[].containerID
# ("containerd://<id>"), so they compare directly with what the API says.
RUNTIME_CONTAINERD = "containerd"
RUNTIME_CRIO = "cri-o"
RUNTIME_DOCKER = "docker"
RUNTIME_PODMAN = "podman"

_ID = r"([0-9a-f]{64})"
# Scope prefixes the runtimes use in front of the 64-hex id; ".scope" only with systemd.
_PREFIXED = re.compile(r"^(cri-containerd|crio|docker|libpod)-" + _ID + r"(?:\.scope)?$")
_BARE = re.compile(r"^" + _ID + r"$")
_RUNTIME_BY_PREFIX = {
    "cri-containerd": RUNTIME_CONTAINERD,
    "crio": RUNTIME_CRIO,
    "docker": RUNTIME_DOCKER,
    "libpod": RUNTIME_PODMAN,
}
# "pod<uid>" (cgroupfs) or "...-pod<uid_with_underscores>.slice" (systemd). Static pods
# use a 32-hex config hash instead of a dashed UUID.
_POD = re.compile(
    r"(?:^|-)pod("
    r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
    r"|[0-9a-f]{32})(?:\.slice)?$"
)


class CgroupFormatError(ValueError):
    """The text is not /proc/<pid>/cgroup format (a line lacks `id:controllers:path`)."""


@dataclass(frozen=True)
class ContainerRef:
    """Where a process lives: its container and, when the cgroup path says, its pod."""

    container_id: str  # 64 lowercase hex characters
    runtime: Optional[str]  # one of RUNTIME_*, None when the path does not tell (cgroupfs)
    pod_uid: Optional[str]  # dashed UUID (or the static-pod hash), None outside a pod path


def parse_cgroup(text: str) -> Optional[ContainerRef]:
    """The container a process runs in, from the text of /proc/<pid>/cgroup.

    Returns None for processes that are not in a container (host services, user
    sessions, the root cgroup). Raises CgroupFormatError on malformed text, so a
    caller can count it; the kernel itself never writes such text.

    >>> parse_cgroup("0::/kubepods/besteffort/pod0b1c6f2e-5d8a-4c3e-9f10-2a6b7c8d9e0f/"
    ...              + "a" * 64).pod_uid
    '0b1c6f2e-5d8a-4c3e-9f10-2a6b7c8d9e0f'
    """
    paths = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[0].isdigit() or not parts[2].startswith("/"):
            raise CgroupFormatError(f"line {number} is not 'id:controllers:/path': {line[:120]!r}")
        paths.append(parts[2])
    if not paths:
        raise CgroupFormatError("no cgroup lines")
    # v1 lists one path per hierarchy; they agree for containers, but some controllers
    # (e.g. misc, rdma) may sit at "/". The first path that names a container wins.
    for path in paths:
        ref = parse_cgroup_path(path)
        if ref is not None:
            return ref
    return None


def parse_cgroup_path(path: str) -> Optional[ContainerRef]:
    """The container named by one cgroup path, or None when the path names none."""
    components = [c for c in path.split("/") if c and c not in (".", "..")]
    pod_uid = None
    pod_index = -1
    for index, component in enumerate(components):
        match = _POD.search(component)
        if match:
            pod_uid = _normalise_uid(match.group(1))
            pod_index = index
    # Inside a pod: the first container component below the pod slice is the pod's
    # container (anything deeper is nested, e.g. docker-in-docker). Outside a pod:
    # the deepest container component, since outer ones are the hosting containers.
    candidates = components[pod_index + 1 :] if pod_uid else list(reversed(components))
    for component in candidates:
        if "conmon" in component:
            # CRI-O's monitor process (crio-conmon-<id>.scope) is not the workload.
            return None
        ref = _container_component(component, pod_uid)
        if ref is not None:
            return ref
    return None


def _container_component(component: str, pod_uid: Optional[str]) -> Optional[ContainerRef]:
    match = _PREFIXED.match(component)
    if match:
        return ContainerRef(match.group(2), _RUNTIME_BY_PREFIX[match.group(1)], pod_uid)
    match = _BARE.match(component)
    if match:
        return ContainerRef(match.group(1), None, pod_uid)
    return None


def _normalise_uid(raw: str) -> str:
    # The systemd driver escapes "-" as "_" in slice names; the API uses dashes.
    return raw.replace("_", "-")
