"""One file in stacks/ (or patches/) that does not load is reported once, naming the file, the
line and the key, and left out: the rest of the catalog loads, every command not about that
stack works, and asking for it (or for a stack built on it) fails with the file's error."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from sparkctl.daemon.reads import stack_rows
from sparkctl.errors import SpecError
from sparkctl.settings import Settings
from sparkctl.spec.load import load_catalog

ROOT = Path(__file__).resolve().parents[2]
GOOD = "name: good\nimage: {repository: vllm/vllm-openai, tag: v0.24.0}\nmodel: {repo: a/b}\nvllm: {port: 8123}\n"
# (file name, text, what its error names: line, key, words)
BROKEN = [
    ("bad-key.yaml", "name: bad-key\nextends: good\nvllm:\n  max_model_len: lots\n",
     4, "vllm.max_model_len", "valid integer"),
    ("unknown-key.yaml", "name: unknown-key\nextends: good\n\nvlm: {port: 1}\n", 4, "vlm", "unknown key"),
    ("bad-yaml.yaml", "name: bad-yaml\nvllm: [unclosed\n", 3, "", "invalid YAML"),
    ("no-base.yaml", "name: no-base\nextends: nothing\n", 2, "extends", "no stack named 'nothing'"),
    ("risky.yaml", "name: risky\nextends: good\nvllm: {extra_args: [--trust_remote_code]}\n", None, "(top level)",
     "allow: [remote-code]"),
    # What the YAML reader builds: a date is the text it is written as, and a value it cannot build
    # (or no engine could be given) is this file's error, not every command's 500.
    ("bad-date.yaml", "name: bad-date\nextends: good\nvllm:\n  max_model_len: 2026-13-45\n", 4, "vllm.max_model_len",
     "valid integer, unable to parse string as an integer (got '2026-13-45')"),
    ("huge-int.yaml", "name: huge-int\nextends: good\nvllm:\n  max_model_len: " + "9" * 4_301 + "\n", 4, "",
     "invalid YAML: '999999999999999999999999…': a number of 4,301 characters, over the 4,300 sparkctl reads "
     "(quote it if it is text)"),
    ("wide-int.yaml", "name: wide-int\nextends: good\nrequest_defaults: {seed: 0x" + "f" * 3_600 + "}\n", 3, "",
     "an integer of over 4,300 digits; no sparkctl setting takes one"),
    ("bool-tag.yaml", "name: bool-tag\nextends: good\n\nvllm: {enforce_eager: !!bool maybe}\n", 4, "",
     "invalid YAML: cannot read 'maybe' as !!bool; quote it if it is text"),
    ("local-tag.yaml", "name: local-tag\nextends: good\ncontainer: {env: {A: !env HOME}}\n", 3, "",
     "the tag !env: a sparkctl file holds mappings, lists, text, numbers, booleans and null; drop the tag"),
    ("itself.yaml", "name: itself\nextends: good\nrequest_defaults: {x: &a [*a]}\n", None, "",
     "holds itself through a YAML alias; write the values out instead"),
]
NAMES = {file: file.removesuffix(".yaml") for file, *_ in BROKEN}


def catalog_dir(tmp_path: Path, files: dict[str, str]) -> Path:
    stacks = tmp_path / "stacks"
    stacks.mkdir(exist_ok=True)
    for name, text in files.items():
        (stacks / name).write_text(text)
    return stacks


def where(file: Path, line: int | None, key: str) -> str:
    """How an error at `file`'s `line` and `key` starts."""
    return ": ".join(filter(None, (str(file), f"line {line}" if line else "", key))) + ": "


@pytest.mark.parametrize(("file", "text", "line", "key", "words"), BROKEN, ids=[b[0] for b in BROKEN])
def test_one_invalid_file_is_left_out_and_named(tmp_path: Path, file: str, text: str, line: int | None, key: str,
                                                words: str) -> None:
    stacks = catalog_dir(tmp_path, {"good.yaml": GOOD, file: text})
    catalog = load_catalog(stacks)
    assert [s.name for s in catalog.deployable()] == ["good"]
    [invalid] = catalog.invalid
    said = str(invalid.error)
    assert said.startswith(where(stacks / file, line, key)), said
    assert words in said and invalid.name == NAMES[file]
    with pytest.raises(SpecError) as caught:
        catalog.stack(NAMES[file])
    assert str(caught.value) == said
    assert catalog.stack("good").vllm.port == 8123


def test_a_date_is_the_text_it_is_written_as(tmp_path: Path) -> None:
    """Docker is given text: a tag or an env value that looks like a date stays that text (it
    was a `datetime.date`, which the models refused), however the file spells it."""
    dated = "name: dated\nextends: good\nimage: {tag: 2026-01-01}\n" \
            "container: {env: {RELEASE: 2026-01-01T10:00:00Z, WHEN: 2026-13-45}}\n"
    stacks = catalog_dir(tmp_path, {"good.yaml": GOOD, "dated.yaml": dated})
    stack = load_catalog(stacks).stack("dated")
    assert stack.image.tag == "2026-01-01"
    assert stack.container.env == {"RELEASE": "2026-01-01T10:00:00Z", "WHEN": "2026-13-45"}


@pytest.mark.parametrize(("file", "text"), [(b[0], b[1]) for b in BROKEN], ids=[b[0] for b in BROKEN])
def test_a_stack_built_on_an_invalid_file_fails_naming_it(tmp_path: Path, file: str, text: str) -> None:
    stacks = catalog_dir(tmp_path, {"good.yaml": GOOD, file: text,
                                    "child.yaml": f"name: child\nextends: {NAMES[file]}\nvllm: {{port: 8124}}\n"})
    catalog = load_catalog(stacks)
    assert [s.name for s in catalog.deployable()] == ["good"]
    with pytest.raises(SpecError) as caught:
        catalog.stack("child")
    said = str(caught.value)
    assert said.startswith(f"{stacks / 'child.yaml'}: line 2: extends: base stack {NAMES[file]!r} is left out: "
                           f"{stacks / file}: "), said


def test_the_stacks_built_on_an_invalid_file_are_its_dependents(tmp_path: Path) -> None:
    """Reported once, at the file to fix: a stack two levels up names it as its cause too."""
    stacks = catalog_dir(tmp_path, {"good.yaml": GOOD, "root.yaml": "name: root\nextends: good\nvllm: {port: x}\n",
                                    "mid.yaml": "name: mid\nextends: root\n", "top.yaml": "name: top\nextends: mid\n"})
    catalog = load_catalog(stacks)
    by_name = {i.name: i for i in catalog.invalid}
    assert by_name["root"].cause is None and by_name["root"].dependents == ("mid", "top")
    assert by_name["mid"].cause == by_name["top"].cause == stacks / "root.yaml"
    with pytest.raises(SpecError, match=r"top\.yaml: line 2: extends: base stack 'mid' is left out: .*mid\.yaml: "
                                        r"line 2: extends: base stack 'root' is left out: .*root\.yaml: line 3: "
                                        r"vllm\.port"):
        catalog.stack("top")


def test_a_name_two_files_give_is_refused_not_guessed(tmp_path: Path) -> None:
    stacks = catalog_dir(tmp_path, {"a.yaml": GOOD, "b.yaml": GOOD.replace("8123", "8125")})
    catalog = load_catalog(stacks)
    with pytest.raises(SpecError, match=r"b\.yaml: line 1: name: stack 'good' is already defined in .*a\.yaml"):
        catalog.stack("good")


def test_an_invalid_patch_set_leaves_out_the_stacks_that_use_it(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "patches", tmp_path / "patches")
    (tmp_path / "patches" / "dspark-dflash.yaml").write_text("name: dspark-dflash\noverlays: 3\n")
    shutil.copytree(ROOT / "stacks", tmp_path / "stacks")
    catalog = load_catalog(tmp_path / "stacks", tmp_path / "patches")
    assert "qwen36-nvfp4-stock" in catalog.stacks
    with pytest.raises(SpecError, match=r"qwen36-dflash\.yaml: line \d+: patches: patch set 'dspark-dflash' is "
                                        r"left out: .*dspark-dflash\.yaml: line 2: overlays: "):
        catalog.stack("qwen36-dflash")


def test_asking_for_an_unknown_stack_mentions_the_invalid_files(tmp_path: Path) -> None:
    catalog = load_catalog(catalog_dir(tmp_path, {"good.yaml": GOOD, "bad-yaml.yaml": BROKEN[2][1]}))
    with pytest.raises(SpecError, match=r"no such stack; known stacks: good; left out, invalid: bad-yaml\.yaml"):
        catalog.stack("other")


def test_stacks_list_shows_the_invalid_file(tmp_path: Path) -> None:
    from sparkctl.policy.images import ImagePolicy

    catalog = load_catalog(catalog_dir(tmp_path, {"good.yaml": GOOD, "bad-key.yaml": BROKEN[0][1]}))
    listed = {row.stack: row for row in stack_rows(catalog, ImagePolicy())}
    assert listed["good"].invalid is None
    assert listed["bad-key"].invalid == "bad-key.yaml: line 4: vllm.max_model_len: " + \
        catalog.invalid[0].problem


def test_the_daemon_logs_an_invalid_file_once(workspace: Path) -> None:
    """The daemon's wiring reads the catalog each pass; the file is logged when it turns invalid."""
    from sparkctl.wiring import Wiring

    (workspace / "stacks" / "bad-key.yaml").write_text(BROKEN[0][1].replace("extends: good", "extends: qwen36-base"))
    (workspace / "stacks" / "on-it.yaml").write_text("name: on-it\nextends: bad-key\n")
    wiring = Wiring(Settings())
    with capture_logs() as logs:
        for _ in range(3):
            assert "qwen36-dflash" in wiring.catalog().stacks
    events = [e for e in logs if e["event"] == "stack_file_invalid"]
    assert len(events) == 1 and events[0]["log_level"] == "warning"
    assert events[0]["file"] == str(workspace / "stacks" / "bad-key.yaml")
    assert (events[0]["line"], events[0]["key"], events[0]["stack"]) == (4, "vllm.max_model_len", "bad-key")
    assert events[0]["dependents"] == ["on-it"]


def test_other_stacks_work_with_a_warning_and_the_invalid_one_fails(workspace: Path, cli) -> None:
    bad = workspace / "stacks" / "mine.yaml"
    bad.write_text("name: mine\nextends: qwen36-nvfp4-stock\nvllm:\n  max_model_len: lots\n")
    (workspace / "stacks" / "on-mine.yaml").write_text("name: on-mine\nextends: mine\n")
    code, out, err = cli("stacks", "show", "qwen36-dflash")
    assert code == 0 and "spec-hash" in out, err
    assert err.count("warning: ") == 1 and f"warning: {bad}: line 4: vllm.max_model_len:" in err, err
    assert "(stack 'mine' is left out, with on-mine built on it; the others load)" in " ".join(err.split()), err
    code, out, err = cli("stacks", "show", "mine")
    assert code == 1 and err.strip().splitlines()[-1].startswith(f"error: {bad}: line 4: vllm.max_model_len: "), err
    code, out, err = cli("stacks", "validate")
    assert code == 1 and err.strip().splitlines() == [
        f"error: {bad}: line 4: vllm.max_model_len: Input should be a valid integer, unable to parse string as an "
        "integer (got 'lots') (and 1 more invalid files: on-mine.yaml)"], err


def test_a_check_that_breaks_on_one_file_leaves_that_file_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A validator raising what pydantic does not wrap (an OSError resolving a path on the host, a
    TypeError) escaped the loader, and every daemon command answered 500: it is that file's error."""
    from sparkctl.spec.models import Stack

    risks = Stack.risks

    def breaking(self: Stack) -> list[tuple[str, str]]:
        if self.name == "odd":
            raise OSError(40, "Too many levels of symbolic links")
        return risks(self)

    monkeypatch.setattr(Stack, "risks", breaking)
    stacks = catalog_dir(tmp_path, {"good.yaml": GOOD, "odd.yaml": "name: odd\nextends: good\n"})
    catalog = load_catalog(stacks)
    assert [s.name for s in catalog.deployable()] == ["good"]
    with pytest.raises(SpecError, match=r"odd\.yaml: could not be checked \(OSError: \[Errno 40\] Too many levels of "
                                        r"symbolic links\); a sparkctl bug: report it with the file"):
        catalog.stack("odd")
