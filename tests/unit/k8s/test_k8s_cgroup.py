"""cgroup parsing over fixtures of every layout (fixtures/cgroup/*.txt, expectations in
fixtures/cgroup_expected.json: a fixture without an expectation fails the suite)."""

import json
from pathlib import Path

import pytest

from otel_gpu.k8s.cgroup import (RUNTIME_CONTAINERD, CgroupFormatError, ContainerRef, parse_cgroup,
                                 parse_cgroup_path)

FIXTURES = Path(__file__).parent / "fixtures"
EXPECTED = json.loads((FIXTURES / "cgroup_expected.json").read_text())
FILES = sorted(p.name for p in (FIXTURES / "cgroup").glob("*.txt"))
CID = "3f1c2a9b8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a"


def test_every_fixture_has_an_expectation_and_back():
    assert set(FILES) == set(EXPECTED)


@pytest.mark.parametrize("name", FILES)
def test_fixture(name):
    ref = parse_cgroup((FIXTURES / "cgroup" / name).read_text())
    want = EXPECTED[name]
    assert ref == (None if want is None else ContainerRef(**want))


def test_fixture_set_covers_every_runtime_driver_and_version():
    # Guards the suite itself: dropping a layout's fixture must fail loudly.
    names = " ".join(FILES)
    for needle in ("v1-", "v2-", "systemd", "cgroupfs", "containerd", "crio", "docker", "hybrid",
                   "cgroupns"):
        assert needle in names, needle


def test_systemd_slice_uid_underscores_become_dashes():
    ref = parse_cgroup_path(
        "/kubepods.slice/kubepods-burstable.slice/"
        "kubepods-burstable-pod0b1c6f2e_5d8a_4c3e_9f10_2a6b7c8d9e0f.slice/"
        f"cri-containerd-{CID}.scope"
    )
    assert ref == ContainerRef(CID, RUNTIME_CONTAINERD, "0b1c6f2e-5d8a-4c3e-9f10-2a6b7c8d9e0f")


def test_inside_a_pod_the_pod_level_container_wins_over_a_nested_one():
    inner = "ab" * 32
    ref = parse_cgroup_path(f"/kubepods/pod0b1c6f2e-5d8a-4c3e-9f10-2a6b7c8d9e0f/{CID}/docker/{inner}")
    assert ref.container_id == CID


def test_outside_a_pod_the_deepest_container_wins():
    inner = "ab" * 32
    assert parse_cgroup_path(f"/docker/{CID}/docker/{inner}").container_id == inner


@pytest.mark.parametrize(
    "path",
    [
        f"/kubepods/burstable/pod0b1c6f2e-5d8a-4c3e-9f10-2a6b7c8d9e0f/{CID[:63]}",  # 63 hex
        f"/kubepods/burstable/pod0b1c6f2e-5d8a-4c3e-9f10-2a6b7c8d9e0f/{CID.upper()}",  # not kernel case
        f"/system.slice/cri-containerd-{CID}.service",  # wrong unit type
        "/kubepods/burstable/podnot-a-uid/" + "x" * 64,
    ],
)
def test_near_misses_are_not_containers(path):
    assert parse_cgroup_path(path) is None


@pytest.mark.parametrize(
    "text",
    ["", "\n\n", "garbage", "12:memory", "x:cpu:/kubepods", "0::relative/path", "0:/kubepods"],
)
def test_malformed_text_raises_a_format_error(text):
    with pytest.raises(CgroupFormatError):
        parse_cgroup(text)


def test_blank_lines_are_tolerated():
    assert parse_cgroup(f"\n0::/docker/{CID}\n\n").container_id == CID
