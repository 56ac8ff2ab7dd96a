"""The sections of a stack that say what runs and how: the engine image, the weights, vLLM's
arguments and container, or an existing compose project.

`render.py` turns them into a container plan and the deploy pipeline fetches what they name;
`models.py` puts them together into a Stack. Engines run offline, so no section may carry a
Hugging Face token; and a section may not set what sparkctl sets itself (a compose project's
variables, the engine's offline and dev-mode switches, vLLM's `--config` file, whose flags no
check would see): a stack file can only add to what sparkctl gives the engine, never replace it.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from sparkctl.settings import SECRET_ENV
from sparkctl.spec.base import SIZE, Port, RelativePath, Revision, Spec
from sparkctl.spec.risks import flag_name, flag_values, is_root, reaches_docker_socket

# The variables sparkctl gives a compose project (`Launch.compose`): a stack's `compose.env` adds
# to them and may not replace one (a base image the policy never judged, the engine's address,
# the folders it mounts).
COMPOSE_VARIABLES = frozenset({"BASE_IMAGE", "IMAGE", "FINGERPRINT", "HOST", "PORT", "HF_HUB_OFFLINE",
                               "SERVED_MODEL_NAME", "HF_HUB_CACHE_DIR", "COMPILE_CACHE", "GPU_MEMORY_UTILIZATION",
                               "MODEL_ID"})
# The engine variables sparkctl sets (render.py, ranks.py): offline, sleep mode's dev routes, a
# rank's address (its interfaces are replaced in a rank's env anyway). `container.env` may not set them.
ENGINE_VARIABLES = frozenset({"HF_HUB_OFFLINE", "VLLM_SERVER_DEV_MODE", "VLLM_HOST_IP"})
DEFAULT_ENTRYPOINT = ("vllm",)
# Compose's own rule for a service's name (compose-spec: `^[a-zA-Z0-9._-]+$`), starting with a letter or digit.
SERVICE = r"^[a-zA-Z0-9][a-zA-Z0-9._-]*$"


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
    # A folder on the host that runs the engine: outside sparkctl's own folders it needs
    # `allow: [host-path]` (deploy/binds.py judges it where it is mounted).
    path: str | None = Field(default=None, pattern=r"^/")

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

    @property
    def prefix_caching(self) -> bool:
        """Whether the engine will cache prefixes, read as vLLM reads the command: the last
        `--[no-]enable-prefix-caching` in `extra_args` (rendered after this section's flags), else
        `enable_prefix_caching`, else vLLM V1's default when no flag is given, which is on for a
        generating model (`EngineArgs` takes `ModelConfig.is_prefix_caching_supported`)."""
        toggles = [name for arg in self.extra_args if _prefix_toggle(name := flag_name(arg).partition("=")[0])]
        if toggles:
            return not toggles[-1].startswith("--no-")
        return True if self.enable_prefix_caching is None else self.enable_prefix_caching

    @field_validator("extra_args")
    @classmethod
    def _no_config_file(cls, args: tuple[str, ...]) -> tuple[str, ...]:
        """vLLM reads `--config FILE` as more flags, from a file inside the container that no check
        here can read: its flags go in this section or in `extra_args`, where they are judged."""
        if flag_values(args, "--config"):
            raise ValueError("--config makes vLLM read more flags from a file no check of sparkctl's sees: "
                             "put those flags in the stack's `vllm` section or in `extra_args` instead")
        return args


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


def not_ours(env: dict[str, str], ours: frozenset[str], where: str) -> dict[str, str]:
    taken = sorted(ours & env.keys())
    if taken:
        raise ValueError(f"{taken[0]} is set by sparkctl itself ({where}): a stack may add variables, not replace "
                         f"these: {', '.join(sorted(ours))}")
    return env


class Container(Spec):
    # Some engine images (aeon) have /bin/bash as ENTRYPOINT: always name `vllm` explicitly. Any
    # other (a wrapper, or None: the image's own) needs `allow: [entrypoint]`: it can rewrite the
    # command sparkctl judged.
    entrypoint: tuple[str, ...] | None = DEFAULT_ENTRYPOINT
    ipc: Literal["host", "private", "shareable"] = "host"
    # The engine's own /dev/shm (`ipc: private|shareable`) is carved from unified memory: it counts
    # in the stack's footprint. Docker ignores it with `ipc: host` (the host's /dev/shm is used).
    shm_size: str = Field(default="16g", pattern=SIZE.pattern)
    gpus: Literal["all", "none"] | Annotated[int, Field(ge=1)] = "all"
    env: dict[str, str] = {}
    mounts: tuple[Mount, ...] = ()
    compile_cache: str | None = Field(default=None, pattern=r"^/")

    @field_validator("env")
    @classmethod
    def _adds_only(cls, env: dict[str, str]) -> dict[str, str]:
        return not_ours(no_secret_names(env), ENGINE_VARIABLES, "offline mode, sleep mode, a rank's address")

    @property
    def vllm_env(self) -> list[str]:
        """The vLLM settings this section sets by environment (`VLLM_*`): `allow: [vllm-env]`."""
        return sorted(k for k in self.env if k.upper().startswith("VLLM_"))


class ComposeProject(Spec):
    project: RelativePath  # a directory under the compose dir
    service: str = Field(pattern=SERVICE)  # the service that serves the endpoint
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
            if key.upper().startswith(("COMPOSE_", "DOCKER_")):  # compose reads these from the env file as its own
                raise ValueError(f"{key} would configure docker compose itself (its files, profiles, endpoint), "
                                 "not the project: sparkctl sets how compose runs")
        return not_ours(no_secret_names(env), COMPOSE_VARIABLES, "its image, address, folders and weights")


def _prefix_toggle(name: str) -> bool:
    """Whether a flag turns vLLM's prefix caching on or off, as argparse takes its abbreviations (a
    shorter prefix than `--enable-prefix` is shared with other flags: the engine refuses it)."""
    return any(full.startswith(name) and name.startswith(least) for full, least in
               (("--enable-prefix-caching", "--enable-prefix"), ("--no-enable-prefix-caching", "--no-enable-prefix")))
