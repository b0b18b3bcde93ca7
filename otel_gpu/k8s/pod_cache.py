"""The pods of this node, kept current by list + watch on a daemon thread.

The loop is the informer pattern, written out so each failure mode is visible:

    list (fieldSelector=spec.nodeName=NODE) -> watch from its resourceVersion
      -> the watch ends after `resync_s` (server-side timeoutSeconds) -> list again (resync)
      -> a 410 Gone ERROR event (history compacted)               -> list again at once
      -> any other failure (API down, timeout, bad data)          -> back off, list again

During back-off the last known pods stay; lookups are by container id (unique per
container) or pod uid, so a stale entry can never be matched by a new container.
Raw JSON is used instead of the client's models: no per-event model building, and the
same field names as the API documentation.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional

from kubernetes import client as k8s_client
from kubernetes.watch.watch import iter_resp_lines

from .owners import OwnerResolver, Owners, describe
from ..ratelimit import RateLimitedLog, Stats

_log = logging.getLogger(__name__)

# Static pods run in cgroups named after this hash; their mirror pod has another uid.
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"


@dataclass(frozen=True)
class PodInfo:
    """What the attributes need from one pod (immutable: safe to hand to any thread)."""

    uid: str
    name: str
    namespace: str
    node_name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    containers: Mapping[str, str] = field(default_factory=dict)  # container id -> name
    owners: Owners = ()
    mirror_uid: Optional[str] = None


class _WatchExpired(Exception):
    """The API server compacted past our resourceVersion (HTTP 410 Gone)."""


class PodCache:
    """Thread-safe cache of this node's pods.

    `api_client` is a kubernetes.client.ApiClient (in-cluster, kubeconfig, or a
    Configuration with host=http://127.0.0.1:PORT for a fake API server in tests).
    Call `start()` once; lookups never block on the network.
    """

    def __init__(
        self,
        api_client: k8s_client.ApiClient,
        node_name: str,
        *,
        resync_s: float = 300.0,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 30.0,
        stats: Optional[Stats] = None,
        events: Optional[RateLimitedLog] = None,
    ) -> None:
        if not node_name:
            raise ValueError("node_name is required: the cache only watches this node's pods")
        self.node_name = node_name
        self._core = k8s_client.CoreV1Api(api_client)
        self._stats = stats or Stats()
        self._events = events or RateLimitedLog(_log, self._stats)
        self._owners = OwnerResolver(k8s_client.AppsV1Api(api_client), self._events)
        self._selector = f"spec.nodeName={node_name}"
        self._resync_s = max(1, int(resync_s))
        self._backoff_initial_s = backoff_initial_s
        self._backoff_max_s = backoff_max_s
        self._lock = threading.Lock()
        self._by_uid: Dict[str, PodInfo] = {}
        self._by_container: Dict[str, PodInfo] = {}
        self._by_mirror: Dict[str, PodInfo] = {}
        self._version = 0  # bumped on every change, see `version`
        self._synced = threading.Event()
        self._stopping = threading.Event()
        self._response: Any = None  # the open watch stream, closed by stop()
        self._delivered = False  # the current watch has delivered at least one event
        self._failing = False  # the last attempt failed: say so when it works again
        self._thread: Optional[threading.Thread] = None

    # --- lookups (any thread) -------------------------------------------------------

    def by_container(self, container_id: str) -> Optional[PodInfo]:
        with self._lock:
            return self._by_container.get(container_id)

    def by_uid(self, pod_uid: str) -> Optional[PodInfo]:
        """By metadata.uid, or for static pods by the config hash their cgroups carry."""
        with self._lock:
            return self._by_uid.get(pod_uid) or self._by_mirror.get(pod_uid)

    def pods(self) -> List[PodInfo]:
        with self._lock:
            return list(self._by_uid.values())

    @property
    def version(self) -> int:
        """Grows whenever the cached pods change: a caller that cached "no pod yet"
        answers can ask again only when this moved."""
        with self._lock:
            return self._version

    def wait_synced(self, timeout: Optional[float] = None) -> bool:
        """True once the first list has succeeded (False on timeout)."""
        return self._synced.wait(timeout)

    @property
    def stats(self) -> Dict[str, int]:
        return self._stats.snapshot()

    # --- lifecycle --------------------------------------------------------------------

    def start(self) -> "PodCache":
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="otel-gpu-pod-cache", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Ends the thread promptly, interrupting a watch blocked on a quiet stream."""
        self._stopping.set()
        with self._lock:
            response = self._response
        if response is not None:
            _interrupt(response)
        if self._thread is not None:
            self._thread.join(timeout)

    # --- the loop (cache thread) ------------------------------------------------------

    def _run(self) -> None:
        delay = self._backoff_initial_s
        while not self._stopping.is_set():
            self._delivered = False
            try:
                self._watch(self._relist())
                delay = self._backoff_initial_s
            except _WatchExpired:
                self._stats.add("watch_expired")
                _log.debug("k8s: pod watch expired (410 Gone); re-listing")
                if not self._delivered:
                    # 410 straight after a fresh list: do not hammer a confused server.
                    self._stopping.wait(self._backoff_initial_s)
            except Exception as exc:  # the thread must survive anything the API does
                if self._stopping.is_set():
                    break
                if self._delivered:
                    # The watch was healthy before this failure: start the back-off over.
                    delay = self._backoff_initial_s
                self._failing = True
                self._events.event(
                    "api_errors",
                    logging.WARNING,
                    "k8s: Kubernetes API unavailable (%s); retrying in %.1fs, spans go on "
                    "without new pod attributes meanwhile",
                    describe(exc),
                    delay,
                )
                self._stopping.wait(delay)
                delay = min(delay * 2, self._backoff_max_s)

    def _relist(self) -> str:
        response = self._core.list_pod_for_all_namespaces(
            field_selector=self._selector,
            _preload_content=False,
            _request_timeout=(10, 60),
        )
        try:
            body = json.loads(response.data)
        finally:
            response.release_conn()
        pods = [self._info(item) for item in body.get("items") or () if self._on_this_node(item)]
        self._owners.forget_except(
            {(p.namespace, name) for p in pods for kind, name in p.owners if kind == "ReplicaSet"}
        )
        by_uid = {p.uid: p for p in pods}
        with self._lock:
            self._by_uid = by_uid
            self._by_container = {cid: p for p in pods for cid in p.containers}
            self._by_mirror = {p.mirror_uid: p for p in pods if p.mirror_uid}
            self._version += 1
        self._stats.add("relists")
        if not self._synced.is_set() or self._failing:
            _log.info("k8s: pod cache synced, %d pods on node %s", len(pods), self.node_name)
        self._failing = False
        self._synced.set()
        return (body.get("metadata") or {}).get("resourceVersion") or ""

    def _watch(self, version: str) -> None:
        """Applies watch events until the server ends the stream (after resync_s)."""
        try:
            response = self._core.list_pod_for_all_namespaces(
                field_selector=self._selector,
                watch=True,
                resource_version=version,
                allow_watch_bookmarks=True,
                timeout_seconds=self._resync_s,
                _preload_content=False,
                # The server closes after timeout_seconds; a silent, never-closing stream
                # is a hung connection, noticed after a further minute.
                _request_timeout=(10, self._resync_s + 60),
            )
        except k8s_client.ApiException as exc:
            if exc.status == 410:  # some servers answer a too-old version with a plain 410
                raise _WatchExpired() from exc
            raise
        with self._lock:
            self._response = response
        try:
            # stop() sets the flag before it looks for a response to interrupt: either it
            # saw this one, or this check sees the flag.
            if self._stopping.is_set():
                return
            for line in iter_resp_lines(response):
                if self._stopping.is_set():
                    return
                if line:
                    self._delivered = True
                    self._apply(json.loads(line))
        finally:
            with self._lock:
                self._response = None
            response.release_conn()

    def _apply(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        obj = event.get("object") or {}
        self._stats.add("watch_events")
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise _WatchExpired()
            raise RuntimeError(f"watch error {obj.get('code')}: {obj.get('message', '')}"[:200])
        if kind in ("ADDED", "MODIFIED") and self._on_this_node(obj):
            self._put(self._info(obj))
        elif kind in ("DELETED", "ADDED", "MODIFIED"):
            self._remove((obj.get("metadata") or {}).get("uid", ""))
        # BOOKMARK: nothing to apply; the resourceVersion is only needed on a re-list.

    def _put(self, pod: PodInfo) -> None:
        with self._lock:
            self._drop_locked(pod.uid)
            self._by_uid[pod.uid] = pod
            for cid in pod.containers:
                self._by_container[cid] = pod
            if pod.mirror_uid:
                self._by_mirror[pod.mirror_uid] = pod
            self._version += 1

    def _remove(self, uid: str) -> None:
        with self._lock:
            self._drop_locked(uid)

    def _drop_locked(self, uid: str) -> None:
        old = self._by_uid.pop(uid, None)
        if old is None:
            return
        for cid in old.containers:
            if self._by_container.get(cid) is old:
                del self._by_container[cid]
        if old.mirror_uid and self._by_mirror.get(old.mirror_uid) is old:
            del self._by_mirror[old.mirror_uid]
        self._version += 1

    def _on_this_node(self, pod: Mapping[str, Any]) -> bool:
        # Belt and braces: the field selector already filters, a pod may only move off
        # the node through an update that the cache must then forget.
        return (pod.get("spec") or {}).get("nodeName") == self.node_name

    def _info(self, pod: Mapping[str, Any]) -> PodInfo:
        meta = pod.get("metadata") or {}
        return PodInfo(
            uid=meta.get("uid", ""),
            name=meta.get("name", ""),
            namespace=meta.get("namespace", ""),
            node_name=(pod.get("spec") or {}).get("nodeName", ""),
            labels=dict(meta.get("labels") or {}),
            containers=container_ids(pod),
            owners=self._owners.owners_of(pod),
            mirror_uid=(meta.get("annotations") or {}).get(MIRROR_ANNOTATION),
        )


def container_ids(pod: Mapping[str, Any]) -> Dict[str, str]:
    """Container id (64 hex, runtime scheme stripped) -> container name, for every
    regular, init and ephemeral container that has started."""
    status = pod.get("status") or {}
    found: Dict[str, str] = {}
    for key in ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses"):
        for entry in _list(status.get(key)):
            raw = entry.get("containerID") or ""
            cid = raw.split("://", 1)[-1]
            if cid and entry.get("name"):
                found[cid] = entry["name"]
    return found


def _list(value: Any) -> Iterable[Mapping[str, Any]]:
    return value if isinstance(value, list) else ()


def _interrupt(response: Any) -> None:
    """Unblocks a thread reading `response` (a urllib3 response) from another thread."""
    try:
        sock = getattr(getattr(response, "connection", None), "sock", None)
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
