"""Device identity (otel_gpu/gpu_devices.py) against a FAKE NVIDIA driver procfs, a FAKE
amdgpu sysfs (KFD topology) and a FAKE /proc (directories passed as their roots): each
ordinal rule, and the unreadable environment. No NVIDIA or AMD GPU is needed."""
import os

from otel_gpu.cuda_calls import call_id
from otel_gpu.amd_gpus import read_amd_gpus
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


# --- AMD: the KFD topology --------------------------------------------------------------------

# FAKE AMD GPUs (no AMD GPU exists here): (render minor, unique_id (None: the kernel shows
# none), product_name (None: no FRU), KFD name, gfx_target_version).
MI300X_A = (128, 0x4B2F00C1D2E3F405, "AMD Instinct MI300X", "ip discovery", 90402)
MI300X_B = (136, 0x00000000000000AB, "AMD Instinct MI300X", "ip discovery", 90402)
MI250 = (144, 0x1122334455667788, None, "aldebaran", 90010)
NO_FRU = (152, 0, None, "ip discovery", 90402)       # unique_id 0: no uuid; model: the gfx target
OLD_KERNEL = (160, None, None, "vega20", 90006)       # a kernel without unique_id
CPU = None


def uuid_of(gpu):
    return f"GPU-{gpu[1]:016x}"


def fake_sysfs(root, *nodes):
    """The KFD topology as the amdgpu driver writes it (kfd_topology.c: gpu_id, name,
    properties "key value" lines), a CPU node for each None, and the FRU's product_name
    on the render node's device where a board has one."""
    base = root / "class" / "kfd" / "kfd" / "topology" / "nodes"
    for n, gpu in enumerate(nodes):
        d = base / str(n)
        d.mkdir(parents=True)
        if gpu is None:
            (d / "gpu_id").write_text("0\n")
            (d / "name").write_text("\n")
            (d / "properties").write_text("cpu_cores_count 96\nsimd_count 0\nmem_banks_count 1\nvendor_id 0\n"
                                          "device_id 0\nlocation_id 0\ndomain 0\ndrm_render_minor 0\n"
                                          "hive_id 0\nmax_engine_clk_ccompute 3700\n")
            continue
        minor, unique_id, product, name, gfx = gpu
        (d / "gpu_id").write_text(f"{40000 + n}\n")
        (d / "name").write_text(f"{name}\n")
        props = (f"cpu_cores_count 0\nsimd_count 1216\ngfx_target_version {gfx}\nvendor_id 4098\n"
                 f"device_id 29857\nlocation_id {0x0c00 + n}\ndomain 0\ndrm_render_minor {minor}\n"
                 f"hive_id 0\nfw_version 151\ncapability 746332800\nsdma_fw_version 19\n")
        if unique_id is not None:
            props += f"unique_id {unique_id}\n"
        (d / "properties").write_text(props + "num_xcc 8\nmax_engine_clk_ccompute 3700\n")
        if product:
            dev = root / "class" / "drm" / f"renderD{minor}" / "device"
            dev.mkdir(parents=True)
            (dev / "product_name").write_text(f"{product}\n")
    return str(root)


def fake_dev(proc_root, pid, *minors):
    """The render nodes the process's own root shows in /dev/dri (a container's: its GPUs')."""
    dri = proc_root / str(pid) / "root" / "dev" / "dri"
    dri.mkdir(parents=True)
    for m in minors:
        (dri / f"renderD{m}").write_text("")


def hip(tmp_path, gpus, env, minors=None, pid=42):
    """DeviceIdentities on a host with only the FAKE AMD GPUs `gpus` (None: a CPU node);
    the process shows the render nodes `minors` (None: every GPU's)."""
    stats = Stats()
    proc_root = tmp_path / "proc"
    if env is not None:
        fake_proc(proc_root, pid, env)
        fake_dev(proc_root, pid, *(minors if minors is not None else [g[0] for g in gpus if g]))
    ids = DeviceIdentities(stats, str(proc_root), str(tmp_path / "no-nvidia"), fake_sysfs(tmp_path / "sys", *gpus))
    return ids, stats


def test_kfd_gpu_nodes_read_in_node_order_cpu_nodes_skipped(tmp_path):
    nodes = [CPU, CPU] + [(128 + 8 * i, i + 1, None, "ip discovery", 90402) for i in range(9)]  # nodes 2..10
    gpus = read_amd_gpus(fake_sysfs(tmp_path, *nodes))
    assert [g.node for g in gpus] == list(range(2, 11))           # 10 after 9, not after 1
    assert [g.render_minor for g in gpus] == [128 + 8 * i for i in range(9)]
    assert gpus[0].uuid == "GPU-0000000000000001" and gpus[0].gfx == 90402
    assert read_amd_gpus(str(tmp_path / "no-kfd")) == []


def test_amd_model_and_uuid_only_where_the_driver_gives_them(tmp_path):
    gpus = read_amd_gpus(fake_sysfs(tmp_path, CPU, MI300X_A, MI300X_B, MI250, NO_FRU, OLD_KERNEL))
    assert [(g.model, g.uuid) for g in gpus] == [
        ("AMD Instinct MI300X", "GPU-4b2f00c1d2e3f405"),   # the FRU's product_name; 16 lowercase hex digits
        ("AMD Instinct MI300X", "GPU-00000000000000ab"),   # leading zeros kept
        ("aldebaran", "GPU-1122334455667788"),              # no FRU: the KFD name
        ("gfx942", None),                                   # "ip discovery" names no model; unique_id 0
        ("vega20", None)]                                   # no unique_id line: no uuid


def test_gpu_model_falls_back_to_the_first_amd_gpu(tmp_path):
    sysfs = fake_sysfs(tmp_path / "sys", CPU, MI250, MI300X_A)
    assert gpu_model(str(tmp_path / "no-nvidia"), sysfs) == "aldebaran"
    assert gpu_model(fake_driver(tmp_path / "driver", L4), sysfs) == L4[1]  # an NVIDIA GPU listed first
    assert gpu_model(str(tmp_path / "no-nvidia"), str(tmp_path / "no-sys")) is None


def test_hip_ordinals_in_node_order(tmp_path):
    ids, _ = hip(tmp_path, [CPU, MI300X_A, CPU, MI300X_B], {})
    assert ids(42, 0, "hip") == Identity(uuid_of(MI300X_A), "AMD Instinct MI300X")
    assert ids(42, 1, "hip") == Identity(uuid_of(MI300X_B), "AMD Instinct MI300X")
    assert ids(42, 2, "hip") == Identity() and ids(42, None, "hip") == Identity()


def test_hip_visible_devices_selects_and_reorders(tmp_path):
    four = [CPU, MI300X_A, MI300X_B, (130, 3, None, "ip discovery", 90402), (131, 4, None, "ip discovery", 90402)]
    ids, _ = hip(tmp_path, four, {"HIP_VISIBLE_DEVICES": "2,0,0,9,1"})
    assert [ids(42, i, "hip").uuid for i in range(3)] == ["GPU-0000000000000003", uuid_of(MI300X_A), None]
    # (a repeat skipped; HIP stops at the invalid 9)
    cuda_env, _ = hip(tmp_path / "c", four, {"HIP_VISIBLE_DEVICES": "", "CUDA_VISIBLE_DEVICES": "1"})
    assert cuda_env(42, 0, "hip").uuid == uuid_of(MI300X_B)            # HIP honours CUDA_VISIBLE_DEVICES
    both, _ = hip(tmp_path / "r", four, {"ROCR_VISIBLE_DEVICES": "3, gpu-4b2f00c1", "HIP_VISIBLE_DEVICES": "1"})
    assert both(42, 0, "hip").uuid == uuid_of(MI300X_A)                # HIP's index 1 of ROCr's [3, A]
    by_uuid, _ = hip(tmp_path / "u", four, {"HIP_VISIBLE_DEVICES": "1,GPU-4b2f00c1d2e3f405,0"})
    assert by_uuid(42, 0, "hip").uuid == uuid_of(MI300X_B)
    assert by_uuid(42, 1, "hip") == Identity()   # a uuid entry: HIP >= 6.2 reads it, older ones stop there
    hex_index, _ = hip(tmp_path / "h", four, {"ROCR_VISIBLE_DEVICES": "0x1,1"})
    assert hex_index(42, 0, "hip").uuid == uuid_of(MI300X_B)          # ROCr reads indices as C's strtol
    assert hex_index(42, 1, "hip") == Identity()                      # and stops at a repeat
    none, _ = hip(tmp_path / "n", four, {"ROCR_VISIBLE_DEVICES": ""})
    assert none(42, 0, "hip") == Identity()      # set but empty: ROCr shows no GPU


def test_hip_counts_only_the_render_nodes_the_process_sees(tmp_path):
    ids, _ = hip(tmp_path, [CPU, MI300X_A, MI300X_B], {}, minors=[MI300X_B[0]])  # a container given GPU B
    assert ids(42, 0, "hip") == Identity(uuid_of(MI300X_B), "AMD Instinct MI300X")
    assert ids(42, 1, "hip") == Identity()


def test_hip_says_no_uuid_where_ordinals_may_shift(tmp_path):
    mixed, _ = hip(tmp_path, [CPU, MI300X_A, MI250], {})
    assert mixed(42, 0, "hip") == mixed(42, 1, "hip") == Identity()  # two ISAs: ROCm may leave one out
    narrowed, _ = hip(tmp_path / "n", [CPU, MI300X_A, MI250], {"ROCR_VISIBLE_DEVICES": "1"})
    assert narrowed(42, 0, "hip") == Identity(uuid_of(MI250), "aldebaran")  # ROCr leaves one ISA
    stats = Stats()
    fake_proc(tmp_path / "p", 42, {})  # its /dev cannot be read
    unknown = DeviceIdentities(stats, str(tmp_path / "p"), str(tmp_path / "x"),
                               fake_sysfs(tmp_path / "s", CPU, MI300X_A, MI300X_B))
    assert unknown(42, 0, "hip") == Identity(None, "AMD Instinct MI300X")
    assert stats.snapshot().get("device_dri_unreadable") == 1


def test_hip_unreadable_environment_and_forget(tmp_path):
    ids, stats = hip(tmp_path, [CPU, MI300X_A, MI300X_B], None)
    assert ids(42, 1, "hip") == Identity(None, "AMD Instinct MI300X")
    assert ids(42, 1, "cuda") == Identity()       # no NVIDIA GPU: a CUDA ordinal names none of these
    assert stats.snapshot().get("device_env_unreadable") == 1
    assert len(ids) == 1
    ids.forget(42)
    assert len(ids) == 0


def test_hip_request_span_carries_the_amd_gpu(tmp_path):
    """Through the enrich stage and the span builder: a HIP request's ordinal names the AMD
    GPU; a CUDA request's on the same (AMD only) host names none."""
    import random

    from otel_gpu import semconv as sc
    from otel_gpu.clock import BpfClock
    from otel_gpu.enrich.resources import ProcessResources
    from otel_gpu.enrich.routes import RouteTemplater
    from otel_gpu.enrich.stage import Enrich
    from otel_gpu.export.spans import SpanBuilder
    from otel_gpu.pipeline.model import CallSink, Request, RequestHead

    proc_root = tmp_path / "proc"
    fake_proc(proc_root, 7, {"HIP_VISIBLE_DEVICES": "1"})
    fake_dev(proc_root, 7, MI300X_A[0], MI300X_B[0])
    devices = DeviceIdentities(Stats(), str(proc_root), str(tmp_path / "no-nvidia"),
                               fake_sysfs(tmp_path / "sys", CPU, MI300X_A, MI300X_B))
    enrich = Enrich(ProcessResources(str(proc_root)), RouteTemplater(), lambda pid, f: None, devices)
    spans = {}
    for launch in ("hipLaunchKernel", "cudaLaunchKernel"):
        r = Request(7, 7, 3, RequestHead("GET", "/infer", "1.1", {}), 10, 1, 2, CallSink(4), end_ns=20)
        r.busy.extend(0, 10, 20, call_id(launch))
        enrich.process([r])
        spans[launch] = SpanBuilder(BpfClock(), ids=random.Random(1)).build(r)[0].attributes
    hip_span, cuda_span = spans["hipLaunchKernel"], spans["cudaLaunchKernel"]
    assert (hip_span[sc.GPU_DEVICE], hip_span[sc.GPU_DEVICE_UUID], hip_span[sc.GPU_DEVICE_MODEL]) == (
        0, uuid_of(MI300X_B), "AMD Instinct MI300X")
    assert cuda_span[sc.GPU_DEVICE] == 0 and sc.GPU_DEVICE_UUID not in cuda_span and sc.GPU_DEVICE_MODEL not in cuda_span
