"""collector-config/: the OTel Collector gateway and its overlays (merged as the
collector merges several --config files) reference only components they define, and
their connectors join the pipelines they should. The ports and names they share with
k8s/: test_manifests.py."""
import pytest

from tests.unit.test_manifests import GATEWAY, VARIANTS

KINDS = ("receivers", "processors", "exporters", "connectors", "extensions")
# Which signal each connector takes in (as an exporter) and puts out (as a receiver).
CONNECTOR_SIGNALS = {"spanmetrics": ("traces", "metrics")}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_pipelines_reference_only_defined_components(name):
    config = VARIANTS[name]
    defined = {kind: set(config.get(kind) or {}) for kind in KINDS}
    service = config["service"]
    assert set(service.get("extensions", [])) <= defined["extensions"]
    for pipeline_id, pipeline in service["pipelines"].items():
        assert pipeline_id.split("/")[0] in ("traces", "metrics", "logs"), pipeline_id
        for receiver in pipeline["receivers"]:
            assert receiver in defined["receivers"] | defined["connectors"], (pipeline_id, receiver)
        for processor in pipeline.get("processors", []):
            assert processor in defined["processors"], (pipeline_id, processor)
        for exporter in pipeline["exporters"]:
            assert exporter in defined["exporters"] | defined["connectors"], (pipeline_id, exporter)
        # memory_limiter must see data first to be able to refuse it.
        assert pipeline.get("processors", ["memory_limiter"])[0] == "memory_limiter", pipeline_id


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_connectors_join_an_exporting_and_a_receiving_pipeline(name):
    config = VARIANTS[name]
    pipelines = config["service"]["pipelines"]
    for connector in config.get("connectors") or {}:
        signal_in, signal_out = CONNECTOR_SIGNALS[connector.split("/")[0]]
        fed_by = [p.split("/")[0] for p, body in pipelines.items() if connector in body["exporters"]]
        feeds = [p.split("/")[0] for p, body in pipelines.items() if connector in body["receivers"]]
        assert fed_by and set(fed_by) == {signal_in}, (connector, fed_by)
        assert feeds and set(feeds) == {signal_out}, (connector, feeds)


def test_spanmetrics_produces_per_route_red_metrics_for_prometheus():
    spanmetrics = GATEWAY["connectors"]["spanmetrics"]
    assert {"name": "http.route"} in spanmetrics["dimensions"]
    metrics = GATEWAY["service"]["pipelines"]["metrics"]
    assert "spanmetrics" in metrics["receivers"] and "prometheus" in metrics["exporters"]


def test_jaeger_variant_sends_traces_to_jaeger_only():
    traces = VARIANTS["gateway.yaml + gateway-jaeger.yaml"]["service"]["pipelines"]["traces"]
    assert traces["exporters"] == ["otlp/jaeger"]
