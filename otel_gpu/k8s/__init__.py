"""PID -> container -> pod: Kubernetes resource attributes for traced processes.

Typical use (the enrich stage):

    resolver = K8sResolver.from_environment()      # None outside Kubernetes
    if resolver is not None:
        attrs = resolver.attributes_for(pid)       # {} until the pod is known
        name = resolver.service_name_for(pid)      # only when OTEL_SERVICE_NAME is unset
    ...
    resolver.stop()

Pieces: `cgroup` (parse /proc/<pid>/cgroup), `pod_cache` (list+watch this node's pods),
`owners` (ReplicaSet -> Deployment), `attributes` (semantic-convention names).
"""

from .cgroup import ContainerRef, parse_cgroup
from .pod_cache import PodInfo
from .resolver import K8sResolver

__all__ = ["K8sResolver", "ContainerRef", "PodInfo", "parse_cgroup"]
