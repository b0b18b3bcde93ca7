"""Related processes (pipeline/groups.py), their /proc reads, and discovery of the HTTP
servers related to a CUDA process, against a fake /proc tree."""
import os

import pytest

from otel_gpu import proc
from otel_gpu.pipeline.groups import ProcessGroups, cgroup_key
from otel_gpu.probes.discovery import Discovery

CONTAINER = "/kubepods.slice/kubepods-pod1.slice/cri-containerd-" + "a" * 64 + ".scope"
V1 = "".join(f"{n}:{c}:/\n" for n, c in ((9, "name=systemd"), (8, "pids"), (1, "cpu")))


def stat_line(pid: int, ppid: int, comm: str = "p") -> str:
    fields = ["S", str(ppid), str(pid), str(pid), "0", "-1", "4194560"] + ["0"] * 45
    return f"{pid} ({comm}) " + " ".join(fields) + "\n"


class Tree:
    """A fake /proc: add(pid, ppid, cgroup text, maps text)."""

    def __init__(self, root):
        self.root = root
        (root / "self").mkdir()

    def add(self, pid, ppid, cgroup="0::/\n", maps=""):
        d = self.root / str(pid)
        d.mkdir()
        (d / "stat").write_text(stat_line(pid, ppid, "x) (y"))
        (d / "cgroup").write_text(cgroup)
        (d / "maps").write_text(maps)
        if maps:  # the library, reached through the process's root
            lib = d / "root" / "usr" / "lib"
            lib.mkdir(parents=True)
            (lib / "libcudart.so.12").write_text("")
        os.symlink("/bin/true", d / "exe")
        return pid

    @property
    def path(self):
        return str(self.root)


CUDA_MAPS = "7f00-7f01 r-xp 0 08:01 12 /usr/lib/libcudart.so.12\n"


@pytest.fixture
def tree(tmp_path):
    return Tree(tmp_path)


def test_proc_ppid_and_cgroup(tree):
    tree.add(10, 7, cgroup="0::" + CONTAINER + "\n" + "bad line\n")
    assert proc.ppid(tree.path, 10) == 7  # comm with ") (" in it does not shift the fields
    assert proc.cgroup(tree.path, 10) == [("", CONTAINER)]
    assert proc.ppid(tree.path, 99) is None and proc.cgroup(tree.path, 99) is None


@pytest.mark.parametrize("text,key", [
    ("0::" + CONTAINER + "\n", "cgroup:" + CONTAINER),
    ("0::/system.slice/vllm.service\n", "cgroup:/system.slice/vllm.service"),
    ("0::/\n", None),                                                   # the root
    ("0::/init.scope\n", None),
    ("0::/user.slice/user-1000.slice/session-3.scope\n", None),         # a login session
    ("0::/user.slice/user-1000.slice/user@1000.service/app.slice/x.scope\n", None),
    (V1 + "4:memory:/job/42\n0::/\n", "cgroup:cpu:/;memory:/job/42;name=systemd:/;pids:/"),  # hybrid, v2 unused
    (V1 + "4:memory:/user.slice/user-0.slice\n", None),
    (V1, None),                                                         # v1, every path the root
    ("", None),
])
def test_cgroup_key(text, key):
    lines = [(c, p) for _, c, p in (line.split(":", 2) for line in text.splitlines())]
    assert cgroup_key(lines) == key


def test_tree_key_follows_the_traced_parents(tree):
    tree.add(1, 0)
    front = tree.add(100, 1)
    worker = tree.add(200, front)
    grandchild = tree.add(300, worker)
    stranger = tree.add(400, 1)
    g = ProcessGroups(tree.path)
    assert g.key(worker) == "tree:200"  # its parent is not traced (yet)
    g.set_traced({worker, grandchild})
    assert g(worker) == "tree:200" and g(grandchild) == "tree:200"
    g.set_traced({front, worker, grandchild})  # the front-end became traced: keys move up
    assert {g(front), g(worker), g(grandchild)} == {"tree:100"}
    assert g(stranger) == "tree:400"
    g.forget([worker])
    assert worker not in g._keys


def test_cgroup_key_wins_and_relatives(tree):
    tree.add(1, 0)
    worker = tree.add(200, 1, cgroup="0::" + CONTAINER + "\n")
    front = tree.add(100, 1, cgroup="0::" + CONTAINER + "\n")
    other = tree.add(300, 1, cgroup="0::/system.slice/other.service\n")
    parent = tree.add(400, 1)
    child = tree.add(500, parent)   # no cgroup of its own: the tree rule
    grandchild = tree.add(600, child)
    g = ProcessGroups(tree.path)
    assert g(worker) == g(front) == "cgroup:" + CONTAINER and g(other) != g(worker)
    assert g.relatives([front, other, parent, grandchild], {worker}) == {front}
    assert g.relatives([front, other, parent, grandchild], {worker, child}) == {front, parent, grandchild}
    g.retain([worker])
    assert set(g._cgroups) == {worker}


def test_discovery_finds_the_servers_related_to_a_cuda_process(tree):
    tree.add(1, 0)
    front = tree.add(100, 1)
    worker = tree.add(200, front, maps=CUDA_MAPS)
    sibling = tree.add(300, front)           # listens; the worker's sibling, not its parent or child
    unrelated = tree.add(400, 1)             # listens, not related
    boxed = tree.add(500, 1, cgroup="0::/system.slice/gpu.service\n", maps=CUDA_MAPS)
    boxed_front = tree.add(600, 1, cgroup="0::/system.slice/gpu.service\n")
    listening = {front, unrelated, boxed_front, boxed, sibling}
    d = Discovery(tree.path, has_static_cudart=lambda p: False, groups=ProcessGroups(tree.path),
                  listens=lambda pid: pid in listening)
    found = d.scan()
    assert found.cuda_pids == {worker, boxed}
    assert found.servers == {front, boxed_front}
    assert found.listening == {boxed}
    filtered = Discovery(tree.path, pid_filter=lambda pid: pid != front, has_static_cudart=lambda p: False,
                         groups=ProcessGroups(tree.path), listens=lambda pid: pid in listening)
    assert filtered.scan().servers == {boxed_front}  # --pid/--exe filters still apply
    plain = Discovery(tree.path, has_static_cudart=lambda p: False)
    assert plain.scan().servers == set()  # without groups: CUDA processes only


def test_a_listener_is_asked_again_only_every_recheck_interval(tree):
    """Asking reads a process's TCP tables and descriptors: a server found listening is
    taken at its word for LISTENING_RECHECK_S; one not listening yet is asked every scan;
    a process gone is forgotten."""
    from otel_gpu.probes import discovery
    tree.add(1, 0)
    front = tree.add(100, 1)
    worker = tree.add(200, front, maps=CUDA_MAPS)
    child = tree.add(300, worker)  # related: the worker's child
    listening, asked, now = {front}, [], [0.0]

    def listens(pid):
        asked.append(pid)
        return pid in listening
    d = Discovery(tree.path, has_static_cudart=lambda p: False, groups=ProcessGroups(tree.path),
                  listens=listens, clock=lambda: now[0])
    assert d.scan().servers == {front}
    assert sorted(asked) == [front, worker, child]
    asked.clear()
    now[0] = discovery.LISTENING_RECHECK_S - 1
    listening.add(child)  # starts listening: seen at the next scan
    assert d.scan().servers == {front, child} and sorted(asked) == [worker, child]
    asked.clear()
    now[0] = discovery.LISTENING_RECHECK_S
    listening.discard(front)  # closed its listener: seen once the interval is over
    assert d.scan().servers == {child} and sorted(asked) == [front, worker]
