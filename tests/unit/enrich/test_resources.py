"""Resources per process from a fake /proc tree (and, for pidfds, the real one)."""
import os
import socket
import subprocess
import sys

import pytest

from otel_gpu import semconv as sc
from otel_gpu.enrich import resources
from otel_gpu.enrich.resources import ProcessResources, service_name_from


@pytest.mark.parametrize("argv,exe,name", [
    (["python3", "app.py"], "/usr/bin/python3.11", "app"),
    (["python3", "/srv/svc/server.py", "--port", "80"], "/usr/bin/python3.11", "server"),
    (["python", "-u", "main.py"], "/usr/bin/python3", "main"),
    (["python", "-m", "pkg.server", "x.py"], "/usr/bin/python3", "pkg.server"),
    (["/venv/bin/python", "/venv/bin/uvicorn", "app:api"], "/usr/bin/python3.12", "uvicorn"),
    (["node", "dist/index.js"], "/usr/local/bin/node", "index"),
    (["java", "-jar", "/opt/app.jar"], "/usr/lib/jvm/bin/java", "app"),
    (["python3"], "/usr/bin/python3", "python3"),          # interactive interpreter
    (["python3", "-i"], "/usr/bin/python3", "python3"),
    (["/opt/triton/bin/tritonserver", "--model-repo=/m"], "/opt/triton/bin/tritonserver", "tritonserver"),
    (["./a.out"], "", "a.out"),                            # exe unreadable: argv[0]
    ([], "/usr/bin/infer", "infer"),
    ([], "", "unknown"),
])
def test_service_name_from(argv, exe, name):
    assert service_name_from(argv, exe) == name


@pytest.mark.parametrize("argv,name", [
    (["python3", "-c", "import app; app.run()"], "python3"),
    (["python3", "-X", "dev", "app.py"], "app"),
])
def test_service_name_from_interpreter_options_with_arguments(argv, name):
    assert service_name_from(argv, "/usr/bin/python3") == name


def fake_proc(root, pid, argv=("python3", "app.py"), env=None, exe="/usr/bin/python3.11",
              comm="python3", starttime=424242):
    d = root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (d / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0"
                                         for k, v in (env or {"PATH": "/bin"}).items()))
    fields = ["S"] + ["0"] * 18 + [str(starttime)] + ["0"] * 30
    (d / "stat").write_bytes(f"{pid} ({comm}) ".encode() + " ".join(fields).encode())
    if exe:
        if os.path.lexists(d / "exe"):
            os.unlink(d / "exe")
        os.symlink(exe, d / "exe")
    return d


def test_resource_from_proc_tree(tmp_path):
    fake_proc(tmp_path, 100, argv=("python3", "/srv/app.py", "--x"),
              env={"PATH": "/bin", "OTEL_SERVICE_NAME": "infer-api",
                   "OTEL_RESOURCE_ATTRIBUTES": "team=ml, deployment.environment=prod", "SECRET": "s"})
    cat = ProcessResources(proc_root=str(tmp_path), base_attributes={"collector": "c1"})
    a = cat.resource(100).attributes
    assert a[sc.SERVICE_NAME] == "infer-api"
    assert a[sc.PROCESS_PID] == 100
    assert a[sc.HOST_NAME] == socket.gethostname()
    assert a[sc.PROCESS_EXECUTABLE_PATH] == "/usr/bin/python3.11"
    assert a[sc.PROCESS_EXECUTABLE_NAME] == "python3.11"
    assert sc.PROCESS_COMMAND_LINE not in a  # opt-in: argv often holds secrets
    assert a["team"] == "ml" and a["deployment.environment"] == "prod" and a["collector"] == "c1"
    assert "s" not in a.values()  # other environment variables are never exported
    assert cat.stats.snapshot() == {}


def test_service_name_falls_back_to_the_script(tmp_path):
    fake_proc(tmp_path, 7, argv=("python3", "serve.py"))
    assert ProcessResources(proc_root=str(tmp_path)).resource(7).attributes[sc.SERVICE_NAME] == "serve"


def test_command_line_only_when_asked(tmp_path):
    fake_proc(tmp_path, 9, argv=("python3", "app.py", "--api-key=s3cret"))
    default = ProcessResources(proc_root=str(tmp_path)).resource(9).attributes
    assert sc.PROCESS_COMMAND_LINE not in default
    assert "s3cret" not in repr(dict(default))
    assert default[sc.PROCESS_EXECUTABLE_NAME] == "python3.11"  # kept by default
    assert default[sc.PROCESS_EXECUTABLE_PATH] == "/usr/bin/python3.11"
    asked = ProcessResources(proc_root=str(tmp_path), export_command_line=True).resource(9).attributes
    assert asked[sc.PROCESS_COMMAND_LINE] == "python3 app.py --api-key=s3cret"


def test_command_line_is_capped(tmp_path):
    fake_proc(tmp_path, 8, argv=("python3", "x.py") + ("a" * 100,) * 30)
    line = ProcessResources(proc_root=str(tmp_path), export_command_line=True).resource(8) \
        .attributes[sc.PROCESS_COMMAND_LINE]
    assert len(line) == 1024 and line.endswith("…")


def test_values_from_the_process_are_sanitised(tmp_path):
    """OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES, argv and exe of another process may
    hold escape sequences or bytes that are not UTF-8."""
    d = tmp_path / "30"
    d.mkdir()
    (d / "cmdline").write_bytes(b"python3\0/srv/\x1b]0;t\x07app.py\0")
    (d / "environ").write_bytes(b"OTEL_SERVICE_NAME=svc\x1b[2J\x9b\xff\0"
                                b"OTEL_RESOURCE_ATTRIBUTES=te\x1bam=m\x07l\0")
    (d / "stat").write_bytes(b"30 (x) S " + b"0 " * 40)
    os.symlink(os.fsdecode(b"/opt/bin/infer\x1b[31m\xfe"), d / "exe")
    a = ProcessResources(proc_root=str(tmp_path), export_command_line=True).resource(30).attributes
    assert a[sc.SERVICE_NAME] == "svc\ufffd[2J\ufffd\ufffd"
    assert a["te\ufffdam"] == "m\ufffdl"
    assert a[sc.PROCESS_EXECUTABLE_PATH] == "/opt/bin/infer\ufffd[31m\ufffd"
    assert a[sc.PROCESS_EXECUTABLE_NAME] == "infer\ufffd[31m\ufffd"
    assert a[sc.PROCESS_COMMAND_LINE] == "python3 /srv/\ufffd]0;t\ufffdapp.py"
    for k, v in a.items():
        for s in (k, str(v)):
            s.encode("utf-8")  # valid UTF-8: no lone surrogates
            assert not any(ord(c) < 0x20 or 0x7f <= ord(c) <= 0x9f for c in s), (k, v)


def test_a_name_from_the_exit_event_is_sanitised(tmp_path):
    a = ProcessResources(proc_root=str(tmp_path)).resource(31, exit_comm="w\x1b[2Jx").attributes
    assert a[sc.SERVICE_NAME] == "w\ufffd[2Jx"


def test_unreadable_process_gives_a_resource_and_a_counted_stat(tmp_path):
    cat = ProcessResources(proc_root=str(tmp_path))
    a = cat.resource(999).attributes  # no such /proc entry
    assert a[sc.SERVICE_NAME] == "unknown_service:pid999"
    assert a[sc.PROCESS_PID] == 999 and sc.HOST_NAME in a
    assert cat.stats.snapshot()["proc_unreadable"] == 1


def test_partly_unreadable_process_keeps_what_was_read(tmp_path):
    d = fake_proc(tmp_path, 5, argv=("python3", "worker.py"))
    (d / "environ").unlink()
    cat = ProcessResources(proc_root=str(tmp_path))
    a = cat.resource(5).attributes
    assert a[sc.SERVICE_NAME] == "worker" and a[sc.PROCESS_EXECUTABLE_NAME] == "python3.11"
    assert cat.stats.snapshot()["proc_unreadable"] == 1


def test_k8s_resolver_fills_in(tmp_path):
    class K8s:
        pods_version = 1

        def attributes_for(self, pid):
            return {sc.K8S_POD_NAME: "infer-0", sc.K8S_NAMESPACE_NAME: "ml"}

        def service_name_for(self, pid):
            return "infer-deploy"

    fake_proc(tmp_path, 11)
    fake_proc(tmp_path, 12, env={"OTEL_SERVICE_NAME": "own"})
    cat = ProcessResources(proc_root=str(tmp_path), k8s=K8s())
    a = cat.resource(11).attributes
    assert (a[sc.SERVICE_NAME], a[sc.K8S_POD_NAME]) == ("infer-deploy", "infer-0")
    assert cat.resource(12).attributes[sc.SERVICE_NAME] == "own"  # the process's own name wins


def test_cached_until_forgotten(tmp_path):
    fake_proc(tmp_path, 20, env={"OTEL_SERVICE_NAME": "first"})
    cat = ProcessResources(proc_root=str(tmp_path))
    cat.seen(20)
    fake_proc(tmp_path, 20, env={"OTEL_SERVICE_NAME": "second"})
    assert cat.resource(20).attributes[sc.SERVICE_NAME] == "first"  # cached
    cat.seen(20)
    assert cat.resource(20).attributes[sc.SERVICE_NAME] == "first"  # seen twice: read once
    cat.forget(20)
    assert cat.resource(20).attributes[sc.SERVICE_NAME] == "second"


def test_process_gone_before_proc_was_read_is_named_from_its_comm(tmp_path):
    cat = ProcessResources(proc_root=str(tmp_path))  # no /proc entry: it exited already
    cat.seen(21)  # too late to read: nothing is built, nothing is logged
    res = cat.resource(21, exit_comm="burst").attributes
    assert res[sc.SERVICE_NAME] == "burst" and res[sc.PROCESS_PID] == 21
    assert "proc_unreadable" not in cat.stats.snapshot()


def test_reused_pid_is_read_again(tmp_path):
    fake_proc(tmp_path, 30, env={"OTEL_SERVICE_NAME": "old"}, starttime=1000)
    cat = ProcessResources(proc_root=str(tmp_path))
    cat.seen(30)
    fake_proc(tmp_path, 30, env={"OTEL_SERVICE_NAME": "new"}, starttime=2000)  # exit event lost
    assert cat.resource(30).attributes[sc.SERVICE_NAME] == "new"


def test_replaced_executable_is_named_without_the_deleted_marker(tmp_path):
    fake_proc(tmp_path, 50, argv=("/srv/bin/infer-server",), exe="/srv/bin/infer-server (deleted)")
    a = ProcessResources(proc_root=str(tmp_path)).resource(50).attributes
    assert (a[sc.PROCESS_EXECUTABLE_NAME], a[sc.SERVICE_NAME]) == ("infer-server", "infer-server")


def test_pod_attributes_are_sanitised(tmp_path):
    class K8s:
        pods_version = 1

        def attributes_for(self, pid):
            return {sc.K8S_POD_NAME: "infer-0\x1b]0;x\x07", sc.K8S_NAMESPACE_NAME: "ml"}

        def service_name_for(self, pid):
            return "dep\x9b1m"

    fake_proc(tmp_path, 40)
    a = ProcessResources(proc_root=str(tmp_path), k8s=K8s()).resource(40).attributes
    assert (a[sc.K8S_POD_NAME], a[sc.SERVICE_NAME]) == ("infer-0\ufffd]0;x\ufffd", "dep\ufffd1m")


def test_a_live_process_is_checked_by_its_pidfd_without_reading_proc(monkeypatch):
    """The real /proc and a real child: while it lived at the batch's look for exits, a
    request's check for a reused pid reads nothing; once it has exited, /proc decides again."""
    probe = resources.proc.pidfd("/proc", os.getpid())
    if probe is None:
        pytest.skip("pidfd_open is not available here (Linux >= 5.3): /proc is read per request")
    os.close(probe)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        cat = ProcessResources(proc_root="/proc")
        cat.seen(child.pid)
        reads = []
        real = resources.proc.start_time
        monkeypatch.setattr(resources.proc, "start_time", lambda root, pid: reads.append(pid) or real(root, pid))
        cat.look_for_exits()
        first = cat.resource(child.pid)
        assert cat.resource(child.pid) is first and reads == []
        child.kill()
        child.wait()
        assert cat.resource(child.pid) is first and reads == []  # as of the last look: alive
        cat.look_for_exits()
        assert cat.resource(child.pid) is first  # gone, not reused: the same resource
        assert reads == [child.pid]
        cat.forget(child.pid)
        assert cat._pidfds == {}
    finally:
        child.kill()
        child.wait()


def test_pidfds_only_for_the_real_proc_and_up_to_their_cap(tmp_path, monkeypatch):
    fake_proc(tmp_path, 40)
    cat = ProcessResources(proc_root=str(tmp_path))
    cat.seen(40)
    assert cat._pidfds == {}  # pid 40 of a fake tree is not the host's pid 40
    monkeypatch.setattr(resources, "MAX_PIDFDS", 1)
    live = ProcessResources(proc_root="/proc")
    live.seen(os.getpid())
    live.seen(os.getppid())
    assert list(live._pidfds) == [os.getpid()]
    live.forget(os.getpid())
