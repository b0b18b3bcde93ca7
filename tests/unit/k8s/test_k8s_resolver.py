"""K8sResolver: fake /proc tree (tmp_path) + FAKE kube-apiserver + the real client."""

import logging

import kubernetes
import pytest

import otel_gpu.k8s.resolver as resolver_module
from otel_gpu import semconv
from otel_gpu.k8s import K8sResolver
from tests.fakes.kube_apiserver import FakeKubeApiServer, make_pod

from k8s_helpers import CONTAINERD_IDS as IDS, eventually, pod_cgroup, write_proc

NODE = "node-a"
UID_A = "0b1c6f2e-5d8a-4c3e-9f10-2a6b7c8d9e0f"
UID_B = "7e6d5c4b-3a29-4180-9f8e-7d6c5b4a3921"


@pytest.fixture
def api():
    with FakeKubeApiServer() as server:
        server.add_replicaset("shop", "web-5d9c7b", "web")
        server.add_pod(make_pod("web-5d9c7b-x1", NODE, namespace="shop", uid=UID_A,
                                containers={"server": IDS[0]}, owner=("ReplicaSet", "web-5d9c7b"),
                                labels={"app.kubernetes.io/name": "storefront", "app": "web"}))
        server.add_pod(make_pod("trainer-0", NODE, namespace="ml", uid=UID_B,
                                containers={"trainer": IDS[1]}, owner=("StatefulSet", "trainer")))
        yield server


def make_resolver(api, proc, **kwargs):
    options = dict(backoff_initial_s=0.05, backoff_max_s=0.2)
    options.update(kwargs)
    return K8sResolver(NODE, kubernetes.client.ApiClient(api.configuration()), str(proc), **options)


@pytest.fixture
def resolver(api, tmp_path):
    with make_resolver(api, tmp_path) as resolver:
        assert resolver.wait_synced(5)
        yield resolver


def test_attributes_of_a_deployment_pod(resolver, tmp_path):
    write_proc(tmp_path, 100, pod_cgroup(UID_A, IDS[0]), start_time=5000)
    assert resolver.attributes_for(100) == {
        semconv.K8S_POD_NAME: "web-5d9c7b-x1",
        semconv.K8S_POD_UID: UID_A,
        semconv.K8S_NAMESPACE_NAME: "shop",
        semconv.K8S_NODE_NAME: NODE,
        semconv.CONTAINER_ID: IDS[0],
        semconv.K8S_CONTAINER_NAME: "server",
        semconv.K8S_REPLICASET_NAME: "web-5d9c7b",
        semconv.K8S_DEPLOYMENT_NAME: "web",
    }
    assert resolver.service_name_for(100) == "storefront"
    assert resolver.stats["resolved"] == 2


def test_statefulset_pod_and_container_name_as_service_name(resolver, tmp_path):
    write_proc(tmp_path, 101, pod_cgroup(UID_B, IDS[1]), start_time=1)
    attributes = resolver.attributes_for(101)
    assert attributes[semconv.K8S_STATEFULSET_NAME] == "trainer"
    assert semconv.K8S_DEPLOYMENT_NAME not in attributes
    assert resolver.service_name_for(101) == "trainer"  # no labels: the container name


def test_container_not_yet_in_pod_status_is_found_by_pod_uid(resolver, tmp_path):
    # Just started: the cgroup exists before the kubelet reports the container's id.
    write_proc(tmp_path, 102, pod_cgroup(UID_A, IDS[5]), start_time=1)
    attributes = resolver.attributes_for(102)
    assert attributes[semconv.K8S_POD_NAME] == "web-5d9c7b-x1"
    assert attributes[semconv.CONTAINER_ID] == IDS[5]
    assert semconv.K8S_CONTAINER_NAME not in attributes


def test_reused_pid_is_reread_and_never_keeps_the_old_pod(resolver, tmp_path):
    write_proc(tmp_path, 200, pod_cgroup(UID_A, IDS[0]), start_time=1000)
    assert resolver.attributes_for(200)[semconv.K8S_POD_NAME] == "web-5d9c7b-x1"
    # Same PID, new process (new start time) in another pod's container.
    write_proc(tmp_path, 200, pod_cgroup(UID_B, IDS[1]), start_time=2000)
    assert resolver.attributes_for(200)[semconv.K8S_POD_NAME] == "trainer-0"
    # Reused again, by a container of a pod the API has not told us about yet.
    write_proc(tmp_path, 200, pod_cgroup("11111111-2222-4333-8444-555555555555", IDS[7]), 3000)
    assert resolver.attributes_for(200) == {}
    # And by a host process.
    write_proc(tmp_path, 200, "0::/system.slice/sshd.service\n", start_time=4000)
    assert resolver.attributes_for(200) == {}
    assert resolver.service_name_for(200) is None


def test_same_process_is_served_from_the_cache(resolver, tmp_path):
    write_proc(tmp_path, 201, pod_cgroup(UID_A, IDS[0]), start_time=7)
    first = resolver.attributes_for(201)
    # A process cannot change pods; if the cgroup file changes under the same start
    # time, the cached answer shows the file was not read again.
    (tmp_path / "201" / "cgroup").write_text(pod_cgroup(UID_B, IDS[1]))
    assert resolver.attributes_for(201) == first


def test_pid_reused_between_the_two_reads_is_not_attributed(resolver, tmp_path, monkeypatch):
    write_proc(tmp_path, 202, pod_cgroup(UID_A, IDS[0]), start_time=1)
    starts = iter([1, 2])
    monkeypatch.setattr(resolver_module, "start_time", lambda _root, _pid: next(starts))
    assert resolver.attributes_for(202) == {}
    assert resolver.stats["pid_raced"] == 1


def test_exited_process_gives_nothing_quietly(resolver, caplog):
    with caplog.at_level(logging.INFO, logger="otel_gpu.k8s"):
        assert resolver.attributes_for(999999) == {}
    assert resolver.stats["proc_gone"] == 1
    assert caplog.records == []


def test_malformed_cgroup_is_counted_every_time_and_logged_once(resolver, tmp_path, caplog):
    write_proc(tmp_path, 300, "this is not a cgroup file\n", start_time=1)
    with caplog.at_level(logging.WARNING, logger="otel_gpu.k8s"):
        for _ in range(3):
            assert resolver.attributes_for(300) == {}
            assert resolver.service_name_for(300) is None
    assert resolver.stats["cgroup_malformed"] == 6
    assert len([r for r in caplog.records if "malformed" in r.getMessage()]) == 1


def test_malformed_stat_is_counted(resolver, tmp_path):
    write_proc(tmp_path, 301, pod_cgroup(UID_A, IDS[0]), start_time=1)
    (tmp_path / "301" / "stat").write_text("301 (truncated) S 1\n")
    assert resolver.attributes_for(301) == {}
    assert resolver.stats["proc_unreadable"] == 1


def test_unreadable_proc_entry_is_counted(resolver, tmp_path):
    write_proc(tmp_path, 302, pod_cgroup(UID_A, IDS[0]), start_time=1)
    (tmp_path / "302" / "cgroup").unlink()
    (tmp_path / "302" / "cgroup").mkdir()  # reading a directory: IsADirectoryError (OSError)
    assert resolver.attributes_for(302) == {}
    assert resolver.stats["proc_unreadable"] == 1


def test_api_down_at_start_then_back(api, tmp_path):
    api.stop()
    write_proc(tmp_path, 400, pod_cgroup(UID_A, IDS[0]), start_time=1)
    with make_resolver(api, tmp_path) as resolver:
        eventually(lambda: resolver.stats.get("api_errors", 0) >= 2)
        assert resolver.attributes_for(400) == {}  # spans flow on, without pod attributes
        assert resolver.stats["pod_unknown"] == 1
        api.restart()
        eventually(lambda: resolver.attributes_for(400).get(semconv.K8S_POD_NAME) == "web-5d9c7b-x1")


# --- from_environment ---------------------------------------------------------------


def test_outside_kubernetes_is_none_with_one_info_line(caplog):
    with caplog.at_level(logging.DEBUG, logger="otel_gpu.k8s"):
        assert K8sResolver.from_environment(environ={"PATH": "/usr/bin"}) is None
    assert [r.levelno for r in caplog.records] == [logging.INFO]


def test_missing_node_name_is_none_with_a_warning(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="otel_gpu.k8s"):
        assert K8sResolver.from_environment(environ={"KUBERNETES_SERVICE_HOST": "10.0.0.1"}) is None
    assert "NODE_NAME" in caplog.text


def test_unloadable_credentials_are_none_with_a_warning(tmp_path, caplog):
    environ = {"KUBECONFIG": str(tmp_path / "missing"), "NODE_NAME": NODE}
    with caplog.at_level(logging.INFO, logger="otel_gpu.k8s"):
        assert K8sResolver.from_environment(environ=environ) is None
    assert "credentials" in caplog.text


def test_kubeconfig_environment_reaches_the_api(api, tmp_path):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(f"""
apiVersion: v1
kind: Config
clusters: [{{name: fake, cluster: {{server: "{api.url}"}}}}]
users: [{{name: me, user: {{token: not-a-secret}}}}]
contexts: [{{name: fake, context: {{cluster: fake, user: me}}}}]
current-context: fake
""")
    write_proc(tmp_path, 500, pod_cgroup(UID_B, IDS[1]), start_time=1)
    environ = {"KUBECONFIG": str(kubeconfig), "NODE_NAME": NODE}
    resolver = K8sResolver.from_environment(proc_root=str(tmp_path), environ=environ)
    try:
        assert resolver.wait_synced(5)
        assert resolver.attributes_for(500)[semconv.K8S_POD_NAME] == "trainer-0"
    finally:
        resolver.stop()


def test_pods_version_moves_when_pods_change(api, resolver):
    before = resolver.pods_version
    api.wait_for_watch()
    api.add_pod(make_pod("new", NODE, containers={"c": IDS[6]}))
    eventually(lambda: resolver.pods_version > before)
    settled = resolver.pods_version
    api.delete_pod("default", "new")
    eventually(lambda: resolver.pods_version > settled)


def test_unexpected_failures_never_escape(resolver, monkeypatch):
    def explode(_pid):
        raise RuntimeError("bug")

    monkeypatch.setattr(resolver, "_container_of", explode)
    assert resolver.attributes_for(1) == {}
    assert resolver.service_name_for(1) is None
    assert resolver.stats["internal_errors"] == 2
