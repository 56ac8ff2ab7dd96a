"""The stacks' layers: the shipped stacks are read only, the owner's in the config dir's stacks/
replace one by name, merge over it (`extends: <its own name>`) or add new ones built on either
layer, and `stacks list` says where each came from."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkctl.daemon.reads import stack_rows
from sparkctl.policy.images import ImagePolicy
from sparkctl.settings import Settings
from sparkctl.spec.load import catalog_for, load_catalog

ROOT = Path(__file__).resolve().parents[2]


def owner_stacks(tmp_path: Path, files: dict[str, str]) -> Path:
    folder = tmp_path / "config" / "stacks"
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


def catalog(tmp_path: Path, files: dict[str, str]):
    return load_catalog(ROOT / "stacks", ROOT / "patches", owner_dir=owner_stacks(tmp_path, files))


def test_an_owners_stack_named_like_a_shipped_one_replaces_it(tmp_path: Path) -> None:
    text = (ROOT / "stacks" / "qwen36-dflash.yaml").read_text().replace("port: 8107", "port: 8199")
    found = catalog(tmp_path, {"mine.yaml": text})
    shipped = load_catalog(ROOT / "stacks", ROOT / "patches")
    assert found.stack("qwen36-dflash").port == 8199 and shipped.stack("qwen36-dflash").port == 8107
    assert found.files["qwen36-dflash"] == tmp_path / "config" / "stacks" / "mine.yaml"
    assert found.source("qwen36-dflash") == "owner, over shipped" and found.source("qwen36-nvfp4-aeon") == "shipped"
    assert not found.invalid


def test_an_owners_stack_extending_its_own_name_is_merged_over_the_shipped_one(tmp_path: Path) -> None:
    found = catalog(tmp_path, {"dflash.yaml": "name: qwen36-dflash\nextends: qwen36-dflash\nvllm:\n  port: 8199\n",
                               "base.yaml": "name: qwen36-base\nextends: qwen36-base\nvllm:\n  max_model_len: 65536\n"})
    shipped = load_catalog(ROOT / "stacks", ROOT / "patches").stack("qwen36-dflash")
    mine = found.stack("qwen36-dflash")
    assert mine.port == 8199 and mine.vllm.max_model_len == 65536  # its own key, and one from the base it overrides
    assert mine.draft == shipped.draft and mine.vllm.speculative == shipped.vllm.speculative
    assert found.stack("qwen36-nvfp4-stock").vllm.max_model_len == 65536  # a shipped stack on the owner's base
    assert "qwen36-base" not in {s.name for s in found.deployable()}  # still abstract
    assert not found.invalid


def test_an_owners_new_stack_extends_a_shipped_one_and_a_broken_one_is_left_out_alone(tmp_path: Path) -> None:
    found = catalog(tmp_path, {"small.yaml": "name: my-small\nextends: qwen36-dflash\nvllm:\n  port: 8198\n",
                               "broken.yaml": "name: my-broken\nextends: qwen36-dflash\nvllm: {nope: 1}\n"})
    assert found.stack("my-small").draft == found.stack("qwen36-dflash").draft
    assert found.source("my-small") == "owner"
    [invalid] = found.invalid
    assert invalid.name == "my-broken" and invalid.file.parent == tmp_path / "config" / "stacks"
    rows = {row.stack: row for row in stack_rows(found, ImagePolicy())}
    assert (rows["my-small"].source, rows["my-broken"].source, rows["qwen36-dflash"].source) == \
        ("owner", "owner", "shipped")
    assert rows["my-broken"].invalid


def test_two_owners_files_of_one_name_are_refused_like_two_shipped_ones(tmp_path: Path) -> None:
    text = "name: my-small\nextends: qwen36-dflash\n"
    found = catalog(tmp_path, {"a.yaml": text, "b.yaml": text})
    [invalid] = found.invalid
    assert invalid.file.name == "b.yaml" and "already defined" in invalid.problem


def test_the_catalog_reads_the_config_dir_and_sees_its_edits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARKCTL_CONFIG_DIR", str(tmp_path / "config"))
    settings = Settings(stacks_dir=ROOT / "stacks", patches_dir=ROOT / "patches")
    assert settings.owner_stacks_dir == tmp_path / "config" / "stacks"
    assert "my-small" not in catalog_for(settings).stacks
    owner_stacks(tmp_path, {"small.yaml": "name: my-small\nextends: qwen36-dflash\n"})
    assert catalog_for(settings).source("my-small") == "owner"


def test_the_config_dir_is_xdgs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("SPARKCTL_CONFIG_DIR")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert Settings().config_dir == tmp_path / "xdg" / "sparkctl"
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert Settings().config_dir == tmp_path / "home" / ".config" / "sparkctl"


def test_stacks_list_says_where_each_stack_comes_from(workspace: Path, cli, monkeypatch) -> None:
    owner_stacks(workspace, {"small.yaml": "name: my-small\nextends: qwen36-dflash\nvllm:\n  port: 8198\n"})
    monkeypatch.setenv("COLUMNS", "400")
    code, out, _ = cli("stacks", "list")
    lines = {line.split("│")[1].strip(): line for line in out.splitlines() if line.count("│") > 2}
    assert code == 0 and lines["my-small"].rstrip("│ ").endswith("owner")
    assert lines["qwen36-dflash"].rstrip("│ ").endswith("shipped")
