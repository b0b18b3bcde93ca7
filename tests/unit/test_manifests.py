"""k8s/ and collector-config/: Kubernetes objects against the official JSON schemas
(kubernetes-validate, pinned in pyproject.toml) and
the ports, names and paths that tie the pieces together."""

import copy
import json
import re
import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
COLLECTOR = ROOT / "collector-config"
NAMESPACE = "otel-gpu"
# Oldest Kubernetes the manifests support (container appArmorProfile is 1.30+) and the
# newest the pinned schemas know.
VERSIONS = ["1.30", kubernetes_validate.utils.latest_version()]


def load_all(path):
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def manifest_files():
    return sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")


OBJECTS = [(p.name, doc) for p in manifest_files() for doc in load_all(p)]


def find(kind, name):
    matches = [doc for _, doc in OBJECTS if doc["kind"] == kind and doc["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind}/{name}: {len(matches)} found"
    return matches[0]


def container(workload):
    return workload["spec"]["template"]["spec"]["containers"][0]


def service_port(service, port):
    return next(p for p in service["spec"]["ports"] if p["port"] == port)


def container_port(workload, name_or_number):
    for p in container(workload)["ports"]:
        if name_or_number in (p["name"], p["containerPort"]):
            return p["containerPort"]
    raise AssertionError(f"no container port {name_or_number}")


def endpoint_port(endpoint):
    return int(endpoint.rsplit(":", 1)[1])


def merge(base, overlay):
    """The collector's merge of several --config files: maps merge, lists replace."""
    out = copy.deepcopy(base)
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


GATEWAY = yaml.safe_load((COLLECTOR / "gateway.yaml").read_text())
VARIANTS = {"gateway.yaml": GATEWAY}
for overlay in sorted(COLLECTOR.glob("gateway-*.yaml")):
    VARIANTS[f"gateway.yaml + {overlay.name}"] = merge(GATEWAY, yaml.safe_load(overlay.read_text()))


# --- Kubernetes schemas ---------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("doc", [d for _, d in OBJECTS], ids=[f"{f}:{d['kind']}" for f, d in OBJECTS])
def test_object_validates_against_kubernetes_schema(doc, version):
    # strict: unknown fields (typos) fail too, as `kubectl apply --validate=strict` would.
    kubernetes_validate.validate(doc, version, strict=True)


def test_strict_schema_rejects_a_misspelt_field():
    daemonset = copy.deepcopy(find("DaemonSet", "otel-gpu"))
    daemonset["spec"]["template"]["spec"]["hostPid"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(daemonset, VERSIONS[0], strict=True)


# --- kustomize layout -------------------------------------------------------------------


def test_kustomization_lists_every_manifest_and_they_exist():
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert kustomization["namespace"] == NAMESPACE
    resources = kustomization["resources"]
    assert sorted(r for r in resources if not r.startswith("..")) == [p.name for p in manifest_files()]
    for resource in resources:
        assert (K8S / resource).exists(), resource
    assert "../collector-config" in resources


def generator_files(kustomization_dir):
    kustomization = yaml.safe_load((kustomization_dir / "kustomization.yaml").read_text())
    files = {}
    for generator in kustomization.get("configMapGenerator", []):
        for entry in generator["files"]:
            key, _, source = entry.rpartition("=")
            files.setdefault(generator["name"], {})[key or Path(source).name] = kustomization_dir / source
    return files


def test_generated_configmaps_use_every_config_file_and_only_existing_ones():
    k8s_files = generator_files(K8S)
    collector_files = generator_files(COLLECTOR)
    for files in list(k8s_files.values()) + list(collector_files.values()):
        for source in files.values():
            assert source.resolve().is_relative_to(source.parent.resolve())  # kustomize's rule
            assert source.is_file(), source
    used = {s.resolve() for files in k8s_files.values() for s in files.values()}
    assert used == {p.resolve() for folder in ("config", "grafana") for p in (K8S / folder).glob("*")}
    assert set(collector_files["otel-gateway-config"]) == {p.name for p in COLLECTOR.glob("gateway*.yaml")}


def config_mount(workload, configmap, flag):
    """The config files a workload's args point at, as keys of its mounted ConfigMap."""
    spec = workload["spec"]["template"]["spec"]
    volume = next(v["name"] for v in spec["volumes"] if v.get("configMap", {}).get("name") == configmap)
    mount = next(m["mountPath"] for m in container(workload)["volumeMounts"] if m["name"] == volume)
    paths = [a.split("=", 1)[1] for a in container(workload)["args"] if a.startswith(flag + "=")]
    assert paths, f"{workload['metadata']['name']} has no {flag}"
    for path in paths:
        assert path.startswith(mount + "/"), path
    return [path[len(mount) + 1 :] for path in paths]


def test_workloads_read_config_files_their_configmaps_hold():
    gateway_keys = config_mount(find("Deployment", "otel-gateway"), "otel-gateway-config", "--config")
    assert set(gateway_keys) <= set(generator_files(COLLECTOR)["otel-gateway-config"])
    tempo_keys = config_mount(find("Deployment", "tempo"), "tempo-config", "-config.file")
    assert set(tempo_keys) <= set(generator_files(K8S)["tempo-config"])
    prometheus_keys = config_mount(find("Deployment", "prometheus"), "prometheus-config", "--config.file")
    assert set(prometheus_keys) <= set(generator_files(K8S)["prometheus-config"])


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (with kustomize) not installed")
def test_kustomize_build_is_valid_and_wires_generated_names():
    out = subprocess.run(["kubectl", "kustomize", str(K8S)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    for doc in docs:
        kubernetes_validate.validate(doc, VERSIONS[-1], strict=True)
        if doc["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding"):
            assert doc["metadata"]["namespace"] == NAMESPACE, doc["metadata"]["name"]
    configmaps = {d["metadata"]["name"] for d in docs if d["kind"] == "ConfigMap"}
    referenced = {v["configMap"]["name"] for d in docs if d["kind"] == "Deployment"
                  for v in d["spec"]["template"]["spec"]["volumes"] if "configMap" in v}
    assert referenced and referenced <= configmaps  # hashed names rewritten in the Deployments
    generated = len(generator_files(K8S)) + len(generator_files(COLLECTOR))
    assert len(docs) == len(OBJECTS) + generated  # every manifest plus the generated ConfigMaps


# --- RBAC and the DaemonSet -------------------------------------------------------------


def test_rbac_grants_only_what_the_collector_reads():
    role = find("ClusterRole", "otel-gpu")
    granted = {(group, resource, verb) for rule in role["rules"] for group in rule["apiGroups"]
               for resource in rule["resources"] for verb in rule["verbs"]}
    assert granted == {("", "pods", "get"), ("", "pods", "list"), ("", "pods", "watch"),
                       ("apps", "replicasets", "get")}
    binding = find("ClusterRoleBinding", "otel-gpu")
    assert binding["roleRef"]["name"] == "otel-gpu"
    subject = binding["subjects"][0]
    assert (subject["kind"], subject["namespace"]) == ("ServiceAccount", NAMESPACE)
    daemonset = find("DaemonSet", "otel-gpu")
    assert daemonset["spec"]["template"]["spec"]["serviceAccountName"] == subject["name"]
    assert find("ServiceAccount", subject["name"])


def env_of(workload):
    return {e["name"]: e for e in container(workload)["env"]}


def test_daemonset_security_and_host_access():
    daemonset = find("DaemonSet", "otel-gpu")
    pod = daemonset["spec"]["template"]["spec"]
    security = container(daemonset)["securityContext"]
    assert pod["hostPID"] is True
    assert "privileged" not in security  # only the commented-out fallback
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"]["drop"] == ["ALL"]
    # The smallest set measured to work; nothing that grants admin or resource limits.
    assert set(security["capabilities"]["add"]) == {"BPF", "PERFMON", "SYS_PTRACE", "DAC_READ_SEARCH"}
    assert security["allowPrivilegeEscalation"] is False
    mounts = {m["mountPath"]: m for m in container(daemonset)["volumeMounts"]}
    # /run/otel-gpu: the state file `otel-gpu status` reads (the default --status-file)
    # /var/cache/otel-gpu: the compiled BPF program (the default --bpf-cache), kept across restarts
    for path in ("/sys/kernel/tracing", "/sys/kernel/debug", "/sys/fs/cgroup", "/lib/modules", "/usr/src",
                 "/run/otel-gpu", "/var/cache/otel-gpu"):
        volume = next(v for v in pod["volumes"] if v["name"] == mounts[path]["name"])
        assert volume["hostPath"]["path"] == path
    for path in ("/sys/fs/cgroup", "/lib/modules", "/usr/src"):
        assert mounts[path]["readOnly"] is True
    # GPU nodes of either vendor: one term each, ORed
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert [t["matchExpressions"] for t in terms] == [
        [{"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}],
        [{"key": "feature.node.kubernetes.io/amd-gpu", "operator": "In", "values": ["true"]}]]
    assert "nodeSelector" not in pod
    for vendor in ("nvidia.com/gpu", "amd.com/gpu"):
        assert {"key": vendor, "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]


def test_legacy_kernel_overlay_adds_only_the_documented_capabilities():
    overlay = yaml.safe_load((ROOT / "k8s/overlays/legacy-kernels/kustomization.yaml").read_text())
    assert overlay["resources"] == ["../.."]
    (patch,) = overlay["patches"]
    assert patch["target"] == {"kind": "DaemonSet", "name": "otel-gpu"}
    ops = yaml.safe_load(patch["patch"])
    add = next(op for op in ops if op["path"].endswith("/capabilities/add"))
    assert set(add["value"]) == {"BPF", "PERFMON", "SYS_PTRACE", "DAC_READ_SEARCH", "SYS_RESOURCE", "SYS_ADMIN"}
    # The API refuses allowPrivilegeEscalation=false together with SYS_ADMIN.
    assert {"op": "remove", "path": "/spec/template/spec/containers/0/securityContext/allowPrivilegeEscalation"} in ops


def test_daemonset_node_name_health_file_and_resources():
    daemonset = find("DaemonSet", "otel-gpu")
    env = env_of(daemonset)
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    health = env["OTEL_GPU_HEALTH_FILE"]["value"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container(daemonset)[probe]["exec"]["command"] == ["test", "-f", health]
    # The health file must land on a writable volume, the root filesystem being read-only.
    pod = daemonset["spec"]["template"]["spec"]
    writable = [m["mountPath"] for m in container(daemonset)["volumeMounts"]
                if "emptyDir" in next(v for v in pod["volumes"] if v["name"] == m["name"])]
    assert any(health.startswith(path + "/") for path in writable)
    assert container(daemonset)["resources"] == {
        "requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"cpu": "1", "memory": "512Mi"}}
    assert container(daemonset)["command"] + container(daemonset)["args"] == ["otel-gpu", "run", "--no-console"]


# --- ports and names that must line up ---------------------------------------------------


def test_daemonset_endpoint_reaches_the_gateway_otlp_grpc_receiver():
    url = urlsplit(env_of(find("DaemonSet", "otel-gpu"))["OTEL_EXPORTER_OTLP_ENDPOINT"]["value"])
    service_name, namespace = url.hostname.split(".")[:2]
    assert (url.hostname, namespace) == (f"{service_name}.{NAMESPACE}.svc", NAMESPACE)
    service = find("Service", service_name)
    gateway = find("Deployment", service_name)
    port = service_port(service, url.port)
    receiver = GATEWAY["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"]
    assert container_port(gateway, port["targetPort"]) == endpoint_port(receiver)
    assert env_of(find("DaemonSet", "otel-gpu"))["OTEL_EXPORTER_OTLP_PROTOCOL"]["value"] == "grpc"


def test_gateway_service_exposes_otlp_http_and_prometheus_ports():
    service = find("Service", "otel-gateway")
    gateway = find("Deployment", "otel-gateway")
    exposed = {container_port(gateway, p["targetPort"]) for p in service["spec"]["ports"]}
    http = GATEWAY["receivers"]["otlp"]["protocols"]["http"]["endpoint"]
    prometheus = GATEWAY["exporters"]["prometheus"]["endpoint"]
    assert {endpoint_port(http), endpoint_port(prometheus)} <= exposed
    assert {p["port"] for p in service["spec"]["ports"]} == {4317, 4318, 8889}
    health = endpoint_port(GATEWAY["extensions"]["health_check"]["endpoint"])
    for probe in ("livenessProbe", "readinessProbe"):
        assert container_port(gateway, container(gateway)[probe]["httpGet"]["port"]) == health


def test_gateway_exporters_reach_tempo_and_jaeger_on_otlp_grpc():
    tempo_config = yaml.safe_load((K8S / "config" / "tempo.yaml").read_text())
    tempo_grpc = endpoint_port(tempo_config["distributor"]["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"])
    host, port = GATEWAY["exporters"]["otlp/tempo"]["endpoint"].split(":")
    service = find("Service", host)
    assert container_port(find("Deployment", host), service_port(service, int(port))["targetPort"]) == tempo_grpc
    assert GATEWAY["exporters"]["otlp/jaeger"]["endpoint"] == "jaeger-collector:4317"
    for exporter in ("otlp/tempo", "otlp/jaeger"):
        assert GATEWAY["exporters"][exporter]["tls"]["insecure"] is True


# --- the image ------------------------------------------------------------------------


def test_dockerfile_builds_from_debian_with_bcc_and_copies_what_exists():
    dockerfile = (K8S / "Dockerfile").read_text()
    assert re.search(r"^FROM debian:bookworm-slim$", dockerfile, re.M)
    assert "python3-bpfcc" in dockerfile and "--system-site-packages" in dockerfile
    for line in re.findall(r"^COPY (?!--from)(.+)$", dockerfile, re.M):
        for source in line.split()[:-1]:
            assert (ROOT / source).exists(), f"Dockerfile copies {source}, which the repository lacks"
    entrypoint = re.search(r'^ENTRYPOINT \["([^"]+)"\]', dockerfile, re.M).group(1)
    assert entrypoint == container(find("DaemonSet", "otel-gpu"))["command"][0]


# --- Grafana and Prometheus: the dashboard's path to the collector's metrics -------------

GRAFANA = K8S / "grafana"
DASHBOARD = json.loads((GRAFANA / "otel-gpu-dashboard.json").read_text())


def mounted_configmaps(workload):
    """mountPath -> (ConfigMap name, the keys its generator puts in it)."""
    volumes = {v["name"]: v["configMap"]["name"] for v in workload["spec"]["template"]["spec"]["volumes"]
               if "configMap" in v}
    files = generator_files(K8S)
    return {m["mountPath"]: (volumes[m["name"]], set(files[volumes[m["name"]]]))
            for m in container(workload)["volumeMounts"] if m["name"] in volumes}


def reaches(url_or_target, port_name="http"):
    """host:port (or http://host:port) names a Service whose port leads to its Deployment's port."""
    hostport = urlsplit(url_or_target).netloc if "//" in url_or_target else url_or_target
    host, port = hostport.split(":")
    service = find("Service", host)
    return container_port(find("Deployment", host), service_port(service, int(port))["targetPort"])


def test_the_device_clock_library_is_built_into_the_image_and_published_on_the_node():
    dockerfile = (K8S / "Dockerfile").read_text()
    built = re.search(r"^COPY --from=cupti (\S+) (\S+)$", dockerfile, re.M)
    assert built and "library.build(Path('/out'))" in dockerfile and built.group(1) == "/out/libotel_gpu_cupti.so"
    daemonset = find("DaemonSet", "otel-gpu")
    (init,) = daemonset["spec"]["template"]["spec"]["initContainers"]
    assert init["image"] == container(daemonset)["image"]
    script = init["command"][-1]
    assert f"cp {built.group(2)} " in script and "mv -f" in script  # renamed into place, never rewritten
    (mount,) = init["volumeMounts"]
    status = next(m for m in container(daemonset)["volumeMounts"] if m["mountPath"] == "/run/otel-gpu")
    assert (mount["name"], mount["mountPath"]) == (status["name"], "/run/otel-gpu")
    assert script.endswith("/run/otel-gpu/libotel_gpu_cupti.so")
    assert init["securityContext"]["capabilities"]["drop"] == ["ALL"]


def test_grafana_mounts_its_provisioning_where_grafana_reads_it():
    mounts = mounted_configmaps(find("Deployment", "grafana"))
    assert mounts["/etc/grafana/provisioning/datasources"] == ("grafana-datasources", {"datasources.yaml"})
    assert mounts["/etc/grafana/provisioning/dashboards"] == ("grafana-dashboard-providers", {"dashboards.yaml"})
    provider = yaml.safe_load((GRAFANA / "dashboards.yaml").read_text())
    (entry,) = provider["providers"]
    assert entry["type"] == "file"
    name, keys = mounts[entry["options"]["path"]]
    assert (name, keys) == ("grafana-dashboards", {"otel-gpu-dashboard.json"})
    home = env_of(find("Deployment", "grafana"))["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]["value"]
    assert home == f"{entry['options']['path']}/otel-gpu-dashboard.json"


def test_grafana_writes_only_to_its_volumes_and_admits_only_viewers():
    grafana = find("Deployment", "grafana")
    assert container(grafana)["securityContext"]["readOnlyRootFilesystem"] is True
    pod = grafana["spec"]["template"]["spec"]
    writable = {m["mountPath"] for m in container(grafana)["volumeMounts"]
                if "emptyDir" in next(v for v in pod["volumes"] if v["name"] == m["name"])}
    assert writable == {"/var/lib/grafana", "/tmp"}
    env = {k: v["value"] for k, v in env_of(grafana).items()}
    assert env["GF_LOG_MODE"] == "console"  # the image's default also writes files under /var/log
    assert (env["GF_AUTH_ANONYMOUS_ORG_ROLE"], env["GF_AUTH_DISABLE_LOGIN_FORM"]) == ("Viewer", "true")


def test_datasources_reach_prometheus_and_tempo_and_the_dashboard_uses_only_them():
    datasources = {d["uid"]: d for d in yaml.safe_load((GRAFANA / "datasources.yaml").read_text())["datasources"]}
    assert {(d["type"], uid) for uid, d in datasources.items()} == {("prometheus", "prometheus"), ("tempo", "tempo")}
    assert reaches(datasources["prometheus"]["url"]) == 9090
    tempo_config = yaml.safe_load((K8S / "config" / "tempo.yaml").read_text())
    assert reaches(datasources["tempo"]["url"]) == tempo_config["server"]["http_listen_port"]
    used = {(t["datasource"]["type"], t["datasource"]["uid"]) for p in DASHBOARD["panels"] for t in p.get("targets", [])}
    used |= {(v["datasource"]["type"], v["datasource"]["uid"]) for v in DASHBOARD["templating"]["list"]}
    assert used == {("prometheus", "prometheus")}


def test_prometheus_scrapes_the_gateway_prometheus_exporter():
    config = yaml.safe_load((K8S / "config" / "prometheus.yaml").read_text())
    (job,) = config["scrape_configs"]
    (target,) = [t for group in job["static_configs"] for t in group["targets"]]
    assert reaches(target) == endpoint_port(GATEWAY["exporters"]["prometheus"]["endpoint"])
    assert job["honor_labels"] is True  # keep the gateway's per-sender job/instance


def test_dashboard_panels_are_unique_and_laid_out_without_overlap():
    panels = DASHBOARD["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells = set()
    for p in panels:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"{p['title']} overlaps another panel"
        cells |= mine
        if p["type"] != "row":
            assert p["targets"] and all(t["expr"] for t in p["targets"]), p["title"]
