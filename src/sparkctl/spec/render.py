"""Render a vLLM stack into a container plan: image, entrypoint, command, env, mounts, labels.

Pure and deterministic: the same stack and sources give the same plan, byte for byte, so the
spec hash is stable and golden tests can pin it. The deploy pipeline feeds the plan to the
Docker adapter; `sparkctl stacks render` prints it as `docker run`, compose or JSON.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from sparkctl import instance as instances
from sparkctl.container import (
    LABEL_FINGERPRINT,
    LABEL_MEMORY,
    LABEL_PLACED,
    LABEL_RANK,
    LABEL_RELAY,
    LABEL_SPEC_HASH,
    LABEL_STACK,
)
from sparkctl.spec.models import Kind, Stack
from sparkctl.spec.ranks import NETWORK_ENV, Rank, rank_args, rank_env

MODEL_DIR = "/model"
DRAFT_DIR = "/draft"
# A gated container's command: a shell that, the first time the container runs, waits for one
# line on its stdin before it becomes the engine (`ContainerPlan.gated`).
GATE_OPENED = "/tmp/.sparkctl-gate-opened"
GATE = f'[ -e {GATE_OPENED} ] || {{ read -r _; touch {GATE_OPENED}; }}; exec "$@"'


@dataclass(frozen=True)
class Sources:
    """Where the things a stack needs are on the host (known once the deploy fetched them)."""

    model_dir: str  # mounted at /model
    draft_dir: str | None = None  # mounted at /draft
    # Inside those mounts, where the files are: the HF cache keeps a snapshot's files as
    # symlinks into the repo's blobs/, so the whole repo folder is mounted and the engine is
    # pointed at snapshots/<commit> in it.
    model_subpath: str = ""
    draft_subpath: str = ""
    overlays: tuple[tuple[str, str], ...] = ()  # (host file, path inside the container)
    compile_cache_dir: str | None = None


@dataclass(frozen=True)
class MountPlan:
    source: str
    target: str
    read_only: bool = True


@dataclass(frozen=True)
class ContainerPlan:
    name: str
    image: str
    entrypoint: tuple[str, ...] | None
    command: tuple[str, ...]
    env: dict[str, str]
    mounts: tuple[MountPlan, ...]
    labels: dict[str, str]
    ipc_mode: str
    shm_size: str
    gpus: str | int
    network_mode: str = "host"
    init: bool = False  # Docker's --init: a tiny init as PID 1 that reaps the engine's children
    stdin_open: bool = False  # Docker's -i: the container's stdin stays open (a gated one waits on it)
    extra: dict[str, Any] = field(default_factory=dict)

    def gated(self, image_entrypoint: Sequence[str] | None) -> ContainerPlan:
        """This container with its engine behind a gate: started, it runs a shell that waits for a
        line on its stdin (`DockerEngine.open_gate`) and then execs the engine's command, so the
        container's start (namespaces, mounts, GPU hooks) can happen before the engine may take
        memory. Started again later (a restart, a rollback), it runs the engine at once.
        `image_entrypoint`: the image's, which the engine's command runs through unless the
        stack names its own."""
        engine = self.entrypoint if self.entrypoint is not None else tuple(image_entrypoint or ())
        return replace(self, entrypoint=("/bin/sh", "-c", GATE, "sparkctl-gate", *engine), stdin_open=True)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    def docker_run(self) -> str:
        args = ["docker", "run", "-d", "--name", self.name, "--network", self.network_mode,
                "--ipc", self.ipc_mode, "--shm-size", self.shm_size, *(["--init"] if self.init else []),
                *(["-i"] if self.stdin_open else [])]
        if self.gpus != "none":
            args += ["--gpus", str(self.gpus)]
        for key, value in self.labels.items():
            args += ["--label", f"{key}={value}"]
        for key, value in self.env.items():
            args += ["-e", f"{key}={value}"]
        for m in self.mounts:
            args += ["-v", f"{m.source}:{m.target}" + (":ro" if m.read_only else "")]
        if self.entrypoint:
            args += ["--entrypoint", self.entrypoint[0]]
        args += [self.image, *(self.entrypoint or ())[1:], *self.command]
        return shlex.join(args)

    def compose_service(self) -> dict[str, Any]:
        service: dict[str, Any] = {
            "image": self.image, "container_name": self.name, "network_mode": self.network_mode,
            "ipc": self.ipc_mode, "shm_size": self.shm_size, "labels": dict(self.labels),
            "environment": dict(self.env),
            "volumes": [f"{m.source}:{m.target}" + (":ro" if m.read_only else "") for m in self.mounts],
        }
        if self.entrypoint:
            service["entrypoint"] = list(self.entrypoint)
        service["command"] = list(self.command)
        if self.gpus != "none":
            count = "all" if self.gpus == "all" else self.gpus
            service["deploy"] = {"resources": {"reservations": {"devices": [
                {"driver": "nvidia", "count": count, "capabilities": ["gpu"]}]}}}
        return {"services": {self.labels[LABEL_STACK]: service}}


def spec_hash(stack: Stack) -> str:
    """A short, stable hash of everything the stack file says (after `extends`) about its engine.
    Defaults are left out, so a new optional field in a later sparkctl does not redeploy every
    stack; so is `placement`: moving or adding replicas does not change an engine."""
    canonical = json.dumps(stack.model_dump(mode="json", by_alias=True, exclude_defaults=True,
                                            exclude={"placement"}), sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def render(
    stack: Stack, sources: Sources, *, image: str | None = None, fingerprint: str | None = None,
    gpus: bool = True, env: dict[str, str] | None = None, instance: str = instances.DEFAULT, sleep: bool = True,
    placed: bool = False, rank: Rank | None = None, kv_cache_bytes: int | None = None,
) -> ContainerPlan:
    """The container that serves `stack`; `image` overrides the ref (e.g. pinned by digest);
    `sleep=False` leaves sleep mode out (the image has none, or GB10's sleep rules refuse it);
    `kv_cache_bytes`: the engine's KV cache as planned (None: vLLM sizes it from the fraction);
    `rank`: the container of one rank of a multi-node stack, with its flags and its host's
    network env."""
    if stack.kind is not Kind.VLLM or stack.vllm is None:
        raise ValueError(f"stack {stack.name} is a {stack.kind} stack; only vllm stacks render to a container")
    labels = {LABEL_STACK: stack.name, instances.LABEL: instance, LABEL_SPEC_HASH: spec_hash(stack),
              LABEL_MEMORY: f"{stack.resources.gpu_memory_utilization:g}"}
    if fingerprint:
        labels[LABEL_FINGERPRINT] = fingerprint
    if placed:
        labels[LABEL_PLACED] = "fleet"
        if rank is None or not rank.headless:  # its host's agent relays it to the head's gateway
            labels[LABEL_RELAY] = str(stack.port)
    args = vllm_args(stack, sources.draft_subpath, sleep, kv_cache_bytes)
    sleep_env = dict(what.split("=", 1) for what, _ in additions(stack, sleep) if not what.startswith("--"))
    env = {**(env or {}), **sleep_env, **stack.container.env}
    if rank is not None:
        assert stack.parallel is not None, f"stack {stack.name} has no `parallel` section: it has no ranks"
        args += rank_args(stack.parallel, rank)
        env = {k: v for k, v in env.items() if k not in NETWORK_ENV} | rank_env(rank.host)
        labels[LABEL_RANK] = str(rank.index)
    c = stack.container
    return ContainerPlan(
        name=instances.container_name(stack.name, instance),
        image=image or stack.image.ref,
        entrypoint=c.entrypoint,
        command=("serve", _inside(MODEL_DIR, sources.model_subpath), *args),
        env={"HF_HUB_OFFLINE": "1", **dict(sorted(env.items()))},
        mounts=_mounts(stack, sources),
        labels=labels,
        ipc_mode=c.ipc,
        shm_size=c.shm_size,
        gpus=c.gpus if gpus else "none",
        init=stack.parallel is not None,  # a rank's children are reaped, not left as zombies
    )



def vllm_args(stack: Stack, draft_subpath: str = "", sleep: bool = True, kv_cache_bytes: int | None = None
              ) -> list[str]:
    """`vllm serve` flags for the stack, in a fixed order."""
    v = stack.vllm
    assert v is not None
    args = ["--served-model-name", stack.served_name, "--host", v.host, "--port", str(v.port)]
    args += _value("--max-model-len", v.max_model_len)
    args += ["--gpu-memory-utilization", f"{stack.resources.gpu_memory_utilization:g}"]
    args += _toggle("prefix-caching", v.enable_prefix_caching)
    args += _toggle("chunked-prefill", v.enable_chunked_prefill)
    args += _value("--quantization", v.quantization)
    args += _value("--attention-backend", v.attention_backend)
    args += _value("--mamba-cache-dtype", v.mamba_cache_dtype)
    args += _value("--kv-cache-dtype", v.kv_cache_dtype)
    args += _value("--max-num-seqs", v.max_num_seqs)
    args += _value("--max-num-batched-tokens", v.max_num_batched_tokens)
    if v.tensor_parallel_size != 1:
        args += ["--tensor-parallel-size", str(v.tensor_parallel_size)]
    args += _value("--distributed-executor-backend", v.distributed_executor_backend)
    if v.compilation_config is not None:
        args += ["--compilation-config", json.dumps(v.compilation_config, sort_keys=True)]
    if v.enforce_eager:
        args.append("--enforce-eager")
    if v.speculative is not None:
        config = {"method": v.speculative.method}
        if stack.draft is not None:
            config["model"] = _inside(DRAFT_DIR, draft_subpath)
        config |= v.speculative.model_dump(exclude={"method"}, exclude_none=True)
        args += ["--speculative-config", json.dumps(config, separators=(",", ":"))]
    # after the stack file's flags (seed values and sparkctl's placement alike)
    args += [what for what, _ in additions(stack, sleep, kv_cache_bytes) if what.startswith("--")]
    return args + list(v.extra_args)


def additions(stack: Stack, sleep: bool = True, kv_cache_bytes: int | None = None) -> list[tuple[str, str]]:
    """What sparkctl adds to the engine's command and environment beyond the stack file's values,
    each with the setting that causes it: (`--flag`, `--flag=value` or `VAR=value`, cause).
    - The KV cache as an absolute size, planned from the usable memory: vLLM fills its fraction
      during start-up profiling, which on unified memory overshot to the whole host (vLLM #46307).
    - Parking by sleep needs vLLM's sleep mode, and vLLM registers /sleep, /wake_up and
      /is_sleeping only in its dev mode (the engine listens on loopback, and the gateway forwards
      none of them). `switch.park: stop`, or GB10's sleep rules (`policy/parking.sleep_refusal`),
      leave both out."""
    added = []
    if kv_cache_bytes is not None:
        added.append((f"--kv-cache-memory-bytes={kv_cache_bytes}",
                      "resources.gpu_memory_utilization of the usable memory, less the weights and "
                      "SPARKCTL_ENGINE_OVERHEAD_GIB: the engine's memory bounded by construction (vLLM #46307)"))
    if stack.sleeps and sleep:
        cause = f"switch.park: {stack.switch.park}: parks by sleeping; `switch.park: stop` leaves it out"
        added += [("--enable-sleep-mode", cause), ("VLLM_SERVER_DEV_MODE=1", cause)]
    return added


def _inside(mount: str, subpath: str) -> str:
    return f"{mount}/{subpath}" if subpath else mount


def _value(flag: str, value: object) -> list[str]:
    return [] if value is None else [flag, str(value)]


def _toggle(name: str, on: bool | None) -> list[str]:
    if on is None:
        return []
    return [f"--enable-{name}"] if on else [f"--no-enable-{name}"]


def _mounts(stack: Stack, sources: Sources) -> tuple[MountPlan, ...]:
    mounts = [MountPlan(sources.model_dir, MODEL_DIR)]
    if stack.draft is not None:
        if sources.draft_dir is None:
            raise ValueError(f"stack {stack.name} has a draft but no draft dir was given")
        mounts.append(MountPlan(sources.draft_dir, DRAFT_DIR))
    mounts += [MountPlan(host, target) for host, target in sources.overlays]
    cache = stack.container.compile_cache
    if cache and sources.compile_cache_dir:
        mounts.append(MountPlan(sources.compile_cache_dir, cache, read_only=False))
    mounts += [MountPlan(m.source, m.target, m.read_only) for m in stack.container.mounts]
    return tuple(mounts)
