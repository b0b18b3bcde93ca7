"""Kubernetes end to end, with no cluster: a real cgroup v2 directory shaped like a
kubelet pod path, a real CUDA-calling HTTP process moved into it, and a FAKE
kube-apiserver on 127.0.0.1 that the real `kubernetes` client lists and watches."""
from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import pytest

from tests.fakes.kube_apiserver import FakeKubeApiServer, make_pod
from tests.harness import TARGETS, Target, server_spans

CGROUP2 = next((p for p in ("/sys/fs/cgroup/unified", "/sys/fs/cgroup")
                if os.path.exists(f"{p}/cgroup.procs") and os.path.exists(f"{p}/cgroup.controllers")), None)
NODE = "gpu-node-1"


@pytest.fixture
def pod_cgroup():
    """A kubelet-shaped cgroup (systemd driver, containerd) to move a process into."""
    if CGROUP2 is None:
        pytest.skip("no writable cgroup v2 hierarchy on this machine")
    pod_uid, container_id = str(uuid.uuid4()), uuid.uuid4().hex + uuid.uuid4().hex
    top = Path(CGROUP2) / "kubepods.slice"
    leaf = (top / "kubepods-burstable.slice" / f"kubepods-burstable-pod{pod_uid.replace('-', '_')}.slice"
            / f"cri-containerd-{container_id}.scope")
    leaf.mkdir(parents=True)
    yield pod_uid, container_id, leaf
    for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True) + [top]:
        try:
            d.rmdir()
        except OSError:
            pass


def _kubeconfig(path: Path, server: str) -> str:
    path.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: fake, cluster: {{server: "{server}"}}}}]
users: [{{name: fake, user: {{token: fake-token}}}}]
contexts: [{{name: fake, context: {{cluster: fake, user: fake}}}}]
current-context: fake
""")
    return str(path)


def _last_span(receiver, pid, n):
    assert receiver.wait_for(lambda s: len([x for x in server_spans(s, pid) if x.attributes["url.path"] == "/work"]) >= n)
    return sorted((x for x in server_spans(receiver.spans, pid) if x.attributes["url.path"] == "/work"),
                  key=lambda s: s.start_ns)[n - 1]


def test_spans_carry_pod_attributes_from_cgroup_and_watch(tmp_path, pod_cgroup, receiver, start_collector):
    pod_uid, container_id, leaf = pod_cgroup
    with FakeKubeApiServer() as api:
        api.add_replicaset("ml", "infer-7c9d", "infer")
        collector = start_collector(KUBECONFIG=_kubeconfig(tmp_path / "kubeconfig", api.url), NODE_NAME=NODE)
        assert api.wait_for_watch(15), "the collector never watched the pods"
        # Born inside the pod's cgroup, as a container's process is (the resolver reads
        # a process's cgroup once per process lifetime).
        target = Target(["sh", "-c", f"echo $$ > {leaf}/cgroup.procs && exec {sys.executable} "
                                     f"{TARGETS / 'cuda_http.py'} stdlib 0"])
        try:
            _check(api, collector, receiver, target, pod_uid, container_id)
        finally:
            target.stop()


def _check(api, collector, receiver, target, pod_uid, container_id):
    """First without the pod, then with it (watch), then through an API outage."""
    collector.wait_traced(target.pid)
    target.go()

    target.get("/work?launches=1")  # pod not known to the API yet: no pod attributes, no error
    first = _last_span(receiver, target.pid, 1)
    assert "k8s.pod.name" not in first.resource and first.attributes["gpu.launches"] == 1

    pod = make_pod("infer-7c9d-x2x", NODE, namespace="ml", uid=pod_uid, containers={"server": container_id},
                   labels={"app.kubernetes.io/name": "inference"}, owner=("ReplicaSet", "infer-7c9d"))
    api.add_pod(pod)  # arrives through the watch
    api.add_pod(make_pod("elsewhere", "other-node", namespace="ml", containers={"x": "b" * 64}))
    seen = None
    for i in range(2, 12):  # the watch event lands within a moment
        target.get("/work?launches=1")
        seen = _last_span(receiver, target.pid, i)
        if "k8s.pod.name" in seen.resource:
            break
    res = seen.resource
    assert res["k8s.pod.name"] == "infer-7c9d-x2x" and res["k8s.pod.uid"] == pod_uid
    assert res["k8s.namespace.name"] == "ml" and res["k8s.container.name"] == "server"
    assert res["container.id"] == container_id and res["k8s.node.name"] == NODE
    assert res["k8s.deployment.name"] == "infer" and res["k8s.replicaset.name"] == "infer-7c9d"
    assert res["service.name"] == "inference"  # the pod's label: no OTEL_SERVICE_NAME in the target

    api.stop()  # API down: spans keep flowing, with what the cache knows
    n = len([x for x in server_spans(receiver.spans, target.pid) if x.attributes["url.path"] == "/work"])
    target.get("/work?launches=2")
    during = _last_span(receiver, target.pid, n + 1)
    assert during.attributes["gpu.launches"] == 2 and during.resource["k8s.pod.name"] == "infer-7c9d-x2x"

    api.restart()
    assert api.wait_for_watch(30), "the collector did not resume watching after the API came back"
    target.get("/work?launches=3")
    after = _last_span(receiver, target.pid, n + 2)
    assert after.attributes["gpu.launches"] == 3 and after.resource["k8s.namespace.name"] == "ml"
    assert collector.stop() == 0
