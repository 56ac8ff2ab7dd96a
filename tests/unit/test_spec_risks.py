"""The opt-in checks judge paths and flags as the host and vLLM read them, not as they are spelled:
every spelling of the Docker socket, of `--trust-remote-code` and of a non-loopback `--host`
needs its `allow:`, and the spellings of harmless things need none."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from sparkctl.spec.load import Catalog, load_catalog
from sparkctl.spec.models import Stack
from sparkctl.spec.risks import flag_name, host_path, is_loopback, reaches_docker_socket


def stack(*, mounts: list[str] = (), args: list[str] = (), host: str = "127.0.0.1", allow: list[str] = ()) -> Stack:
    return Stack.model_validate({
        "name": "s", "image": {"repository": "vllm/vllm-openai", "tag": "v0.24.0"}, "model": {"repo": "a/b"},
        "vllm": {"host": host, "extra_args": list(args)}, "allow": list(allow),
        "container": {"mounts": [{"source": m, "target": "/in"} for m in mounts]}})


def risks(**kwargs) -> set[str]:
    every = ["docker-socket", "all-interfaces", "remote-code"]
    return {risk for risk, _ in stack(**kwargs, allow=every).risks()}


SOCKET_MOUNTS = ["/var/run/docker.sock", "/run/docker.sock", "//var/run/docker.sock", "/var/run/./docker.sock",
                 "/var/run/docker.sock/", "/var//run/docker.sock", "/run/../run/docker.sock",
                 "/var/run/../var/run/docker.sock",  # /var/run/.. is / (the symlink leads to /run)
                 "/var/run", "/run", "/run/", "/var", "/var/./run", "///run", "/run/user/1000/docker.sock",
                 "/var/snap/docker/common/run/docker.sock"]
HARMLESS_MOUNTS = ["/models", "/var/lib/hf", "/run/sparkctl", "/var/run/other.sock", "/home/me/docker.sock.bak",
                   "hf-cache", "/srv/run"]


@pytest.mark.parametrize("source", SOCKET_MOUNTS)
def test_a_mount_that_reaches_the_docker_socket_needs_its_opt_in(source: str) -> None:
    assert risks(mounts=[source]) == {"docker-socket"}
    with pytest.raises(ValidationError, match=r"add `allow: \[docker-socket\]`"):
        stack(mounts=[source])


@pytest.mark.parametrize("source", HARMLESS_MOUNTS)
def test_a_mount_beside_the_socket_needs_none(source: str) -> None:
    assert stack(mounts=[source]).risks() == []


@pytest.mark.parametrize("path", ["/", "//", "/.", "/./", "/var/..", "/run/../..", "/var/run/.."])
@pytest.mark.parametrize("side", ["source", "target"])
def test_the_root_is_refused_however_spelled(path: str, side: str) -> None:
    mount = {"source": "/models", "target": "/in"} | {side: path}
    with pytest.raises(ValidationError, match="whole host"):
        Stack.model_validate({"name": "s", "image": {"repository": "x/y", "tag": "v1"}, "model": {"repo": "a/b"},
                              "vllm": {}, "container": {"mounts": [mount]}})


REMOTE_CODE = [["--trust-remote-code"], ["--trust_remote_code"], ["--trust-remote-code=True"],
               ["--trust_remote_code=true"], ["--trust-remote_code"], ["--trust-remote"], ["--trust-rem=1"],
               ["--max-model-len", "4096", "--trust_remote_code"]]
NO_REMOTE_CODE = [[], ["--no-trust-remote-code"], ["--trust-request-chat-template"], ["-trust-remote-code"],
                  ["--max-model-len", "4096"]]


@pytest.mark.parametrize("args", REMOTE_CODE)
def test_every_spelling_of_trust_remote_code_needs_its_opt_in(args: list[str]) -> None:
    assert risks(args=args) == {"remote-code"}
    with pytest.raises(ValidationError, match=r"add `allow: \[remote-code\]`"):
        stack(args=args)


@pytest.mark.parametrize("args", NO_REMOTE_CODE)
def test_other_flags_are_not_remote_code(args: list[str]) -> None:
    assert stack(args=args).risks() == []


WIDE = [{"args": ["--host", "0.0.0.0"]}, {"args": ["--host=0.0.0.0"]}, {"args": ["--host=::"]},
        {"args": ["--hos", "0.0.0.0"]}, {"args": ["--host", "192.168.1.5"]}, {"args": ["--host", "myhost"]},
        {"args": ["--host", "127.0.0.1", "--host", "0.0.0.0"]}, {"args": ["--host="]}, {"host": "0.0.0.0"},
        {"host": "::"}, {"host": "10.0.0.1"}, {"host": "::ffff:0.0.0.0"}]
NARROW = [{}, {"args": ["--host", "127.0.0.1"]}, {"args": ["--host=::1"]}, {"args": ["--host", "localhost"]},
          {"host": "127.0.0.2"}, {"host": "[::1]"}, {"host": "0:0:0:0:0:0:0:1"}, {"args": ["--host-ip", "0.0.0.0"]},
          {"args": ["--host"]}]


@pytest.mark.parametrize("case", WIDE, ids=str)
def test_every_way_to_listen_beyond_loopback_needs_its_opt_in(case: dict) -> None:
    assert risks(**case) == {"all-interfaces"}
    with pytest.raises(ValidationError, match=r"add `allow: \[all-interfaces\]`"):
        stack(**case)


@pytest.mark.parametrize("case", NARROW, ids=str)
def test_loopback_needs_none(case: dict) -> None:
    assert stack(**case).risks() == []


@pytest.mark.parametrize(("arg", "read"), [("--trust_remote_code", "--trust-remote-code"),
                                           ("--compilation_config.cudagraph_mode=FULL",
                                            "--compilation-config.cudagraph_mode=FULL"),
                                           ("--x_y=a_b", "--x-y=a_b"), ("-O3", "-O3"), ("a_b", "a_b")])
def test_flag_names_read_underscores_as_dashes_up_to_the_value(arg: str, read: str) -> None:
    assert flag_name(arg) == read


parts = st.sampled_from(["", ".", "..", "var", "run", "docker.sock", "srv", "x"])


@given(st.lists(parts, max_size=8))
def test_a_path_reaches_the_socket_exactly_when_its_folded_form_does(names: list[str]) -> None:
    """Any spelling (extra slashes, `.`, `..`, the /var/run symlink) is judged as its folded path."""
    path = "/" + "/".join(names)
    folded = host_path(path)
    assert host_path(folded) == folded  # folding is idempotent
    assert reaches_docker_socket(path) == (reaches_docker_socket(folded)
                                           or reaches_docker_socket(host_path(path, follow=False)))
    if folded in ("/", "/run", "/run/docker.sock"):
        assert reaches_docker_socket(path)


@given(st.sampled_from(["--trust-remote-code", "--host"]), st.lists(st.booleans(), min_size=1, max_size=40),
       st.sampled_from(["", "=1", "=True"]))
def test_any_mix_of_dashes_and_underscores_is_the_same_flag(flag: str, underscores: list[bool], value: str) -> None:
    spelled = "--" + "".join("_" if c == "-" and underscores[i % len(underscores)] else c
                             for i, c in enumerate(flag[2:]))
    args = [spelled + value] if value else [spelled, "0.0.0.0"]
    expected = {"--trust-remote-code": "remote-code", "--host": "all-interfaces"}[flag]
    assert risks(args=args) == {expected}


@pytest.mark.parametrize(("host", "loopback"), [("127.0.0.1", True), ("127.9.9.9", True), ("::1", True),
                                                ("[::1]", True), ("LOCALHOST", True), ("0.0.0.0", False),
                                                ("::", False), ("", False), ("example.com", False)])
def test_loopback_is_judged_by_address(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


ROOT = Path(__file__).resolve().parents[2]


def dspark_stack(tmp_path: Path, body: str) -> Catalog:
    """The shipped catalog plus a stack `mine` built on the DSpark DFlash stack, in its own file."""
    shutil.copytree(ROOT / "stacks", tmp_path / "stacks", dirs_exist_ok=True)
    (tmp_path / "stacks" / "mine.yaml").write_text("name: mine\nextends: qwen36-dflash\n" + body)
    return load_catalog(tmp_path / "stacks", ROOT / "patches")


@pytest.mark.parametrize(("tokens", "refused"), [(10, False), (11, True), (16, True)])
def test_the_dspark_draft_takes_at_most_ten_speculative_tokens(tmp_path: Path, tokens: int, refused: bool) -> None:
    catalog = dspark_stack(tmp_path, f"vllm:\n  speculative:\n    num_speculative_tokens: {tokens}\n")
    if not refused:
        assert catalog.stack("mine").vllm.speculative.num_speculative_tokens == tokens
        return
    [invalid] = catalog.invalid
    assert invalid.file.name == "mine.yaml" and invalid.key == "vllm.speculative.num_speculative_tokens"
    assert f"{tokens} is more than the 10" in invalid.problem and "seed 000:10" in invalid.problem  # "K≤10"


def test_prefix_caching_with_the_dspark_draft_needs_its_opt_in_and_says_the_seeds_reason(tmp_path: Path) -> None:
    [invalid] = dspark_stack(tmp_path, "vllm:\n  enable_prefix_caching: true\n").invalid
    assert invalid.key == "vllm.enable_prefix_caching" and "hung with the DSpark draft" in invalid.problem
    assert "000:51" in invalid.problem and "allow: [prefix-caching]" in invalid.problem
    allowed = dspark_stack(tmp_path, "allow: [prefix-caching]\nvllm:\n  enable_prefix_caching: true\n")
    assert allowed.invalid == () and allowed.stack("mine").vllm.enable_prefix_caching


@pytest.mark.parametrize(("body", "refused"), [
    ("vllm:\n  enable_prefix_caching: null\n", True),  # vLLM V1 turns it on when no flag is given
    ("vllm:\n  enable_prefix_caching: false\n", False),
    ("vllm:\n  extra_args: [--enable-prefix-caching]\n", True),  # after the rendered --no-enable-...: it wins
    ("vllm:\n  extra_args: [--enable_prefix]\n", True),  # argparse's abbreviation, vLLM's `_` spelling
    ("vllm:\n  enable_prefix_caching: null\n  extra_args: [--enable-prefix-caching, --no-enable-prefix-caching]\n",
     False),  # the last one wins
    ("allow: [prefix-caching]\nvllm:\n  enable_prefix_caching: null\n", False),
])
def test_the_dspark_refusal_judges_prefix_caching_as_the_engine_will_run_it(tmp_path: Path, body: str,
                                                                           refused: bool) -> None:
    """Seed 000:51: the DSpark proposer with the aeon prefix-align patch hung with prefix caching on,
    whether a flag turns it on or vLLM's default does."""
    catalog = dspark_stack(tmp_path, body)
    if not refused:
        assert catalog.invalid == ()
        return
    [invalid] = catalog.invalid
    assert invalid.key == "vllm.enable_prefix_caching" and "000:51" in invalid.problem
    assert ("vLLM turns it on when no flag is given" in invalid.problem) is ("null" in body)
