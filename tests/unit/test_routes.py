"""The gateway's route table: aliases, served names and stack names to running upstreams."""

from __future__ import annotations

from sparkctl.gateway.routes import Upstream, build_table

STACKS = {"qwen36-dflash": Upstream("qwen36-dflash", "http://127.0.0.1:8107", "qwen36-dflash", 1),
          "aeon-gemma4-v2": Upstream("aeon-gemma4-v2", "http://127.0.0.1:8110", "aeon-gemma4")}


def test_routes_only_to_running_stacks_and_live_aliases() -> None:
    table = build_table(aliases={"primary": "qwen36-dflash", "batch": "aeon-gemma4-v2"}, stacks=STACKS,
                        running={"qwen36-dflash"})
    assert table.resolve("primary").url == "http://127.0.0.1:8107" and table.resolve("primary").max_concurrency == 1
    assert table.resolve("qwen36-dflash").served_name == "qwen36-dflash"
    assert table.resolve("batch") is None and table.resolve("aeon-gemma4") is None
    assert [m["id"] for m in table.models()] == ["primary", "qwen36-dflash"]


def test_served_names_and_stack_names_both_resolve() -> None:
    table = build_table(aliases={}, stacks=STACKS, running=set(STACKS))
    assert table.resolve("aeon-gemma4").stack == table.resolve("aeon-gemma4-v2").stack == "aeon-gemma4-v2"
    assert table.resolve("unknown") is None


def test_a_parked_stacks_names_and_aliases_lead_to_it() -> None:
    table = build_table(aliases={"batch": "aeon-gemma4-v2"}, stacks=STACKS, running={"qwen36-dflash"},
                        parked={"aeon-gemma4-v2"})
    assert table.parked == {"aeon-gemma4-v2": "aeon-gemma4-v2", "aeon-gemma4": "aeon-gemma4-v2",
                            "batch": "aeon-gemma4-v2"}
    assert table.resolve("batch") is None
