"""A pod's owning workload: its controller owner reference, and for a ReplicaSet the
Deployment above it (one cached `GET replicasets/{name}`; nothing else is read).

Runs on the pod-cache thread only, so lookups on the span path never do I/O.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

from ..ratelimit import RateLimitedLog

# (kind, name) pairs from the pod upwards, e.g. (("ReplicaSet", "web-5d9c"), ("Deployment", "web")).
Owners = Tuple[Tuple[str, str], ...]

_log = logging.getLogger(__name__)


class OwnerResolver:
    """Resolves owners; `apps_api` is a kubernetes.client.AppsV1Api (or anything with
    `read_namespaced_replica_set(name, namespace, _preload_content=False)`).

    A ReplicaSet's owner never changes in practice, so answers are kept for good;
    a failed GET (API down, RBAC missing) is retried after `retry_s`, and until then the
    pod carries its ReplicaSet without the Deployment.
    """

    def __init__(
        self,
        apps_api: Any,
        events: RateLimitedLog,
        retry_s: float = 30.0,
        request_timeout_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._apps = apps_api
        self._events = events
        self._retry_s = retry_s
        self._request_timeout_s = request_timeout_s
        self._clock = clock
        self._deployment_of: Dict[Tuple[str, str], Optional[str]] = {}
        self._failed_at: Dict[Tuple[str, str], float] = {}

    def owners_of(self, pod: Mapping[str, Any]) -> Owners:
        meta = pod.get("metadata") or {}
        ref = controller_of(meta)
        if ref is None:
            return ()
        kind, name = ref
        if kind != "ReplicaSet":
            return ((kind, name),)
        deployment = self._deployment(meta.get("namespace", ""), name)
        if deployment is None:
            return ((kind, name),)
        return ((kind, name), ("Deployment", deployment))

    def forget_except(self, keep: set) -> None:
        """Drops cached ReplicaSets not in `keep` ((namespace, name) pairs), after a re-list."""
        for key in list(self._deployment_of):
            if key not in keep:
                del self._deployment_of[key]

    def _deployment(self, namespace: str, name: str) -> Optional[str]:
        key = (namespace, name)
        if key in self._deployment_of:
            return self._deployment_of[key]
        failed = self._failed_at.get(key)
        if failed is not None and self._clock() - failed < self._retry_s:
            return None
        try:
            resp = self._apps.read_namespaced_replica_set(
                name, namespace, _preload_content=False, _request_timeout=self._request_timeout_s
            )
            replicaset = _json(resp)
        except Exception as exc:  # ApiException, urllib3 errors, bad JSON: all mean "not now"
            if getattr(exc, "status", None) == 404:
                # Gone already (scaled away); the pod will follow, nothing to retry.
                self._deployment_of[key] = None
                return None
            self._failed_at[key] = self._clock()
            self._events.event(
                "owner_lookup_errors",
                logging.WARNING,
                "k8s: cannot read ReplicaSet %s/%s (%s); pods keep k8s.replicaset.name "
                "without k8s.deployment.name until it can be read",
                namespace,
                name,
                describe(exc),
            )
            return None
        self._failed_at.pop(key, None)
        ref = controller_of(replicaset.get("metadata") or {})
        deployment = ref[1] if ref and ref[0] == "Deployment" else None
        self._deployment_of[key] = deployment
        return deployment


def controller_of(meta: Mapping[str, Any]) -> Optional[Tuple[str, str]]:
    """(kind, name) of the owner reference marked controller, else None."""
    for ref in meta.get("ownerReferences") or ():
        if ref.get("controller") and ref.get("kind") and ref.get("name"):
            return ref["kind"], ref["name"]
    return None


def _json(resp: Any) -> Dict[str, Any]:
    try:
        return json.loads(resp.data)
    finally:
        resp.release_conn()


def describe(exc: BaseException) -> str:
    """A short, log-friendly description of an API failure."""
    status = getattr(exc, "status", None)
    if status:
        return f"HTTP {status} {getattr(exc, 'reason', '')}".strip()
    return f"{type(exc).__name__}: {exc}"[:200]
