"""FAKE kube-apiserver for tests: not Kubernetes, just enough of its HTTP API that the
real `kubernetes` Python client can list and watch pods against it.

Speaks, on 127.0.0.1 and a random port:
  GET /api/v1/pods?fieldSelector=spec.nodeName%3DNODE               list (PodList + resourceVersion)
  GET /api/v1/pods?watch=true&resourceVersion=N&timeoutSeconds=S     chunked JSON lines of watch events
  GET /apis/apps/v1/namespaces/{ns}/replicasets/{name}               one ReplicaSet, or 404 Status

Like the real server it keeps an event history with resource versions, replays the
events after a watch's resourceVersion, answers a version older than its compacted
history with an ERROR event whose Status has code 410, ends a watch after timeoutSeconds,
and honours (and insists on understanding) the spec.nodeName field selector.

Test controls: add_pod / update_pod / delete_pod (emit watch events), expire_watches
(410 for open watches and older versions), stop / restart on the same port (API down,
then back with its state), and `requests` (what the client asked for).

    with FakeKubeApiServer() as api:
        api.add_pod(make_pod("web-0", node="node-a", containers={"web": "ab" * 32}))
        client = kubernetes.client.ApiClient(api.configuration())
"""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Mapping, Optional, Tuple
from urllib.parse import parse_qs, urlsplit


def make_pod(
    name: str,
    node: str,
    *,
    namespace: str = "default",
    uid: Optional[str] = None,
    containers: Optional[Mapping[str, str]] = None,
    runtime: str = "containerd",
    labels: Optional[Mapping[str, str]] = None,
    annotations: Optional[Mapping[str, str]] = None,
    owner: Optional[Tuple[str, str]] = None,
) -> Dict[str, Any]:
    """A Pod object as the API returns it. `containers` maps name -> 64-hex id; `owner`
    is the controller (kind, name), e.g. ("ReplicaSet", "web-5d9c7b")."""
    containers = dict(containers or {})
    meta: Dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": uid or str(uuid.uuid4()),
        "labels": dict(labels or {}),
        "annotations": dict(annotations or {}),
    }
    if owner:
        meta["ownerReferences"] = [
            {"apiVersion": _api_version(owner[0]), "kind": owner[0], "name": owner[1],
             "uid": str(uuid.uuid4()), "controller": True, "blockOwnerDeletion": True}
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"nodeName": node, "containers": [{"name": c, "image": "example"} for c in containers]},
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {"name": c, "containerID": f"{runtime}://{cid}", "ready": True, "restartCount": 0,
                 "image": "example", "imageID": "", "started": True}
                for c, cid in containers.items()
            ],
        },
    }


def make_replicaset(namespace: str, name: str, deployment: Optional[str]) -> Dict[str, Any]:
    meta: Dict[str, Any] = {"name": name, "namespace": namespace, "uid": str(uuid.uuid4())}
    if deployment:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "Deployment", "name": deployment,
                                    "uid": str(uuid.uuid4()), "controller": True}]
    return {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": meta, "spec": {"selector": {}}}


class FakeKubeApiServer:
    """FAKE Kubernetes API server (see module docstring). Thread-safe test controls."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self.port = port
        self.requests: List[Tuple[str, Dict[str, str]]] = []  # (path, query) in arrival order
        self._cond = threading.Condition()
        self._version = 1
        self._compacted = 0  # watches from an older version get 410
        self._expiry = 0  # bumped by expire_watches(); open watches compare it
        self._pods: Dict[Tuple[str, str], Dict[str, Any]] = {}
        self._replicasets: Dict[Tuple[str, str], Dict[str, Any]] = {}
        self._history: List[Tuple[int, str, Dict[str, Any]]] = []  # (version, type, pod)
        self._open_watches = 0
        self._server: Optional[ThreadingHTTPServer] = None
        self._thread: Optional[threading.Thread] = None
        self._sockets: set = set()
        self._closing = False

    # --- lifecycle ------------------------------------------------------------------

    def start(self) -> "FakeKubeApiServer":
        handler = type("Handler", (_Handler,), {"fake": self})
        self._server = ThreadingHTTPServer((self.host, self.port), handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]  # keep it: restart() binds it again
        with self._cond:
            self._closing = False
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,),
                                        name="fake-kube-apiserver", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """API down: the port refuses connections and open connections drop mid-stream."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            sockets = list(self._sockets)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def restart(self) -> "FakeKubeApiServer":
        """API back on the same port, with the objects and history it had."""
        return self.start()

    def __enter__(self) -> "FakeKubeApiServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def configuration(self):
        """A kubernetes.client.Configuration that points the real client here."""
        from kubernetes import client

        configuration = client.Configuration()
        configuration.host = self.url
        # As in K8sResolver.from_environment: the pod cache's back-off does the retrying.
        configuration.retries = 0
        return configuration

    # --- objects ----------------------------------------------------------------------

    def add_pod(self, pod: Dict[str, Any], emit: bool = True) -> Dict[str, Any]:
        """Stores the pod and sends ADDED to watchers. emit=False stores it as if its
        event had been lost to compaction: only a re-list will show it."""
        return self._store(pod, "ADDED", emit)

    def update_pod(self, pod: Dict[str, Any]) -> Dict[str, Any]:
        return self._store(pod, "MODIFIED", True)

    def delete_pod(self, namespace: str, name: str) -> None:
        with self._cond:
            pod = self._pods.pop((namespace, name))
            self._record("DELETED", pod)

    def add_replicaset(self, namespace: str, name: str, deployment: Optional[str]) -> None:
        with self._cond:
            self._replicasets[(namespace, name)] = make_replicaset(namespace, name, deployment)

    def expire_watches(self) -> None:
        """Compacts the history: open watches get an ERROR 410 event, and a watch from any
        version older than now is answered the same way."""
        with self._cond:
            self._compacted = self._version
            self._history.clear()
            self._expiry += 1
            self._cond.notify_all()

    # --- test helpers -------------------------------------------------------------------

    def wait_for_watch(self, timeout: float = 5.0) -> bool:
        """True once a watch stream is open (so a following event is delivered live)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._open_watches == 0:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return True

    def count(self, watch: bool) -> int:
        """How many list (watch=False) or watch (watch=True) requests for pods arrived."""
        with self._cond:
            return sum(1 for path, q in self.requests
                       if path == "/api/v1/pods" and (q.get("watch") == "true") == watch)

    # --- internals (called by the handler) ---------------------------------------------

    def _store(self, pod: Dict[str, Any], kind: str, emit: bool) -> Dict[str, Any]:
        pod = json.loads(json.dumps(pod))  # the caller's dict stays theirs
        meta = pod["metadata"]
        with self._cond:
            if emit:
                self._record(kind, pod)
            else:
                self._version += 1
                meta["resourceVersion"] = str(self._version)
            self._pods[(meta["namespace"], meta["name"])] = pod
        return pod

    def _record(self, kind: str, pod: Dict[str, Any]) -> None:
        self._version += 1
        pod["metadata"]["resourceVersion"] = str(self._version)
        self._history.append((self._version, kind, json.loads(json.dumps(pod))))
        self._cond.notify_all()

    def _list(self, node: Optional[str]) -> Dict[str, Any]:
        with self._cond:
            items = [p for p in self._pods.values() if _matches(p, node)]
            return {"kind": "PodList", "apiVersion": "v1",
                    "metadata": {"resourceVersion": str(self._version)}, "items": items}


def _api_version(kind: str) -> str:
    return "batch/v1" if kind in ("Job", "CronJob") else "apps/v1"


def _matches(pod: Mapping[str, Any], node: Optional[str]) -> bool:
    return node is None or pod.get("spec", {}).get("nodeName") == node


def _status(code: int, reason: str, message: str) -> Dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive and chunked watch streams, like the real one
    fake: FakeKubeApiServer

    def setup(self) -> None:
        super().setup()
        with self.fake._cond:
            self.fake._sockets.add(self.connection)

    def finish(self) -> None:
        with self.fake._cond:
            self.fake._sockets.discard(self.connection)
        try:
            super().finish()
        except OSError:
            pass

    def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
        pass

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        with self.fake._cond:
            self.fake.requests.append((parts.path, query))
        segments = parts.path.strip("/").split("/")
        if parts.path == "/api/v1/pods":
            selector = query.get("fieldSelector")
            if selector is not None and not selector.startswith("spec.nodeName="):
                return self._json(400, _status(400, "BadRequest", f"fake supports only "
                                               f"spec.nodeName selectors, got {selector!r}"))
            node = selector.split("=", 1)[1] if selector else None
            if query.get("watch") in ("true", "1"):
                return self._watch(node, query)
            return self._json(200, self.fake._list(node))
        if segments[:3] == ["apis", "apps", "v1"] and len(segments) == 7 and segments[5] == "replicasets":
            with self.fake._cond:
                replicaset = self.fake._replicasets.get((segments[4], segments[6]))
            if replicaset is None:
                return self._json(404, _status(404, "NotFound", f"replicasets {segments[6]!r} not found"))
            return self._json(200, replicaset)
        self._json(404, _status(404, "NotFound", f"the fake does not serve {parts.path}"))

    def _json(self, code: int, body: Mapping[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _watch(self, node: Optional[str], query: Mapping[str, str]) -> None:
        fake = self.fake
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        deadline = time.monotonic() + float(query.get("timeoutSeconds") or 1800)
        with fake._cond:
            position = int(query.get("resourceVersion") or fake._version)
            expiry = fake._expiry
            too_old = position < fake._compacted
            fake._open_watches += 1
            fake._cond.notify_all()
        try:
            if too_old:
                return self._expired(position)
            while True:
                with fake._cond:
                    while True:
                        events = [e for e in fake._history if e[0] > position]
                        if events or fake._closing or fake._expiry != expiry:
                            break
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            break
                        fake._cond.wait(remaining)
                    closing, expired = fake._closing, fake._expiry != expiry
                if closing:
                    # Dropped without the final chunk: the client sees a broken stream.
                    self.close_connection = True
                    return
                for version, kind, pod in events:
                    position = version
                    if _matches(pod, node):
                        self._chunk({"type": kind, "object": pod})
                if expired:
                    return self._expired(position)
                if not events and time.monotonic() >= deadline:
                    return self._end()
        except OSError:
            return  # the client went away
        finally:
            with fake._cond:
                fake._open_watches -= 1

    def _expired(self, position: int) -> None:
        self._chunk({"type": "ERROR", "object": _status(
            410, "Expired", f"too old resource version: {position} ({self.fake._compacted})")})
        self._end()

    def _chunk(self, event: Mapping[str, Any]) -> None:
        data = json.dumps(event).encode() + b"\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _end(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
