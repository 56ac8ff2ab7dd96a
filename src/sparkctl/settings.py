"""sparkctl's settings: `SPARKCTL_*` environment variables, then `.env`, then defaults.

Built once by the CLI entry (or the daemon) and passed down; nothing deeper reads the
environment. Paths that hang off the state dir are derived here, so tests can redirect
everything by pointing `SPARKCTL_STATE_DIR` somewhere else. A message that names a setting's
variable takes it from `env_names` (a setting with aliases, like `hf_token`, is read from each).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from sparkctl import instance as instances
from sparkctl.instance import LOCK_FILE, SOCKET_FILE, STORE_FILE, default_config_dir, default_state_dir, resolve

_PACKAGE = Path(__file__).resolve().parent


def _data_dir(name: str) -> Path:
    """A checkout's top-level dir (stacks/, patches/, compose/), else the wheel's copy."""
    checkout = _PACKAGE.parents[1] / name
    return checkout if checkout.is_dir() else _PACKAGE / "_data" / name


# The names a Hugging Face token goes by in an environment: never handed to an engine.
SECRET_ENV = frozenset({"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HUGGINGFACE_TOKEN"})


PREFIX = "SPARKCTL_"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=PREFIX, env_file=".env", env_ignore_empty=True, extra="ignore", frozen=True
    )

    # One installation on a Docker engine: everything it creates carries this name, and it sees and
    # touches only its own containers. Derived from the state dir when not set (see `_instance`).
    instance: str = Field(default=instances.DEFAULT, pattern=instances.PATTERN)
    state_dir: Path = Field(default_factory=default_state_dir)
    hf_cache_dir: Path = Field(
        default_factory=lambda: Path(os.environ.get("HF_HOME") or Path.home() / ".cache/huggingface") / "hub")
    # The standard HF_TOKEN works too; it never leaves sparkctl (engines run offline).
    hf_token: SecretStr | None = Field(default=None, validation_alias=AliasChoices("SPARKCTL_HF_TOKEN", "HF_TOKEN"))
    docker_host: str | None = None
    registry_mirrors: Annotated[dict[str, str], NoDecode] = Field(default_factory=dict)
    gateway_host: str = "127.0.0.1"
    gateway_port: int = Field(default=8000, ge=1, le=65535)
    # Added to every stack's engine port: a second instance beside live stacks (81xx -> 91xx with 1000).
    port_offset: int = Field(default=0, ge=-8000, le=50000)
    # Optional keys agents must send to the gateway (`Authorization: Bearer <key>`), comma-separated.
    gateway_api_keys: Annotated[list[SecretStr], NoDecode] = Field(default_factory=list)
    gateway_metrics_key: bool = False  # also require a key on the gateway's /metrics
    # Names the gateway answers to in `Host` (besides its host, localhost, 127.0.0.1 and [::1]).
    gateway_hostnames: Annotated[list[str], NoDecode] = Field(default_factory=list)
    gateway_max_connections: int = Field(default=4096, ge=16)
    # A request that has not arrived whole this long after its first byte is answered 408 (slow uploads).
    gateway_upload_timeout: float = Field(default=60.0, gt=0)
    # A streamed answer whose engine sends nothing for this long is ended (retryable) and the engine ejected;
    # a whole (non-streamed) answer's engine has `first_byte_timeout` to send it (then 504, ejected the same way).
    gateway_stream_stall: float = Field(default=120.0, gt=0)
    gateway_first_byte_timeout: float = Field(default=600.0, gt=0)
    # Every proxied request ends by its deadline (504, or its answer broken off), and one whose client
    # reads nothing for `client_pause` at a stretch is ended and its connection dropped.
    gateway_request_deadline: float = Field(default=1800.0, gt=0)
    gateway_client_pause: float = Field(default=60.0, gt=0)
    memory_ceiling: float = Field(default=0.90, gt=0, le=1)
    # The memory the fractions above are of. Unset: what CUDA reports free when the daemon starts with
    # none of its engines running (a GB10 reports ~102 of its 121.7 GiB), kept in the state dir for
    # later starts; on a machine without CUDA, MemTotal.
    memory_total_gib: float | None = Field(default=None, gt=0)
    # The CUDA driver library the usable memory is asked of (cuMemGetInfo).
    cuda_library: str = "libcuda.so.1"
    # What an engine holds besides its weights and KV cache (activations at its batch size, CUDA
    # graphs, its CUDA context): taken off its fraction when its KV cache is sized. An estimate.
    engine_overhead_gib: float = Field(default=4.0, ge=0)
    # GB10's sleep rules (vLLM #50011): an engine sleeps only when a wake re-maps at most this much
    # KV cache (a 37.29 GiB wake worked there, a 78 GiB one froze the host), and one engine at a time.
    wake_kv_max_gib: float = Field(default=32.0, ge=0)
    sleep_one_at_a_time: bool = True
    # What a parked (sleeping) engine keeps at either level: its process, CUDA context and graphs.
    park_residue_gib: float = Field(default=2.0, ge=0)
    # While a parked stack wakes, the daemon kills it (and starts it cold) if MemAvailable falls
    # under this; the sentinel stops the engine that grew last when MemAvailable falls under it, or
    # falls fast towards it: a dead engine is recoverable, a host frozen by unified memory is not.
    wake_memory_floor_gib: float = Field(default=4.0, ge=0)
    # The sentinel's kernel log: "auto" (/dev/kmsg, which needs CAP_SYSLOG, else `journalctl -k`),
    # "none", or a path (a file or FIFO; tests append NVRM lines to one). MemAvailable is read from
    # `meminfo_path`. A stack whose engine generates no token for `hang_after` seconds while
    # requests run is restarted.
    sentinel: bool = True
    kernel_log: str = "auto"
    meminfo_path: Path = Path("/proc/meminfo")
    hang_after: float = Field(default=60.0, gt=0)
    # "auto": give engines the GPU when Docker has the NVIDIA runtime (a Spark), else run without.
    gpus: Literal["auto", "all", "none"] = "auto"
    # Extra environment for every engine container (e.g. VLLM_LOGGING_LEVEL=DEBUG, or
    # SPARKCTL_SIM_TIME_SCALE for the simulated engine); part of each deployment's fingerprint.
    engine_env: Annotated[dict[str, str], NoDecode] = Field(default_factory=dict)
    hf_endpoint: str | None = Field(default=None, validation_alias=AliasChoices("SPARKCTL_HF_ENDPOINT", "HF_ENDPOINT"))
    # The daemon's API is a unix socket; a loopback TCP listener is opened only when both are set.
    api_tcp: str | None = Field(default=None, pattern=r"^(127\.\d+\.\d+\.\d+|localhost|\[::1\]):\d+$")
    api_token: SecretStr | None = None
    # The daemon: resync interval, crash-loop rule (N failures inside a window), restart backoff.
    resync_interval: float = Field(default=30.0, gt=0)
    crash_loop: int = Field(default=5, ge=1)
    crash_window: float = Field(default=600.0, gt=0)
    restart_backoff_base: float = Field(default=1.0, ge=0)
    restart_backoff_max: float = Field(default=60.0, ge=0)
    # Switching an alias: a held request waits at most `hold_timeout` (then 503 + Retry-After), at
    # most `hold_queue` requests wait per alias, in-flight requests get `drain_timeout` to finish.
    switch_hold_timeout: float = Field(default=300.0, gt=0)
    switch_hold_queue: int = Field(default=1024, ge=1)
    switch_drain_timeout: float = Field(default=120.0, ge=0)
    # Benchmarks: llama-benchy's prompt corpus. "book": its own default book (the seeds' method;
    # downloaded once, then cached in ~/.cache/llama-benchy); "loopback": sparkctl's generated
    # corpus, served on 127.0.0.1; "auto": the book when cached or its host answers, else loopback.
    bench_corpus: Literal["auto", "book", "loopback"] = "auto"
    # Skip llama-benchy's coherence check (it asks for the capital of France and wants "Paris"):
    # for engines that serve random weights or the simulated engine, whose replies mean nothing.
    bench_skip_coherence: bool = False
    # The machine's memory bandwidth, for the report's decode efficiency (GB10: ~273 GB/s).
    memory_bandwidth_gbs: float = Field(default=273.0, gt=0)
    # The fleet (`sparkctl fleet`): the inventory (default: fleet.yaml in the state dir), the bound on
    # every Ray call, how long Ray waits before it declares a silent node dead (unset: Ray's own,
    # about 15 s), the object store each node keeps (in shared memory: on a Spark it is model memory),
    # and the CPUs a node advertises (unset: all).
    fleet_file: Path | None = None
    fleet_ray_timeout: float = Field(default=60.0, gt=0, le=3600)
    fleet_dead_after: float | None = Field(default=None, ge=0.3, le=600)
    fleet_object_store_mib: int = Field(default=512, ge=80)
    fleet_num_cpus: int | None = Field(default=None, ge=1)
    # A host's agent deploying a placed stack (pull, weights, start) gets this long; when a host
    # dies, the daemon waits this long for Ray to re-place its stacks before it gives up (logged).
    fleet_deploy_timeout: float = Field(default=1800.0, gt=0)
    fleet_replace_within: float = Field(default=120.0, gt=0)
    # A host's engine relays hold at most this many connections that have not shown the fleet's
    # credential (a newcomer closes the oldest of the peer holding the most), each for at most
    # this many seconds: a flood from the LAN cannot use up the agent's files.
    fleet_relay_unauthenticated: int = Field(default=64, ge=1)
    fleet_relay_credential_within: float = Field(default=5.0, gt=0)
    # What sparkctl ships, read only: the stacks (and their images.yaml), patch sets and compose projects.
    stacks_dir: Path = Field(default_factory=lambda: _data_dir("stacks"))
    patches_dir: Path = Field(default_factory=lambda: _data_dir("patches"))
    compose_dir: Path = Field(default_factory=lambda: _data_dir("compose"))
    # The owner's own, edited by hand and never written by sparkctl: stacks/*.yaml (one named like a
    # shipped stack replaces it) and images.yaml (laid over the shipped policy).
    config_dir: Path = Field(default_factory=default_config_dir)

    @model_validator(mode="before")
    @classmethod
    def _instance(cls, data: Any) -> Any:
        """An instance and its state dir name each other (`instance.resolve`, which the CLI's
        daemon client uses too)."""
        if not isinstance(data, dict):
            return data
        name, state = resolve(data.get("instance"), data.get("state_dir"))
        return {**data, **({"instance": name} if name else {}), **({"state_dir": state} if state else {})}

    @field_validator("hf_token", "api_token", mode="before")
    @classmethod
    def _clean_secret(cls, value: Any) -> Any:
        """Tokens read from a file often end in a newline (or CRLF): strip it. Whitespace or control
        characters inside are refused; the message never repeats the value."""
        if not isinstance(value, str):
            return value
        value = value.strip()
        if any(c.isspace() or not c.isprintable() for c in value):
            raise ValueError("holds whitespace or control characters inside; check how the token was pasted")
        return value or None

    @field_validator("gateway_api_keys", "gateway_hostnames", mode="before")
    @classmethod
    def _split_keys(cls, value: Any) -> Any:
        return [k.strip() for k in value.split(",") if k.strip()] if isinstance(value, str) else value

    @field_validator("registry_mirrors", "engine_env", mode="before")
    @classmethod
    def _parse_pairs(cls, value: Any) -> Any:
        """Accept `KEY=VALUE,KEY=VALUE` (e.g. `ghcr.io=127.0.0.1:5001`) as well as a mapping."""
        if not isinstance(value, str):
            return value
        pairs = [item.split("=", 1) for item in value.split(",") if item.strip()]
        if any(len(pair) != 2 for pair in pairs):
            raise ValueError("expected KEY=VALUE[,KEY=VALUE...]")
        return {key.strip(): mirror.strip() for key, mirror in pairs}

    @field_validator("engine_env")
    @classmethod
    def _no_token(cls, env: dict[str, str]) -> dict[str, str]:
        """It reaches every engine container and the fingerprint: never a token."""
        if SECRET_ENV & env.keys():
            raise ValueError("must not hold a Hugging Face token: engines run offline and sparkctl keeps the "
                             "token (SPARKCTL_HF_TOKEN)")
        return env

    @property
    def images_file(self) -> Path:
        """The shipped image policy."""
        return self.stacks_dir / "images.yaml"

    @property
    def owner_stacks_dir(self) -> Path:
        return self.config_dir / "stacks"

    @property
    def owner_images_file(self) -> Path:
        return self.config_dir / "images.yaml"

    @property
    def gateway_names(self) -> list[str]:
        """Every name the gateway accepts in `Host`."""
        host = f"[{self.gateway_host}]" if ":" in self.gateway_host else self.gateway_host
        return sorted({host, "localhost", "127.0.0.1", "[::1]", *self.gateway_hostnames})

    @property
    def socket_path(self) -> Path:
        """The daemon's API socket."""
        return self.state_dir / SOCKET_FILE

    @property
    def store_path(self) -> Path:
        return self.state_dir / STORE_FILE

    @property
    def lock_path(self) -> Path:
        """The file a daemon holds an exclusive lock on while it runs on this state dir."""
        return self.state_dir / LOCK_FILE

    @property
    def dashboard_key_path(self) -> Path:
        """The dashboard owner's key (0600): `sparkctl dashboard`'s login URLs are made from it."""
        return self.state_dir / "dashboard.key"

    @property
    def gateway_url(self) -> str:
        """Where a browser or an agent on this Spark reaches the gateway."""
        host = "127.0.0.1" if self.gateway_host in ("0.0.0.0", "::", "") else self.gateway_host  # noqa: S104
        return f"http://[{host}]:{self.gateway_port}" if ":" in host else f"http://{host}:{self.gateway_port}"

    @property
    def fleet_dir(self) -> Path:
        """This Spark's fleet state: the Ray token (0600), the record of its node, Ray's temp dir."""
        return self.state_dir / "fleet"

    @property
    def fleet_path(self) -> Path:
        return self.fleet_file or self.state_dir / "fleet.yaml"

    @property
    def overlays_dir(self) -> Path:
        return self.state_dir / "overlays" / self.instance

    def secrets(self) -> list[str]:
        """Every configured secret value, for the log redactor."""
        secrets = (self.hf_token, self.api_token, *self.gateway_api_keys)
        return [s.get_secret_value() for s in secrets if s and s.get_secret_value()]

    def masked(self) -> dict[str, Any]:
        """The settings as plain values with secrets masked, for `sparkctl config show`."""
        shown = {}
        for name in type(self).model_fields:
            value = getattr(self, name)
            if isinstance(value, SecretStr):
                value = "**********" if value.get_secret_value() else ""
            elif isinstance(value, list) and value and isinstance(value[0], SecretStr):
                value = ["**********"] * len(value)
            shown[name] = str(value) if isinstance(value, Path) else value
        return shown


def env_names(field: str) -> tuple[str, ...]:
    """The environment variables a setting is read from, the one that wins first: its aliases
    when it has them (`hf_token`: SPARKCTL_HF_TOKEN, then HF_TOKEN), else the prefixed name."""
    alias = Settings.model_fields[field].validation_alias
    if isinstance(alias, AliasChoices):
        return tuple(str(choice) for choice in alias.choices)
    return (alias,) if isinstance(alias, str) else (PREFIX + field.upper(),)


def invalid(error: ValidationError, environ: Mapping[str, str]) -> str:
    """What to tell a person whose settings do not validate: the variable they set (of a setting's
    names, the one `environ` holds; all of them when it came from .env), and what is wrong with
    it. Never the value: it may be a token."""
    first = error.errors()[0]
    loc = [str(part) for part in first["loc"]]
    problem = first["msg"].removeprefix("Value error, ")
    field = next((f for f in Settings.model_fields if loc and (loc[0] == f or loc[0] in env_names(f))), None)
    if field is None:
        return f"the settings are invalid: {problem}"
    names = env_names(field)
    held = {name.upper() for name in environ}
    named = next((n for n in names if n.upper() in held), " or ".join(names))
    return f"setting {named} is invalid: {problem}; fix it where it is set (the environment or .env)"
