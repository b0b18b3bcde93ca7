"""Attribute mapping and the service-name rule, on PodInfo values (no I/O)."""

from otel_gpu import semconv
from otel_gpu.k8s.attributes import pod_attributes, service_name
from otel_gpu.k8s.pod_cache import PodInfo

CID = "ab" * 32


def pod(**kwargs):
    base = dict(uid="u-1", name="p", namespace="ns", node_name="n", containers={CID: "main"})
    base.update(kwargs)
    return PodInfo(**base)


def test_every_owner_kind_maps_to_its_semconv_name():
    owners = (("ReplicaSet", "rs"), ("Deployment", "d"), ("StatefulSet", "ss"), ("DaemonSet", "ds"),
              ("Job", "j"), ("CronJob", "cj"), ("SomeOperatorKind", "x"))
    attributes = pod_attributes(pod(owners=owners), CID)
    assert {k: attributes[k] for k in attributes if k.endswith(("set.name", "deployment.name", "job.name"))} == {
        semconv.K8S_REPLICASET_NAME: "rs",
        semconv.K8S_DEPLOYMENT_NAME: "d",
        semconv.K8S_STATEFULSET_NAME: "ss",
        semconv.K8S_DAEMONSET_NAME: "ds",
        semconv.K8S_JOB_NAME: "j",
    }
    assert "x" not in attributes.values() and "cj" not in attributes.values()


def test_unknown_container_and_empty_fields_are_left_out():
    attributes = pod_attributes(pod(node_name=""), None)
    assert attributes == {semconv.K8S_POD_NAME: "p", semconv.K8S_POD_UID: "u-1",
                          semconv.K8S_NAMESPACE_NAME: "ns"}


def test_service_name_prefers_recommended_label_then_app_then_container():
    both = {"app.kubernetes.io/name": "recommended", "app": "legacy"}
    assert service_name(pod(labels=both), CID) == "recommended"
    assert service_name(pod(labels={"app": "legacy"}), CID) == "legacy"
    assert service_name(pod(labels={"app.kubernetes.io/name": "", "app": "legacy"}), CID) == "legacy"
    assert service_name(pod(labels={"team": "x"}), CID) == "main"
    assert service_name(pod(), "cd" * 32) is None
    assert service_name(pod(), None) is None
