"""K8sResolver: pid -> container (its cgroup) -> pod (this node's pod cache)."""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from typing import Dict, Mapping, Optional, Tuple

from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from ..proc import path as proc_path, read_text, start_time
from ..ratelimit import RateLimitedLog, Stats
from .attributes import pod_attributes, service_name
from .cgroup import CgroupFormatError, ContainerRef, parse_cgroup
from .owners import describe
from .pod_cache import PodCache, PodInfo

_log = logging.getLogger(__name__)

# Enough for every process of a busy node; evicts least recently used beyond it.
_MAX_CACHED_PIDS = 16384


class K8sResolver:
    """Resource attributes for a PID, from its cgroup and this node's pods.

    Explicit construction (tests, or a custom client):

        cfg = kubernetes.client.Configuration(); cfg.host = "http://127.0.0.1:PORT"
        resolver = K8sResolver(node_name="node-a",
                               api_client=kubernetes.client.ApiClient(cfg),
                               proc_root=str(fake_proc_dir))
        resolver.wait_synced(5)

    Give the client's Configuration `retries = 0` (from_environment does): the pod
    cache retries with back-off, and urllib3's own retries each log a warning.
    The pod cache thread starts at construction unless `start=False`. Lookups never
    raise and never do network I/O: problems are counted in `stats` and logged at most
    once a minute per kind (otel_gpu.ratelimit).
    """

    def __init__(
        self,
        node_name: str,
        api_client: k8s_client.ApiClient,
        proc_root: str = "/proc",
        *,
        resync_s: float = 300.0,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 30.0,
        start: bool = True,
        owns_client: bool = False,
    ) -> None:
        self.node_name = node_name
        self._proc_root = proc_root
        self._api_client = api_client
        self._owns_client = owns_client
        self._stats = Stats()
        self._events = RateLimitedLog(_log, self._stats)
        self.pod_cache = PodCache(
            api_client,
            node_name,
            resync_s=resync_s,
            backoff_initial_s=backoff_initial_s,
            backoff_max_s=backoff_max_s,
            stats=self._stats,
            events=self._events,
        )
        self._lock = threading.Lock()
        # pid -> (start time, container or None): a reused PID has another start time.
        self._pids: "OrderedDict[int, Tuple[int, Optional[ContainerRef]]]" = OrderedDict()
        if start:
            self.pod_cache.start()

    @classmethod
    def from_environment(
        cls, proc_root: str = "/proc", environ: Optional[Mapping[str, str]] = None
    ) -> Optional["K8sResolver"]:
        """A started resolver configured from the environment, or None outside Kubernetes.

        KUBECONFIG (when set) or the in-cluster service account (KUBERNETES_SERVICE_HOST)
        gives the credentials; NODE_NAME (downward API, spec.nodeName) picks the node.
        Without either, or without NODE_NAME, returns None after one log line.
        """
        env = os.environ if environ is None else environ
        kubeconfig = env.get("KUBECONFIG")
        if not kubeconfig and not env.get("KUBERNETES_SERVICE_HOST"):
            _log.info("k8s: not in Kubernetes (no KUBERNETES_SERVICE_HOST or KUBECONFIG); "
                      "no pod attributes")
            return None
        node_name = env.get("NODE_NAME")
        if not node_name:
            _log.warning("k8s: NODE_NAME is not set (give it spec.nodeName through the "
                         "downward API); no pod attributes")
            return None
        configuration = k8s_client.Configuration()
        # No urllib3 retries (each logs a warning): the pod cache's back-off retries.
        configuration.retries = 0
        try:
            if kubeconfig:
                k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
            else:
                k8s_config.load_incluster_config(client_configuration=configuration)
        except Exception as exc:  # ConfigException, missing token file, bad YAML
            _log.warning("k8s: cannot load Kubernetes credentials (%s); no pod attributes",
                         describe(exc))
            return None
        return cls(node_name, k8s_client.ApiClient(configuration), proc_root, owns_client=True)

    # --- lookups ----------------------------------------------------------------------

    def attributes_for(self, pid: int) -> Dict[str, str]:
        """Pod and container attributes of `pid`; {} when not a container, unreadable,
        or the pod is not known (yet, or while the API is down)."""
        found = self._lookup(pid)
        if found is None:
            return {}
        pod, ref = found
        return pod_attributes(pod, ref.container_id)

    def service_name_for(self, pid: int) -> Optional[str]:
        """service.name from the pod (labels, else container name), or None. Meant only
        for processes whose environment has no OTEL_SERVICE_NAME."""
        found = self._lookup(pid)
        if found is None:
            return None
        pod, ref = found
        return service_name(pod, ref.container_id)

    @property
    def pods_version(self) -> int:
        """Grows whenever the known pods change. A caller that caches attributes per
        process can rebuild the ones that came back {} when this has moved (e.g. the API
        was down when the process was first seen)."""
        return self.pod_cache.version

    def wait_synced(self, timeout: Optional[float] = None) -> bool:
        """True once the pod cache has listed the node's pods at least once."""
        return self.pod_cache.wait_synced(timeout)

    @property
    def stats(self) -> Dict[str, int]:
        """Counters (a snapshot): proc_gone, proc_unreadable, cgroup_malformed, pid_raced,
        not_container, pod_unknown, resolved, internal_errors, relists, watch_events,
        watch_expired, api_errors, owner_lookup_errors."""
        return self._stats.snapshot()

    def stop(self) -> None:
        self.pod_cache.stop()
        if self._owns_client:
            self._api_client.close()

    def __enter__(self) -> "K8sResolver":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- internals --------------------------------------------------------------------

    def _lookup(self, pid: int) -> Optional[Tuple[PodInfo, ContainerRef]]:
        try:
            return self._lookup_unguarded(pid)
        except Exception as exc:  # the span path must never break on enrichment
            self._events.event("internal_errors", logging.WARNING,
                               "k8s: attribute lookup for pid %s failed (%s)", pid, describe(exc))
            return None

    def _lookup_unguarded(self, pid: int) -> Optional[Tuple[PodInfo, ContainerRef]]:
        ref = self._container_of(pid)
        if ref is None:
            return None
        pod = self.pod_cache.by_container(ref.container_id)
        if pod is None and ref.pod_uid:
            pod = self.pod_cache.by_uid(ref.pod_uid)
        if pod is None:
            self._stats.add("pod_unknown")
            return None
        self._stats.add("resolved")
        return pod, ref

    def _container_of(self, pid: int) -> Optional[ContainerRef]:
        base = proc_path(self._proc_root, pid)
        start = start_time(self._proc_root, pid)
        if start is None:
            if os.path.isdir(base):
                self._events.event("proc_unreadable", logging.WARNING,
                                   "k8s: cannot read or parse %s/stat; is hostPID set and "
                                   "CAP_SYS_PTRACE granted?", base)
            else:
                self._stats.add("proc_gone")  # exited: normal, not worth a log line
            return None
        with self._lock:
            cached = self._pids.get(pid)
            if cached is not None and cached[0] == start:
                self._pids.move_to_end(pid)
                return cached[1]
        try:
            text = read_text(self._proc_root, pid, "cgroup")
            # The PID may have exited, or been reused, between the two reads.
            again = start_time(self._proc_root, pid)
            if again != start:
                self._stats.add("proc_gone" if again is None else "pid_raced")
                return None
            ref = parse_cgroup(text)
        except (FileNotFoundError, ProcessLookupError):
            self._stats.add("proc_gone")
            return None
        except CgroupFormatError as exc:
            self._events.event("cgroup_malformed", logging.WARNING,
                               "k8s: %s/cgroup is malformed (%s); no pod attributes for it",
                               base, exc)
            return None
        except OSError as exc:
            self._events.event("proc_unreadable", logging.WARNING,
                               "k8s: cannot read %s (%s); is hostPID set and "
                               "CAP_SYS_PTRACE granted?", base, exc)
            return None
        if ref is None:
            self._stats.add("not_container")
        with self._lock:
            self._pids[pid] = (start, ref)
            self._pids.move_to_end(pid)
            while len(self._pids) > _MAX_CACHED_PIDS:
                self._pids.popitem(last=False)
        return ref
