"""Placing a stack across the fleet, the pure part: the bundles Ray is asked for, the hosts'
agreement on what they would run, the message when a stack fits nowhere, and the book of what
runs where."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from sparkctl.adapters.placements import BOOK_FILE, PlacementFile
from sparkctl.fleet.placement import (
    GIB,
    PINNED_SHARE,
    Book,
    Placed,
    Replica,
    agree,
    bundles,
    fits_nowhere,
    serving,
)
from sparkctl.node import AgentAnswer, Prepared
from sparkctl.spec.models import Stack

D1, D2, D3 = (f"sha256:{c * 64}" for c in "123")


def stack(name: str = "gemma", fraction: float = 0.25, placement: dict | None = None) -> Stack:
    """A minimal vllm stack (as tests/fleet/cluster.py `stack_file` writes one)."""
    return Stack.model_validate({
        "name": name, "image": {"repository": "ghcr.io/example/vllm", "tag": "v1"},
        "model": {"repo": "google/gemma-4", "revision": "main"}, "vllm": {"port": 8110, "max_model_len": 2048},
        "resources": {"gpu_memory_utilization": fraction}, "placement": placement or {},
    })


def parts(image: str = D1, model: str = "google/gemma-4@abc", draft: str = "", patches: str = "",
          env: str = "e1") -> dict[str, str]:
    return {"image": image, "model": model, "draft": draft, "patches": patches, "env": env}


def answer(host: str, **changes: str) -> AgentAnswer:
    return AgentAnswer(host=host, value=Prepared(host, parts(**changes)))


# --- bundles ---------------------------------------------------------------------------------------
def test_a_bundle_asks_for_the_stacks_fraction_of_a_sparks_memory() -> None:
    found, strategy = bundles(stack(fraction=0.25), 128 * GIB)
    assert found == [{"memory": float(32 * GIB)}] and strategy == "PACK"


def test_replicas_are_as_many_bundles_on_different_hosts() -> None:
    found, strategy = bundles(stack(fraction=0.5, placement={"replicas": 3}), 100 * GIB)
    assert found == [{"memory": float(50 * GIB)}] * 3 and strategy == "STRICT_SPREAD"
    found[0]["memory"] = 0.0
    assert found[1]["memory"] == float(50 * GIB)  # each bundle is its own dict


def test_one_replica_is_packed() -> None:
    found, strategy = bundles(stack(placement={"replicas": 1}), 8 * GIB)
    assert len(found) == 1 and strategy == "PACK"


def test_a_named_host_adds_a_sliver_of_its_spark_resource() -> None:
    found, strategy = bundles(stack(fraction=0.5, placement={"host": "b"}), 2 * GIB)
    assert found == [{"memory": float(GIB), "spark:b": PINNED_SHARE}] and strategy == "PACK"
    assert PINNED_SHARE < 1  # many stacks may name the same host


# --- the hosts' agreement ----------------------------------------------------------------------------
def test_hosts_that_agree_have_no_differences() -> None:
    agreement = agree([answer("a"), answer("b"), answer("c")])
    assert agreement.expected == parts() and agreement.differences == {}


def test_the_majority_wins_and_the_host_that_differs_is_named_with_who_has_the_expected() -> None:
    agreement = agree([answer("c"), answer("b", image=D2), answer("a")])
    assert agreement.expected["image"] == D1
    assert agreement.differences == {"b": f"image {D2[:19]} where a, c have {D1[:19]}"}
    refusal = agreement.refusal("gemma")
    assert refusal.startswith("refused to start gemma") and f"host b: image {D2[:19]}" in refusal


def test_every_part_that_differs_is_named_and_a_missing_one_is_none() -> None:
    odd = AgentAnswer(host="c", value=Prepared("c", {"image": D1, "model": "google/gemma-4@def", "env": "e1"}))
    agreement = agree([answer("a", draft="z-lab/draft@1"), answer("b", draft="z-lab/draft@1"), odd])
    assert agreement.differences == {"c": "model google/gemma-4@def where a, b have google/gemma-4@abc; "
                                          "draft (none) where a, b have z-lab/draft@1"}


def test_a_host_whose_prepare_failed_is_a_difference() -> None:
    failed = AgentAnswer(host="b", error="no space left on device")
    agreement = agree([answer("a"), failed, answer("c")])
    assert agreement.differences == {"b": "could not prepare: no space left on device"}
    assert agreement.expected == parts()  # from the hosts that answered


def test_a_tie_goes_to_the_first_hosts_value() -> None:
    agreement = agree([answer("b", image=D2), answer("a", image=D3)])
    assert agreement.expected["image"] == D2
    assert agreement.differences == {"a": f"image {D3[:19]} where b has {D2[:19]}"}
    assert agree([answer("a", image=D3), answer("b", image=D2)]).expected["image"] == D3


# --- fits nowhere ------------------------------------------------------------------------------------
def test_fits_nowhere_names_the_stack_the_memory_needed_and_each_hosts_free_memory() -> None:
    big = stack("big", fraction=0.5)
    need, _ = bundles(big, 128 * GIB)
    message = fits_nowhere(big, need[0], {"c": 3 * GIB, "a": int(20.5 * GIB), "b": 10 * GIB}, 1)
    assert message.startswith("big fits nowhere in the fleet")
    assert "a host with 64.0 GiB free" in message and "(0.5 of a Spark)" in message
    assert message.endswith("free memory per host: a 20.5 GiB, b 10.0 GiB, c 3.0 GiB")


def test_fits_nowhere_for_replicas_a_named_host_or_no_live_host() -> None:
    spread = stack(fraction=0.25, placement={"replicas": 2})
    assert "needs 2 hosts with 2.0 GiB free (" in fits_nowhere(spread, bundles(spread, 8 * GIB)[0][0], {"a": 0}, 2)
    pinned = stack(fraction=0.25, placement={"host": "b"})
    message = fits_nowhere(pinned, bundles(pinned, 8 * GIB)[0][0], {}, 1)
    assert "2.0 GiB free on host b" in message and message.endswith("no host is alive")


# --- the book ----------------------------------------------------------------------------------------
def placed(stack_name: str, *hosts: str) -> Placed:
    return Placed(stack=stack_name, group=f"stack-{stack_name}", spec="0123456789abcdef", parts=parts(),
                  replicas=tuple(Replica(h, f"http://10.0.0.{i + 2}:8110", f"fp-{h}") for i, h in enumerate(hosts)))


def test_the_book_round_trips_and_a_parked_stack_is_not_serving(tmp_path: Path) -> None:
    book = {"gemma": placed("gemma", "a", "b"), "qwen": dataclasses.replace(placed("qwen", "c"), parked=True)}
    Book(PlacementFile(tmp_path / "fleet")).change(lambda entries: entries.update(book))
    again = Book(PlacementFile(tmp_path / "fleet")).entries()  # a restarted daemon reads it back
    assert again == book and again["gemma"].hosts == ["a", "b"]
    assert list(serving(again)) == ["gemma"]


@pytest.mark.parametrize("where", ["", "missing"])
def test_no_book_is_nothing_placed(tmp_path: Path, where: str) -> None:
    assert Book(PlacementFile(tmp_path / where)).entries() == {}


def test_the_book_is_held_in_memory_and_written_through(tmp_path: Path) -> None:
    """Its one owner, the head's daemon, reads the file once: what it holds is the book, and each
    change is on disk when `change` returns."""
    storage = PlacementFile(tmp_path)
    book = Book(storage)
    book.change(lambda entries: entries.update(gemma=placed("gemma", "a")))
    assert Book(storage).entries() == {"gemma": placed("gemma", "a")}
    storage.save({})  # written behind the owner's back (never done): not read back
    assert book.get("gemma") == placed("gemma", "a")


def test_a_failed_write_changes_nothing(tmp_path: Path) -> None:
    """A change that cannot be written leaves the book as it was, in memory as on disk."""
    storage = PlacementFile(tmp_path / "fleet")
    book = Book(storage)
    book.change(lambda entries: entries.update(gemma=placed("gemma", "a")))
    storage.path = tmp_path / "not-a-dir" / BOOK_FILE
    (tmp_path / "not-a-dir").write_text("a file where the fleet dir should be")
    with pytest.raises(OSError):
        book.change(lambda entries: entries.update(qwen=placed("qwen", "b")))
    assert list(book.entries()) == ["gemma"] and list(Book(PlacementFile(tmp_path / "fleet")).entries()) == ["gemma"]


def test_the_book_is_replaced_atomically(tmp_path: Path) -> None:
    storage = PlacementFile(tmp_path)
    storage.save({"gemma": dataclasses.asdict(placed("gemma", "a"))})
    with (tmp_path / BOOK_FILE).open() as before:  # a reader that opened the old book...
        storage.save({"qwen": dataclasses.asdict(placed("qwen", "b", "c"))})
        assert '"gemma"' in before.read()  # ...still reads all of it: a new file took its place
    assert Book(storage).entries() == {"qwen": placed("qwen", "b", "c")}
    assert [p.name for p in tmp_path.iterdir()] == [BOOK_FILE]  # no temporary file left
