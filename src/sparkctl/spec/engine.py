"""The sections of a stack that say what runs and how: the engine image, the weights, vLLM's
arguments and container, or an existing compose project.

`render.py` turns them into a container plan and the deploy pipeline fetches what they name;
`models.py` puts them together into a Stack. Engines run offline, so no section may carry a
Hugging Face token.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from sparkctl.settings import SECRET_ENV
from sparkctl.spec.base import SIZE, Port, RelativePath, Revision, Spec
from sparkctl.spec.risks import is_root, reaches_docker_socket


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
    # Accepted by vLLM V1 and ignored: speculation stays on past it (vLLM #52258). `stacks validate`
    # says so and points at a routed alias (`sparkctl route set`).
    max_model_len: int | None = Field(default=None, ge=16)

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
        if is_root(path):
            raise ValueError("mounting / hands the whole host to the engine (or hides its own filesystem)")
        return path

    @property
    def docker_socket(self) -> bool:
        """Whether the mount hands the engine the Docker socket, however the path is spelled."""
        return reaches_docker_socket(self.source)


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
    # The engine's own /dev/shm (`ipc: private|shareable`) is carved from unified memory: it counts
    # in the stack's footprint. Docker ignores it with `ipc: host` (the host's /dev/shm is used).
    shm_size: str = Field(default="16g", pattern=SIZE.pattern)
    gpus: Literal["all", "none"] | Annotated[int, Field(ge=1)] = "all"
    env: dict[str, str] = {}
    mounts: tuple[Mount, ...] = ()
    compile_cache: str | None = Field(default=None, pattern=r"^/")

    _no_secrets = field_validator("env")(no_secret_names)


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

