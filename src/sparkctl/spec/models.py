"""The model of a stack file: the Stack as a whole, and the sections sparkctl itself acts on.

Resources feed memory admission; health budgets and the canary gate a deploy; expectations and
the switch settings drive the benchmark; known issues cap concurrency at the gateway. The Stack
checks that its sections fit together and that anything sometimes right, never by accident, is
opted into with `allow:`. `load.py` builds it from YAML; `render.py` turns it into a container
plan; policy and deploy code read it and never change it.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field, JsonValue, model_validator

from sparkctl.policy.parking import Park
from sparkctl.spec import risks
from sparkctl.spec.base import Fraction, Name, Port, Seconds, Spec
from sparkctl.spec.engine import DEFAULT_ENTRYPOINT, ComposeProject, Container, Image, VllmArgs, Weights


class Kind(StrEnum):
    VLLM = "vllm"  # sparkctl renders and runs the engine container itself
    COMPOSE = "compose"  # an existing compose project, brought up through compose v2


WILDCARD = frozenset({"0.0.0.0", "::", "localhost"})  # reached at 127.0.0.1
# What a stack must opt into by name (`allow:`): sometimes right, never by accident.
# `prefix-caching`: prefix caching on a stack whose draft does not support it (its patch set's `limits`).
# `host-path`: a bind of a host folder outside sparkctl's own (judged where it is mounted: deploy/binds.py).
Risk = Literal["docker-socket", "all-interfaces", "remote-code", "prefix-caching", "host-path", "entrypoint",
               "vllm-env"]


class Resources(Spec):
    # vLLM reserves this fraction of unified memory up front; admission sums it.
    gpu_memory_utilization: Fraction = 0.80
    # "planned": sparkctl gives the engine its KV cache in bytes (--kv-cache-memory-bytes, vLLM
    # 0.11 on: every shipped image), the fraction less the weights and overhead, so start-up
    # profiling cannot overshoot (vLLM #46307). "engine": vLLM sizes it from the fraction, for an
    # image whose vLLM predates the flag; its KV region is then unknown, so it parks by stopping.
    kv_cache: Literal["planned", "engine"] = "planned"
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


class Quality(Spec):
    """The quality gate (`bench/quality.py`): lm-eval's accuracy on `task`, over its first `items`
    questions, through the gateway. It must reach `floor` (a fraction: 0.7 is 70 %), and may fall
    at most `max_drop` (in the same fraction: 0.05 is 5 points) under the stack's last passing run
    on the same questions. `sparkctl_arith`, sparkctl's own, runs offline; any other lm-eval
    generation task (e.g. `gsm8k`) needs its data set at hand or a network."""

    task: str = Field(default="sparkctl_arith", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
    items: int = Field(default=200, ge=1, le=100_000)
    floor: float | None = Field(default=None, gt=0, le=1)
    max_drop: float | None = Field(default=None, gt=0, lt=1)

    @model_validator(mode="after")
    def _gated(self) -> Quality:
        if self.floor is None and self.max_drop is None:
            raise ValueError("set `floor` (the lowest accuracy passed, as a fraction: 0.7 is 70 %), `max_drop` (the "
                             "largest drop under the last passing run, as a fraction: 0.05 is 5 points), or both")
        return self


class Drift(Spec):
    """Greedy drift (`bench/drift.py`): sparkctl's fixed prompts at temperature 0, their outputs
    compared with the stack's last passing build of the same weights and, on a speculative stack,
    with its no-spec twin's. Always reported; refused only with `gate: true`, when fewer than
    `min_identical` of the outputs (a fraction: 1 is every one) are identical to either."""

    gate: bool = False
    min_identical: Fraction = 1.0

    @model_validator(mode="after")
    def _gating(self) -> Drift:
        if self.min_identical != 1.0 and not self.gate:  # (1.0, the default, is what a dump writes back)
            raise ValueError("`min_identical` refuses nothing without `gate: true`: add `gate: true`, or drop "
                             "`min_identical` (drift is reported either way)")
        return self


class Expectations(Spec):
    min_decode_tps: float | None = Field(default=None, gt=0)  # at depth 0, single stream
    min_acceptance: float | None = Field(default=None, ge=0, le=1)
    max_drop: float | None = Field(default=None, gt=0, lt=1)  # vs the last known-good run
    min_concurrency: int | None = Field(default=None, ge=1)  # must not crash at this many
    # KV-cache tokens the engine must report after health (vllm:cache_config_info); less is a warning.
    min_kv_tokens: int | None = Field(default=None, ge=1)
    # What a seed measured for this very config (depth 0, single stream): the report draws it as a
    # reference line. Only a figure the seed gives for it; none for an estimate or a range.
    seed_decode_tps: float | None = Field(default=None, gt=0)
    quality: Quality | None = None  # the answers' accuracy on a task (lm-eval), beside the speed
    drift: Drift = Drift()  # greedy outputs against the last passing build and the no-spec twin


class Placement(Spec):
    """Where a stack runs in a fleet (`sparkctl fleet up`): on one named host, or as `replicas`
    engines on as many different hosts (Ray picks them by their free memory). A stack that sets
    either runs across the fleet its Spark heads, also when an alias is switched to it; a single
    Spark ignores this section."""

    host: Name | None = None
    replicas: int | None = Field(default=None, ge=1, le=64)

    @model_validator(mode="after")
    def _one_way(self) -> Placement:
        if self.host is not None and (self.replicas or 1) > 1:
            raise ValueError("name a `host` or ask for `replicas`, not both: replicas go on different hosts")
        return self

    @property
    def fleet(self) -> bool:
        return self.host is not None or self.replicas is not None

    @property
    def count(self) -> int:
        return self.replicas or 1


class Parallel(Spec):
    """One model across several Sparks with vLLM's native multi-node mode (no Ray inside the
    engine): `nodes` ranks, one per host, each `vllm serve --nnodes N --node-rank r`; ranks above
    0 run `--headless` and rank 0 serves HTTP. `tensor` x `pipeline` x `data` must use every GPU
    of the nodes (a GB10 Spark has one)."""

    tensor: int = Field(default=1, ge=1, le=64)
    pipeline: int = Field(default=1, ge=1, le=64)
    data: int = Field(default=1, ge=1, le=64)
    nodes: int = Field(ge=2, le=64)
    gpus_per_node: int = Field(default=1, ge=1, le=8)
    master_port: Port = 29501  # rank 0's rendezvous port, on its serving address (vLLM's default)

    @model_validator(mode="after")
    def _fits(self) -> Parallel:
        world, gpus = self.tensor * self.pipeline * self.data, self.nodes * self.gpus_per_node
        if world != gpus:
            raise ValueError(f"tensor x pipeline x data = {self.tensor} x {self.pipeline} x {self.data} = {world} "
                             f"ranks, but {self.nodes} nodes x {self.gpus_per_node} GPU(s) = {gpus}: they must match")
        return self


class SwitchOver(Spec):
    # The quick benchmark when this stack becomes an alias's target: as a gate before the flip
    # (a failure rolls the switch back), right after the queue is released, or not at all.
    bench: Literal["gate", "after", "off"] = "after"
    # When an alias moves away: park with vLLM sleep mode at level 1 or 2, stop, or `auto` (the
    # deepest-keeping level whose memory peaks fit; see policy/parking.py). Anything but `stop`
    # runs the engine with --enable-sleep-mode.
    park: Park = Park.AUTO
    # Park the stack (as `park` says) once the gateway has sent it no request for this long.
    idle_park: Seconds | None = None


# Where a known issue was seen: a seed's file and line, a URL, or a measurement of this project.
Source = Annotated[str, Field(pattern=r"^(seed \d{3}:\d+|https?://\S+|measured run \d+)$")]


class KnownIssue(Spec):
    text: str = Field(min_length=1)
    # The gateway enforces the cap when the issue has a source, or when the user opts in
    # (`enforce: true`); an unsourced cap is advice, shown by `stacks show`.
    max_concurrency: int | None = Field(default=None, ge=1)
    source: Source | None = None
    enforce: bool = False

    @property
    def enforced(self) -> bool:
        return self.max_concurrency is not None and (self.source is not None or self.enforce)


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
    placement: Placement = Placement()
    parallel: Parallel | None = None  # one model across several Sparks (vLLM multi-node)
    known_issues: tuple[KnownIssue, ...] = ()
    # Request parameters the gateway adds to each request to this stack unless the client set
    # them (objects merge key by key), e.g. `chat_template_kwargs: {enable_thinking: true}`.
    request_defaults: dict[str, JsonValue] = Field(default_factory=dict)
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
        if self.parallel is not None:
            if self.kind is not Kind.VLLM:
                raise ValueError("`parallel` runs vLLM's multi-node mode: a `vllm` stack only")
            v = self.vllm
            if v is not None and (v.tensor_parallel_size != 1 or v.distributed_executor_backend):
                raise ValueError("`parallel` sets the ranks' parallel sizes and backend: leave "
                                 "vllm.tensor_parallel_size and vllm.distributed_executor_backend unset")
            if self.placement.host is not None or (self.placement.replicas or 1) > 1:
                raise ValueError("a `parallel` stack is one group on `parallel.nodes` different hosts: "
                                 "no `placement.host` or `placement.replicas`")
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
        if self.container.entrypoint != DEFAULT_ENTRYPOINT:
            found.append(("entrypoint", "container.entrypoint: an entrypoint other than `vllm` can rewrite the command "
                                        "sparkctl checked (its address, its flags)"))
        if self.container.vllm_env:
            found.append(("vllm-env", f"container.env: {', '.join(self.container.vllm_env)} set vLLM settings no "
                                      "check of sparkctl's reads (some open dev routes, LoRA loading from any path, "
                                      "pickled messages)"))
        if self.vllm is not None:
            args = self.vllm.extra_args
            # An empty host is vLLM's default: every interface. None: `--host` with no value fails the start.
            hosts = [self.vllm.host, *(h for h in risks.flag_values(args, "--host") if h is not None)]
            if not all(map(risks.is_loopback, hosts)):
                found.append(("all-interfaces", "vllm.host / extra_args: the engine listens beyond loopback, "
                                                "where the gateway's API keys do not guard it"))
            if risks.flag_values(args, "--trust-remote-code"):
                found.append(("remote-code", "vllm.extra_args: --trust-remote-code runs Python from the model repo"))
        return found

    def advice(self) -> list[str]:
        """Settings that do not do what they seem to, with what to do instead."""
        speculative = self.vllm.speculative if self.vllm is not None else None
        if speculative is not None and speculative.max_model_len is not None:
            return [f"vllm.speculative.max_model_len ({speculative.max_model_len}) has no effect on vLLM V1: it is "
                    "accepted and ignored, so speculation stays on for longer prompts (vLLM #52258). To use "
                    "speculation only for short prompts, route an alias by prompt length: `sparkctl route set "
                    f"ALIAS {self.name}:{speculative.max_model_len} <a no-spec stack>`"]
        return []

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
        """Where sparkctl reaches the engine: on loopback, or on the one address it listens on (a
        fleet host's serving address); the gateway is what agents use."""
        host = self.vllm.host if self.vllm is not None and self.vllm.host not in WILDCARD else "127.0.0.1"
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"

    @property
    def sleeps(self) -> bool:
        """Whether the engine runs with sleep mode (only sparkctl's own vLLM containers park). A
        multi-node group does not: vLLM's sleep mode is per process, and waking ranks one by one
        is not supported across nodes, so a group parks by stopping."""
        return self.kind is Kind.VLLM and self.switch.park is not Park.STOP and self.parallel is None

    @property
    def max_concurrency(self) -> int | None:
        caps = [i.max_concurrency for i in self.known_issues if i.enforced]
        return min(caps) if caps else None

