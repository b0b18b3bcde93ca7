"""Device identity (otel_gpu/gpu_devices.py) against a FAKE NVIDIA driver procfs and a
FAKE /proc (directories passed as their roots): each ordinal rule, and the unreadable
environment."""
import os

from otel_gpu.cuda_calls import call_id
from otel_gpu.gpu_devices import DeviceIdentities, Identity, gpu_model, read_gpus
from otel_gpu.ratelimit import Stats

H100_A = ("0000:3B:00.0", "NVIDIA H100 80GB HBM3", "GPU-aaaaaaaa-1111-2222-3333-444444444444")
H100_B = ("0000:1a:00.0", "NVIDIA H100 80GB HBM3", "GPU-bbbbbbbb-1111-2222-3333-444444444444")
L4 = ("0000:5e:00.0", "NVIDIA L4", "GPU-cccccccc-1111-2222-3333-444444444444")


def fake_driver(root, *gpus):
    """The driver's information files as its 5xx releases write them."""
    for bus, model, uuid in gpus:
        d = root / "gpus" / bus.lower()
        d.mkdir(parents=True)
        (d / "information").write_text(
            f"Model: \t\t {model}\nIRQ:   \t\t 35\nGPU UUID: \t {uuid}\nVideo BIOS: \t 96.00.5e.00.01\n"
            f"Bus Type: \t PCIe\nDMA Size: \t 52 bits\nBus Location: \t {bus}\nDevice Minor: \t 0\n")
    return str(root)


def fake_proc(root, pid, env: dict):
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items()) + b"PATH=/bin\0")
    return str(root)


def identities(tmp_path, gpus, env, pid=42):
    stats = Stats()
    ids = DeviceIdentities(stats, fake_proc(tmp_path / "proc", pid, env) if env is not None else str(tmp_path / "proc"),
                           fake_driver(tmp_path / "driver", *gpus))
    return ids, stats


def test_driver_procfs_read_in_bus_order(tmp_path):
    root = fake_driver(tmp_path, H100_A, L4, H100_B)
    assert [(g.bus, g.model, g.uuid) for g in read_gpus(root)] == [
        ("0000:1a:00.0", H100_B[1], H100_B[2]), ("0000:3b:00.0", H100_A[1], H100_A[2]), (L4[0], L4[1], L4[2])]
    assert gpu_model(root) == H100_B[1]
    assert read_gpus(str(tmp_path / "no-driver")) == [] and gpu_model(str(tmp_path / "no-driver")) is None


def test_one_gpu_is_certain_whatever_the_order(tmp_path):
    ids, _ = identities(tmp_path, [L4], {})
    assert ids(42, 0) == Identity(L4[2], L4[1])
    assert ids(42, 1) == Identity() and ids(42, None) == Identity()


def test_fastest_first_names_no_gpu_but_a_common_model(tmp_path):
    ids, _ = identities(tmp_path, [H100_A, H100_B], {})
    assert ids(42, 0) == ids(42, 1) == Identity(None, H100_A[1])
    mixed, _ = identities(tmp_path / "m", [H100_A, L4], {"CUDA_VISIBLE_DEVICES": "1"})
    assert mixed(42, 0) == Identity()  # index 1 of an order we do not know: an H100 or the L4


def test_pci_bus_id_order_with_indices(tmp_path):
    ids, _ = identities(tmp_path, [H100_A, H100_B, L4], {"CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                                                          "CUDA_VISIBLE_DEVICES": "2,0,7,1"})
    assert ids(42, 0) == Identity(L4[2], L4[1])          # bus order: 1a, 3b, 5e
    assert ids(42, 1) == Identity(H100_B[2], H100_B[1])
    assert ids(42, 2) == Identity()                      # CUDA stops at the invalid 7


def test_visible_devices_by_uuid_in_any_order(tmp_path):
    ids, _ = identities(tmp_path, [H100_A, H100_B, L4], {"CUDA_VISIBLE_DEVICES": "GPU-cccccccc,GPU-aaaaaaaa-1111"})
    assert ids(42, 0) == Identity(L4[2], L4[1])          # a unique uuid prefix, as CUDA accepts
    assert ids(42, 1) == Identity(H100_A[2], H100_A[1])
    amb, _ = identities(tmp_path / "a", [H100_A, H100_B], {"CUDA_VISIBLE_DEVICES": "GPU-,MIG-x"})
    assert amb(42, 0) == Identity()                      # ambiguous prefix: CUDA stops there


def test_unreadable_environment_is_counted_and_gives_no_uuid(tmp_path):
    ids, stats = identities(tmp_path, [L4], None)          # no /proc/42/environ
    assert ids(42, 0) == Identity(None, L4[1])           # the model: every GPU here is an L4
    assert ids(42, 0) == Identity(None, L4[1])           # read once per process
    assert stats.snapshot().get("device_env_unreadable") == 1
    ids.forget(42)
    assert len(ids) == 0


def test_no_driver_no_identity(tmp_path):
    ids = DeviceIdentities(Stats(), str(tmp_path), str(tmp_path / "none"))
    assert ids(1, 0) == Identity()
    assert not os.path.exists(tmp_path / "1")


def test_server_span_carries_what_is_certain(tmp_path):
    """Through the enrich stage and the span builder: uuid and model on the server span
    of a request whose work ran on a known ordinal; neither when nothing is certain."""
    import random

    from otel_gpu import semconv as sc
    from otel_gpu.clock import BpfClock
    from otel_gpu.export.spans import SpanBuilder
    from otel_gpu.enrich.stage import Enrich
    from otel_gpu.pipeline.model import CallSink, Request, RequestHead  # wherever the parser lives
    from otel_gpu.enrich.resources import ProcessResources
    from otel_gpu.enrich.routes import RouteTemplater

    proc_root = fake_proc(tmp_path / "proc", 7, {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "1"})
    fake_proc(tmp_path / "proc", 8, {})  # fastest-first on two different GPUs: nothing certain
    devices = DeviceIdentities(Stats(), proc_root, fake_driver(tmp_path / "driver", H100_A, L4))
    enrich = Enrich(ProcessResources(proc_root), RouteTemplater(), lambda pid, f: None, devices)
    spans = {}
    for pid in (7, 8):
        r = Request(pid, pid, 3, RequestHead("GET", "/infer", "1.1", {}), 10, 1, 2, CallSink(4), end_ns=20)
        r.busy.extend(0, 10, 20, call_id("cudaLaunchKernel"))
        enrich.process([r])
        spans[pid] = SpanBuilder(BpfClock(), ids=random.Random(1)).build(r)[0].attributes
    assert (spans[7][sc.GPU_DEVICE], spans[7][sc.GPU_DEVICE_UUID], spans[7][sc.GPU_DEVICE_MODEL]) == (0, L4[2], L4[1])
    assert spans[8][sc.GPU_DEVICE] == 0 and sc.GPU_DEVICE_UUID not in spans[8] and sc.GPU_DEVICE_MODEL not in spans[8]


def test_metrics_carry_the_device_labels():
    """The request's launches and cost series carry uuid/model (bounded: the driver's list)."""
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.resources import Resource

    from otel_gpu import semconv as sc
    from otel_gpu.export.metrics import GpuMetrics
    from otel_gpu.pipeline.model import CallSink, Request, RequestHead  # wherever the parser lives
    from tests.unit.pipeline.calls import cuda

    def request(identity):
        r = Request(1, 1, 3, RequestHead("GET", "/x", "1.1", {}), 1_000, 1, 1, CallSink(8), end_ns=2_000, status=200)
        r.sink.add(cuda("cudaLaunchKernel", func=0x10), "thread")
        r.resource, r.route, r.gpu_seconds, r.cost = Resource({sc.SERVICE_NAME: "svc"}), "/x", 0.5, 0.1
        r.device_identity = identity
        return r

    reader = InMemoryMetricReader()
    records = [request(Identity(L4[2], L4[1])), request(Identity(None, H100_A[1])), request(None)]
    metrics = GpuMetrics([reader])
    metrics.costs().process(metrics.process(records))
    points = {m.name: [dict(p.attributes) for p in m.data.data_points]
              for rm in reader.get_metrics_data().resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    for name in ("gpu.cuda.kernel.launch.calls", "otel_gpu.cost.gpu_seconds"):  # OBI's labels on metrics
        got = sorted((a.get(sc.CUDA_DEVICE_UUID, ""), a.get(sc.CUDA_DEVICE_MODEL, "")) for a in points[name])
        assert got == [("", ""), ("", H100_A[1]), (L4[2], L4[1])], name
        assert not any(sc.CUDA_DEVICE_INDEX in a for a in points[name])  # no busy window: no device ordinal
    assert all(sc.CUDA_DEVICE_UUID not in a for a in points["http.server.request.duration"])
