"""The declarative models of a serving stack and of a patch set.

Every model is frozen and forbids unknown keys, so a typo in a stack file fails loudly with
the key and the allowed names. `load.py` builds these from YAML; `render.py` turns a stack
into a container plan; policy and deploy code read them and never change them.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from sparkctl.settings import SECRET_ENV


def inside(value: str) -> str:
    """A path that stays inside the folder it is relative to: not absolute, no `..` part."""
    parts = value.split("/")
    if value.startswith("/") or ".." in parts or "" in parts[:-1] or "\\" in value:
        raise ValueError(f"{value!r} must be a relative path inside its folder (no leading /, no ..)")
    return value


RelativePath = Annotated[str, Field(min_length=1), AfterValidator(inside)]
# A branch, tag or `refs/...` name, or a commit hash: what the Hub accepts as a revision.
Revision = Annotated[str, Field(max_length=255, pattern=r"^[A-Za-z0-9_][\w.+/-]*$"), AfterValidator(inside)]
Name = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,62}$")]
Port = Annotated[int, Field(ge=1, le=65535)]
Seconds = Annotated[float, Field(gt=0, le=86_400)]
Fraction = Annotated[float, Field(gt=0, le=1)]
SIZE = re.compile(r"^\d+(\.\d+)?[bkmg]?$", re.IGNORECASE)


class Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Kind(StrEnum):
    VLLM = "vllm"  # sparkctl renders and runs the engine container itself
    COMPOSE = "compose"  # an existing compose project, brought up through compose v2


class Image(Spec):
    repository: str = Field(min_length=1, pattern=r"^[a-z0-9][a-z0-9._/:-]*$")
    tag: str | None = Field(default=None, pattern=r"^[\w][\w.-]{0,127}$")
    digest: str | None = Field(default=None, pattern=r"^sha256:[0-9a-f]{64}$")
    allow_latest: bool = False  # opt in to a moving `latest`/untagged ref

    @property
    def ref(self) -> str:
        """The ref as written: `repo:tag`, `repo@digest` or `repo:tag@digest`."""
        tag = f":{self.tag}" if self.tag else ""
        digest = f"@{self.digest}" if self.digest else ""
        return f"{self.repository}{tag}{digest}"


class Weights(Spec):
    """A Hugging Face repo at a revision, or a directory already on this machine."""

    repo: str | None = Field(default=None, pattern=r"^[\w.-]+/[\w.-]+$")
    revision: Revision = "main"
    path: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> Weights:
        if (self.repo is None) == (self.path is None):
            raise ValueError("give exactly one of `repo` (a Hugging Face repo id) or `path`")
        return self


class Speculative(Spec):
    method: Literal["dflash", "eagle", "eagle3", "mtp", "ngram", "draft_model"]
    num_speculative_tokens: int = Field(ge=1, le=16)
    draft_sample_method: Literal["greedy", "probabilistic"] | None = None
    attention_backend: str | None = None
    prompt_lookup_max: int | None = Field(default=None, ge=1)
    prompt_lookup_min: int | None = Field(default=None, ge=1)

    @property
    def needs_draft(self) -> bool:
        return self.method not in ("ngram", "mtp")


class VllmArgs(Spec):
    """`vllm serve` flags, typed. Anything not modelled goes through `extra_args`."""

    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: Port = 8000
    max_model_len: int | None = Field(default=None, ge=16)
    enable_prefix_caching: bool | None = None
    enable_chunked_prefill: bool | None = None
    attention_backend: str | None = None
    mamba_cache_dtype: str | None = None
    max_num_seqs: int | None = Field(default=None, ge=1)
    max_num_batched_tokens: int | None = Field(default=None, ge=1)
    kv_cache_dtype: str | None = None
    quantization: str | None = None
    compilation_config: dict[str, object] | None = None
    tensor_parallel_size: int = Field(default=1, ge=1)
    distributed_executor_backend: Literal["ray", "mp"] | None = None
    enforce_eager: bool = False
    speculative: Speculative | None = None
    extra_args: tuple[str, ...] = ()


class Mount(Spec):
    source: str = Field(min_length=1)
    target: str = Field(pattern=r"^/")
    read_only: bool = True

    @field_validator("source", "target")
    @classmethod
    def _not_the_root(cls, path: str) -> str:
        if path.rstrip("/") == "":
            raise ValueError("mounting / hands the whole host to the engine (or hides its own filesystem)")
        return path

    @property
    def docker_socket(self) -> bool:
        return self.source.rstrip("/") in DOCKER_SOCKETS


DOCKER_SOCKETS = frozenset({"/var/run/docker.sock", "/run/docker.sock"})
LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
# What a stack must opt into by name (`allow:`): sometimes right, never by accident.
Risk = Literal["docker-socket", "all-interfaces", "remote-code"]


def no_secret_names(env: dict[str, str]) -> dict[str, str]:
    leaked = SECRET_ENV & env.keys()
    if leaked:
        raise ValueError(
            f"{sorted(leaked)[0]} must not be set here: engines run offline (HF_HUB_OFFLINE=1) and "
            "the token stays in sparkctl's settings (SPARKCTL_HF_TOKEN)"
        )
    return env


class Container(Spec):
    # Some engine images (aeon) have /bin/bash as ENTRYPOINT: always name `vllm` explicitly.
    entrypoint: tuple[str, ...] | None = ("vllm",)
    ipc: Literal["host", "private", "shareable"] = "host"
    shm_size: str = Field(default="16g", pattern=SIZE.pattern)
    gpus: Literal["all", "none"] | Annotated[int, Field(ge=1)] = "all"
    env: dict[str, str] = {}
    mounts: tuple[Mount, ...] = ()
    compile_cache: str | None = Field(default=None, pattern=r"^/")

    _no_secrets = field_validator("env")(no_secret_names)


class Resources(Spec):
    # vLLM reserves this fraction of unified memory up front; admission sums it.
    gpu_memory_utilization: Fraction = 0.80
    # GB read from memory per decoded token (the weights; for MoE the active experts), for the
    # report's decode efficiency against the bandwidth bound. An estimate; None leaves it out.
    read_per_token_gb: float | None = Field(default=None, gt=0)


class Health(Spec):
    """Budgets per phase of the health check, in seconds."""

    start: Seconds = 60
    load: Seconds = 1800
    ready: Seconds = 120
    canary: Seconds = 120


class Canary(Spec):
    prompt: str = Field(default="Reply with one short sentence: what is 2 + 2?", min_length=1)
    max_tokens: int = Field(default=32, ge=1, le=4096)


class Expectations(Spec):
    min_decode_tps: float | None = Field(default=None, gt=0)  # at depth 0, single stream
    min_acceptance: float | None = Field(default=None, ge=0, le=1)
    max_drop: float | None = Field(default=None, gt=0, lt=1)  # vs the last known-good run
    min_concurrency: int | None = Field(default=None, ge=1)  # must not crash at this many


class SwitchOver(Spec):
    # The quick benchmark when this stack becomes an alias's target: as a gate before the flip
    # (a failure rolls the switch back), right after the queue is released, or not at all.
    bench: Literal["gate", "after", "off"] = "after"


class KnownIssue(Spec):
    text: str = Field(min_length=1)
    max_concurrency: int | None = Field(default=None, ge=1)  # enforced by the gateway


class ComposeProject(Spec):
    project: RelativePath  # a directory under the compose dir
    service: str = Field(min_length=1)  # the service that serves the endpoint
    served_model_name: str = Field(min_length=1)
    port: Port
    env: dict[str, str] = {}

    @field_validator("env")
    @classmethod
    def _one_line_each(cls, env: dict[str, str]) -> dict[str, str]:
        """Each entry becomes a line of the project's env file: a newline would add lines of its own."""
        for key, value in env.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key) or "\n" in value or "\r" in value:
                raise ValueError(f"{key!r}: names are identifiers and values one line (no newline)")
        return no_secret_names(env)


class Stack(Spec):
    name: Name
    kind: Kind = Kind.VLLM
    description: str = ""
    abstract: bool = False  # a base for `extends`, never deployed
    extends: Name | None = None
    image: Image
    model: Weights | None = None
    draft: Weights | None = None
    patches: tuple[Name, ...] = ()
    vllm: VllmArgs | None = None
    compose: ComposeProject | None = None
    container: Container = Container()
    resources: Resources = Resources()
    health: Health = Health()
    canary: Canary = Canary()
    bench_profile: Literal["quick", "seed", "concurrency"] = "quick"
    expectations: Expectations = Expectations()
    switch: SwitchOver = SwitchOver()
    known_issues: tuple[KnownIssue, ...] = ()
    allow: tuple[Risk, ...] = ()  # opt-ins for what is sometimes right: see `risks`

    @model_validator(mode="after")
    def _consistent(self) -> Stack:
        if self.abstract:
            return self
        if self.kind is Kind.VLLM:
            if self.vllm is None or self.model is None:
                raise ValueError("a `vllm` stack needs `model` and `vllm`")
            if self.compose is not None:
                raise ValueError("`compose` belongs to kind `compose` only")
            spec = self.vllm.speculative
            if spec and spec.needs_draft and self.draft is None:
                raise ValueError(f"speculative method {spec.method!r} needs a `draft`")
        elif self.compose is None:
            raise ValueError("a `compose` stack needs `compose`")
        if self.draft is not None and (self.vllm is None or self.vllm.speculative is None):
            raise ValueError("`draft` is set but `vllm.speculative` is not")
        return self

    @model_validator(mode="after")
    def _opted_in(self) -> Stack:
        missing = [(risk, where) for risk, where in self.risks() if risk not in self.allow]
        if missing:
            risk, where = missing[0]
            raise ValueError(f"{where}; add `allow: [{risk}]` to the stack if you mean it")
        return self

    def risks(self) -> list[tuple[str, str]]:
        """What this stack does that is sometimes right and never by accident: (opt-in, why)."""
        found = []
        if any(m.docker_socket for m in self.container.mounts):
            found.append(("docker-socket", "container.mounts: the Docker socket gives the engine root on the host"))
        if self.vllm is not None:
            args = self.vllm.extra_args
            hosts = [self.vllm.host] + [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--host"]
            hosts += [a.split("=", 1)[1] for a in args if a.startswith("--host=")]
            if any(h not in LOOPBACK for h in hosts):
                found.append(("all-interfaces", "vllm.host / extra_args: the engine listens beyond loopback, "
                                                "where the gateway's API keys do not guard it"))
            if "--trust-remote-code" in args:
                found.append(("remote-code", "vllm.extra_args: --trust-remote-code runs Python from the model repo"))
        return found

    @property
    def served_name(self) -> str:
        if self.compose is not None:
            return self.compose.served_model_name
        assert self.vllm is not None
        return self.vllm.served_model_name or self.name

    @property
    def port(self) -> int:
        return self.compose.port if self.compose else self.vllm.port  # type: ignore[union-attr]

    @property
    def url(self) -> str:
        """Where sparkctl reaches the engine (it listens on loopback; the gateway is what agents use)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def max_concurrency(self) -> int | None:
        caps = [i.max_concurrency for i in self.known_issues if i.max_concurrency]
        return min(caps) if caps else None


class Overlay(Spec):
    """A whole file from the draft snapshot, laid over a path in vLLM's package dir."""

    source: str = Field(pattern=r"^(draft|model):.+")
    target: Annotated[RelativePath, Field(pattern=r"^[\w./-]+\.py$")]

    @field_validator("source")
    @classmethod
    def _source_inside(cls, value: str) -> str:
        inside(value.partition(":")[2])
        return value


class Shim(Spec):
    """Class-level attribute defaults inserted into a class of a vLLM source file."""

    file: Annotated[RelativePath, Field(pattern=r"^[\w./-]+\.py$")]
    class_name: str = Field(alias="class", pattern=r"^[A-Za-z_]\w*$")
    attributes: dict[str, str] = Field(min_length=1)


class PatchSet(Spec):
    name: Name
    description: str = ""
    overlays: tuple[Overlay, ...] = ()
    shims: tuple[Shim, ...] = ()
    diffs: tuple[RelativePath, ...] = ()  # unified diff files, relative to the patches dir
