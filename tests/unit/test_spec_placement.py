"""A stack's `placement` section: a named host or replicas, never both; whether it runs across the
fleet and on how many hosts; a move leaves the spec hash alone. And where sparkctl reaches a
stack's engine: the one address it listens on, or loopback."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from sparkctl.errors import SpecError
from sparkctl.spec.load import load_stacks
from sparkctl.spec.models import Placement, Stack
from sparkctl.spec.render import spec_hash

MINIMAL = {"name": "gemma", "image": {"repository": "ghcr.io/example/vllm", "tag": "v1"},
           "model": {"repo": "google/gemma-4", "revision": "main"}, "vllm": {"port": 8110, "max_model_len": 2048}}


def stack(**changes: object) -> Stack:
    return Stack.model_validate(MINIMAL | changes)


def test_a_host_and_replicas_are_refused_naming_both() -> None:
    with pytest.raises(ValidationError, match="name a `host` or ask for `replicas`, not both"):
        stack(placement={"host": "b", "replicas": 2})


def test_the_stack_file_with_both_fails_at_its_placement_key(tmp_path: Path) -> None:
    path = tmp_path / "gemma.yaml"
    path.write_text("name: gemma\nimage: {repository: ghcr.io/example/vllm, tag: v1}\n"
                    "model: {repo: google/gemma-4}\nvllm: {port: 8110}\nplacement: {host: b, replicas: 3}\n")
    with pytest.raises(SpecError) as caught:
        load_stacks([path]).stack("gemma")
    assert caught.value.key == "placement" and "`host`" in caught.value.problem and "`replicas`" in caught.value.problem


def test_a_host_with_one_replica_is_one_way() -> None:
    assert stack(placement={"host": "b", "replicas": 1}).placement.count == 1


@pytest.mark.parametrize(("section", "fleet", "count"), [
    ({}, False, 1),
    ({"host": "b"}, True, 1),
    ({"replicas": 1}, True, 1),
    ({"replicas": 3}, True, 3),
])
def test_fleet_and_count(section: dict, fleet: bool, count: int) -> None:
    placement = stack(placement=section).placement
    assert placement.fleet is fleet and placement.count == count


def test_no_placement_section_is_a_single_spark() -> None:
    assert stack().placement == Placement() and not stack().placement.fleet


@pytest.mark.parametrize("replicas", [0, 65])
def test_replicas_are_bounded(replicas: int) -> None:
    with pytest.raises(ValidationError, match="placement.replicas"):
        stack(placement={"replicas": replicas})


def test_moving_a_stack_does_not_change_its_spec_hash() -> None:
    here = spec_hash(stack())
    assert {spec_hash(stack(placement=p)) for p in ({"host": "b"}, {"replicas": 3}, {"replicas": 1})} == {here}
    assert spec_hash(stack(vllm={"port": 8111, "max_model_len": 2048})) != here  # the engine's own change does


@pytest.mark.parametrize(("host", "url"), [
    ("10.0.0.5", "http://10.0.0.5:8110"),  # a fleet host's serving address
    ("0.0.0.0", "http://127.0.0.1:8110"),
    ("::", "http://127.0.0.1:8110"),
    ("localhost", "http://127.0.0.1:8110"),
    ("127.0.0.1", "http://127.0.0.1:8110"),
    ("::1", "http://[::1]:8110"),
])
def test_the_engine_is_reached_where_it_listens(host: str, url: str) -> None:
    engine = stack(vllm={"port": 8110, "host": host}, allow=["all-interfaces"])
    assert engine.url == url
