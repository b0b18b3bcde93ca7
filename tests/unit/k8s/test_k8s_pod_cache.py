"""PodCache against a FAKE kube-apiserver, driven through the real `kubernetes` client."""

import time

import kubernetes
import pytest

from otel_gpu.k8s.pod_cache import PodCache
from tests.fakes.kube_apiserver import FakeKubeApiServer, make_pod

from k8s_helpers import CONTAINERD_IDS as IDS, eventually

NODE = "node-a"


@pytest.fixture
def api():
    with FakeKubeApiServer() as server:
        yield server


def start_cache(api, **kwargs):
    options = dict(resync_s=30, backoff_initial_s=0.05, backoff_max_s=0.4)
    options.update(kwargs)
    cache = PodCache(kubernetes.client.ApiClient(api.configuration()), NODE, **options).start()
    assert cache.wait_synced(5)
    return cache


@pytest.fixture
def cache(api):
    cache = start_cache(api)
    yield cache
    cache.stop()


def test_initial_list_holds_only_this_nodes_pods(api):
    api.add_pod(make_pod("mine", NODE, containers={"app": IDS[0]}))
    api.add_pod(make_pod("theirs", "node-b", containers={"app": IDS[1]}))
    cache = start_cache(api)
    try:
        assert [p.name for p in cache.pods()] == ["mine"]
        assert cache.by_container(IDS[0]).name == "mine"
        assert cache.by_container(IDS[1]) is None
    finally:
        cache.stop()


def test_every_pod_request_carries_the_node_field_selector(api, cache):
    api.wait_for_watch()
    pod_requests = [q for path, q in api.requests if path == "/api/v1/pods"]
    assert len(pod_requests) >= 2  # one list, one watch
    assert all(q.get("fieldSelector") == f"spec.nodeName={NODE}" for q in pod_requests)


def test_fake_applies_the_field_selector_to_lists():
    # The fake itself must filter, or the selector tests above would prove nothing.
    with FakeKubeApiServer() as server:
        server.add_pod(make_pod("a", NODE))
        server.add_pod(make_pod("b", "node-b"))
        core = kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(server.configuration()))
        names = lambda **kw: sorted(p.metadata.name for p in core.list_pod_for_all_namespaces(**kw).items)
        assert names(field_selector=f"spec.nodeName={NODE}") == ["a"]
        assert names() == ["a", "b"]


def test_other_nodes_watch_events_are_not_delivered(api, cache):
    api.wait_for_watch()
    api.add_pod(make_pod("theirs", "node-b", containers={"app": IDS[1]}))
    api.add_pod(make_pod("mine", NODE, containers={"app": IDS[0]}))
    eventually(lambda: cache.by_container(IDS[0]))
    assert cache.by_container(IDS[1]) is None
    assert cache.stats["watch_events"] == 1  # the fake never sent node-b's event


def test_pod_added_by_watch_event_is_picked_up_without_a_relist(api, cache):
    api.wait_for_watch()
    api.add_pod(make_pod("late", NODE, containers={"app": IDS[2]}, labels={"app": "late"}))
    pod = eventually(lambda: cache.by_container(IDS[2]))
    assert (pod.name, pod.labels["app"]) == ("late", "late")
    assert cache.by_uid(pod.uid) is pod
    assert cache.stats["relists"] == 1


def test_deleted_pod_is_forgotten(api, cache):
    api.wait_for_watch()
    api.add_pod(make_pod("gone", NODE, containers={"app": IDS[3]}))
    uid = eventually(lambda: cache.by_container(IDS[3])).uid
    api.delete_pod("default", "gone")
    eventually(lambda: cache.by_container(IDS[3]) is None and cache.by_uid(uid) is None)


def test_restarted_container_moves_to_its_new_id(api, cache):
    api.wait_for_watch()
    pod = api.add_pod(make_pod("restarts", NODE, containers={"app": IDS[4]}))
    eventually(lambda: cache.by_container(IDS[4]))
    pod["status"]["containerStatuses"][0]["containerID"] = f"containerd://{IDS[5]}"
    api.update_pod(pod)
    eventually(lambda: cache.by_container(IDS[5]))
    assert cache.by_container(IDS[4]) is None


def test_expired_watch_410_leads_to_a_relist(api, cache):
    api.wait_for_watch()
    # Stored without a watch event, as if compaction had eaten it: only a list shows it.
    api.add_pod(make_pod("hidden", NODE, containers={"app": IDS[6]}), emit=False)
    time.sleep(0.2)
    assert cache.by_container(IDS[6]) is None
    api.expire_watches()
    eventually(lambda: cache.by_container(IDS[6]))
    assert cache.stats["watch_expired"] >= 1
    assert api.count(watch=False) >= 2


def test_api_down_keeps_known_pods_backs_off_and_recovers(api):
    api.add_pod(make_pod("known", NODE, containers={"app": IDS[0]}))
    cache = start_cache(api)
    try:
        api.wait_for_watch()
        api.stop()
        api.add_pod(make_pod("while-down", NODE, containers={"app": IDS[1]}))
        time.sleep(1.2)
        errors = cache.stats.get("api_errors", 0)
        # Back-off 0.05 s doubling to 0.4 s allows about 6 tries in 1.2 s; a busy loop,
        # hundreds.
        assert 1 <= errors <= 8
        assert cache.by_container(IDS[0]).name == "known"  # stale but safe to serve
        assert cache.by_container(IDS[1]) is None
        api.restart()
        eventually(lambda: cache.by_container(IDS[1]))
        assert cache.by_container(IDS[0]).name == "known"
    finally:
        cache.stop()


def test_watch_ends_after_resync_interval_and_relists(api):
    cache = start_cache(api, resync_s=1)
    try:
        eventually(lambda: api.count(watch=False) >= 3, timeout=6)
        watches = [q for path, q in api.requests if path == "/api/v1/pods" and q.get("watch") == "true"]
        assert watches[0]["timeoutSeconds"] == "1"
        assert cache.stats.get("api_errors", 0) == 0
    finally:
        cache.stop()


def test_owner_workloads(api):
    api.add_replicaset("default", "web-5d9c7b", "web")
    api.add_replicaset("default", "bare-rs", None)
    owners = {
        "web-1": ("ReplicaSet", "web-5d9c7b"),
        "web-2": ("ReplicaSet", "web-5d9c7b"),
        "bare": ("ReplicaSet", "bare-rs"),
        "orphan": ("ReplicaSet", "deleted-rs"),
        "db-0": ("StatefulSet", "db"),
        "agent": ("DaemonSet", "agent"),
        "train": ("Job", "train"),
    }
    for name, owner in owners.items():
        api.add_pod(make_pod(name, NODE, owner=owner))
    api.add_pod(make_pod("naked", NODE))
    cache = start_cache(api)
    try:
        got = {p.name: p.owners for p in cache.pods()}
        assert got == {
            "web-1": (("ReplicaSet", "web-5d9c7b"), ("Deployment", "web")),
            "web-2": (("ReplicaSet", "web-5d9c7b"), ("Deployment", "web")),
            "bare": (("ReplicaSet", "bare-rs"),),
            "orphan": (("ReplicaSet", "deleted-rs"),),
            "db-0": (("StatefulSet", "db"),),
            "agent": (("DaemonSet", "agent"),),
            "train": (("Job", "train"),),
            "naked": (),
        }
        rs_gets = [p for p, _ in api.requests if p.endswith("/replicasets/web-5d9c7b")]
        assert len(rs_gets) == 1  # cached for the second pod
    finally:
        cache.stop()


def test_static_pod_found_by_its_mirror_hash(api):
    mirror = "6b1f5b0e0f1b1f2e3d4c5b6a79887766"
    api.add_pod(make_pod("etcd-node-a", NODE, annotations={"kubernetes.io/config.mirror": mirror}))
    cache = start_cache(api)
    try:
        assert cache.by_uid(mirror).name == "etcd-node-a"
    finally:
        cache.stop()


def test_stop_interrupts_a_quiet_watch_promptly(api, cache):
    api.wait_for_watch()
    started = time.monotonic()
    cache.stop()
    assert time.monotonic() - started < 1.0
    assert not cache._thread.is_alive()


def test_node_name_is_required(api):
    with pytest.raises(ValueError):
        PodCache(kubernetes.client.ApiClient(api.configuration()), "")
