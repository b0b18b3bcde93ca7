"""Pod + container -> OpenTelemetry resource attributes, and the service-name rule."""

from __future__ import annotations

from typing import Dict, Optional

from .. import semconv
from .pod_cache import PodInfo

# Owner kinds that have a semantic-convention attribute. CronJob has none in semconv.py,
# so a CronJob's pods carry k8s.job.name only.
_OWNER_ATTRIBUTE = {
    "ReplicaSet": semconv.K8S_REPLICASET_NAME,
    "Deployment": semconv.K8S_DEPLOYMENT_NAME,
    "StatefulSet": semconv.K8S_STATEFULSET_NAME,
    "DaemonSet": semconv.K8S_DAEMONSET_NAME,
    "Job": semconv.K8S_JOB_NAME,
}

# Label order of the service-name rule: the recommended label first, the older one next.
SERVICE_NAME_LABELS = ("app.kubernetes.io/name", "app")


def pod_attributes(pod: PodInfo, container_id: Optional[str]) -> Dict[str, str]:
    """Resource attributes of one container of `pod` (container_id may be unknown).

    Empty values are left out rather than exported as "".
    """
    attributes = {
        semconv.K8S_POD_NAME: pod.name,
        semconv.K8S_POD_UID: pod.uid,
        semconv.K8S_NAMESPACE_NAME: pod.namespace,
        semconv.K8S_NODE_NAME: pod.node_name,
    }
    if container_id:
        attributes[semconv.CONTAINER_ID] = container_id
        attributes[semconv.K8S_CONTAINER_NAME] = pod.containers.get(container_id, "")
    for kind, name in pod.owners:
        key = _OWNER_ATTRIBUTE.get(kind)
        if key:
            attributes[key] = name
    return {key: value for key, value in attributes.items() if value}


def service_name(pod: PodInfo, container_id: Optional[str]) -> Optional[str]:
    """service.name for a process of this pod whose environment has no OTEL_SERVICE_NAME:
    label app.kubernetes.io/name, else label app, else the container's name."""
    for label in SERVICE_NAME_LABELS:
        value = pod.labels.get(label)
        if value:
            return value
    if container_id:
        return pod.containers.get(container_id) or None
    return None
