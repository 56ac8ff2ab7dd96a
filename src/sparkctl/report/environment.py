"""What ran, where and how, for the report's Environment and Configs tested tables (seed 000's
rows and columns): each entry is a stack, its benchmark run, and the run's `environment.json`
(written by the benchmark into the run folder: date, host, engine version and flags, llama-benchy
version, temperature, corpus, KV-cache tokens, profile). A run without that file, or a missing
key, reads "unknown"; nothing is filled in from the machine writing the report. Pure: `report`
reads the files and `markdown.py` lays the tables out.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from sparkctl.bench.profiles import PROFILES
from sparkctl.policy.headroom import Headroom
from sparkctl.report.analysis import checkpoint_of, family_of
from sparkctl.spec.models import Stack
from sparkctl.spec.render import vllm_args
from sparkctl.state.bench import BenchRun

UNKNOWN = "unknown"
# Flags that differ by machine or instance, not by what is measured.
LOCAL_FLAGS = ("--served-model-name", "--host", "--port")


@dataclass(frozen=True)
class Entry:
    stack: Stack
    run: BenchRun
    env: dict[str, Any] = field(default_factory=dict)  # the run's environment.json, {} without one
    # The deployment that served the run: seconds to fetch (resolve, pull, download, patch) and
    # from the container's start to serving; None when not known (no store, or not recorded).
    startup: tuple[float, float] | None = None

    def get(self, *keys: str) -> Any:
        """A nested key of environment.json, or None (also for what the benchmark recorded as unknown)."""
        value: Any = self.env
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        return None if value in ("", UNKNOWN) else value


def table(entries: list[Entry], *, bandwidth_gbs: float | None = None) -> list[tuple[str, str]]:
    """The Environment rows, in seed 000's order; `bandwidth_gbs`: the memory bandwidth setting."""
    return [
        ("Target model", _models(entries)),
        ("Draft head", _drafts(entries)),
        ("Engines", _distinct(engine(e) for e in entries)),
        ("Draft patches", _patches(entries)),
        ("GPU", _distinct(_gpu(e, bandwidth_gbs) for e in entries)),
        ("Driver / CUDA", _distinct(_driver(e) for e in entries)),
        ("OS / kernel", _distinct(_os(e) for e in entries)),
        ("Benchmark tool", _distinct(f"llama-benchy {_known(e.get('llama_benchy'))}" for e in entries)),
        ("Serving params (fixed)", " ".join(common_flags(entries)) or "none shared by all (see Configs tested)"),
        ("Benchmark params", _distinct(bench_params(e) for e in entries)),
        ("Date", _dates(entries)),
    ]


def checkpoint(stack: Stack) -> str:
    """NVFP4, BF16...: named in the model's name, else the stack's quantization; "" if neither says."""
    named = checkpoint_of(model(stack))
    return named or (stack.vllm.quantization or "" if stack.vllm else "")


def model(stack: Stack) -> str:
    return (stack.model.repo or stack.model.path or "") if stack.model else ""


def engine(entry: Entry) -> str:
    version = entry.get("engine", "vllm_version")
    return f"{entry.stack.image.ref} (vLLM {version})" if version else entry.stack.image.ref


def speculation(stack: Stack, *, detail: bool = True) -> str:
    spec = stack.vllm.speculative if stack.vllm else None
    if spec is None:
        return "none" if detail else ""
    text = f"{spec.method} n={spec.num_speculative_tokens}"
    return f"{text}, {spec.draft_sample_method}" if detail and spec.draft_sample_method else text


def flags(entry: Entry) -> list[str]:
    """The engine's options as run ("--flag value" each): from environment.json, else as sparkctl
    renders the stack; a compose project's env file settings as KEY=VALUE."""
    ran = entry.get("engine", "flags")
    if isinstance(ran, str):
        ran = _words(ran)
    if isinstance(ran, list):
        return _options([str(f) for f in ran])
    if entry.stack.vllm is not None:
        return _options(vllm_args(entry.stack))
    return [f"{k}={v}" for k, v in entry.stack.compose.env.items()] if entry.stack.compose else []


def common_flags(entries: list[Entry]) -> list[str]:
    """Options every config ran with (the seed's fixed serving params)."""
    sets = [flags(e) for e in entries if flags(e)]
    return [f for f in sets[0] if all(f in s for s in sets[1:])] if sets else []


def own_flags(entry: Entry, common: list[str]) -> str:
    own = [f for f in flags(entry) if f not in common and not f.startswith("--speculative-config")]
    if entry.stack.compose is not None:
        own.insert(0, f"compose project `{entry.stack.compose.project}`")
    return " ".join(own) or "-"


def kv_headroom(entry: Entry) -> str:
    """KV-cache tokens the engine reported, and how many full-context requests fit in them."""
    tokens = entry.get("kv_cache_tokens")
    if not isinstance(tokens, int):
        return UNKNOWN
    return Headroom(tokens, max_model_len(entry)).summary()


def max_model_len(entry: Entry) -> int | None:
    for option in flags(entry):
        name, _, value = option.replace("=", " ", 1).partition(" ")
        if name in ("--max-model-len", "MAX_MODEL_LEN") and value.isdigit():
            return int(value)
    return entry.stack.vllm.max_model_len if entry.stack.vllm else None


def benchy_args(entry: Entry) -> dict[str, list[str]]:
    """llama-benchy's arguments as the run recorded them (environment.json's `profile.args`), by
    option: {"pp": ["512"], "depth": ["0", "4096"], "exact-tg": [], ...}; {} without them."""
    args = entry.get("profile", "args")
    return _by_option(args) if isinstance(args, list) else {}


def bench_params(entry: Entry) -> str:
    """llama-benchy's settings for the run, as recorded; else the named profile's at the depths the
    rows have (whose runs per depth a `--runs` may have changed, so they are not claimed)."""
    args, named = benchy_args(entry), PROFILES.get(entry.run.profile)
    if not args and named is None:
        return UNKNOWN
    if not args:
        depths = tuple(sorted({r["depth"] for r in entry.run.rows})) or named.depths
        args = _by_option(replace(named, depths=depths).args())
        args.pop("runs")
    depths = args.pop("depth", [])
    if args.get("concurrency") == ["1"]:
        args.pop("concurrency")
    text = " ".join(" ".join([f"--{option}", *values]) for option, values in args.items())
    text += f", depths {' '.join(depths)}" if depths else ""
    return text if benchy_args(entry) else f"profile `{entry.run.profile}`: {text} (runs per depth not recorded)"


def _models(entries: list[Entry]) -> str:
    """Model repos, the checkpoints of one model (NVFP4, BF16...) folded into one item."""
    groups: dict[str, list[str]] = {}
    for e in entries:
        names = groups.setdefault(family_of(model(e.stack)), [])
        if model(e.stack) not in names:
            names.append(model(e.stack))
    out = []
    for family, names in groups.items():
        marks = [checkpoint_of(n) for n in names]
        out += [f"{family} ({', '.join(marks)} checkpoints)"] if len(names) > 1 and all(marks) else names
    return " · ".join(out) or UNKNOWN


def _drafts(entries: list[Entry]) -> str:
    found: dict[tuple[str, str], dict[str, list[str]]] = {}
    for e in entries:
        spec = e.stack.vllm.speculative if e.stack.vllm else None
        if spec is None:
            continue
        repo = (e.stack.draft.repo or e.stack.draft.path or "") if e.stack.draft else "no draft model"
        seen = found.setdefault((repo, spec.method), {"n": [], "sample": []})
        for key, value in (("n", str(spec.num_speculative_tokens)), ("sample", spec.draft_sample_method)):
            if value and value not in seen[key]:
                seen[key].append(value)
    return " · ".join(f"{repo}: {method} n={', '.join(s['n'])}" +
                      (f", draft_sample_method={', '.join(s['sample'])}" if s["sample"] else "")
                      for (repo, method), s in found.items()) or "none"


def _patches(entries: list[Entry]) -> str:
    found: dict[str, list[str]] = {}
    for e in entries:
        for name in e.stack.patches:
            digest = (e.run.parts.get("patches") or "")[:12]
            found.setdefault(f"{name} (patch set {digest})" if digest else name, []).append(e.stack.name)
    return " · ".join(f"{p} on {', '.join(c)}" for p, c in found.items()) or "none"


def _gpu(e: Entry, bandwidth_gbs: float | None) -> str:
    """As seed 000 gives it: the GPU, its compute capability and memory as the run's host read
    them, and the memory bandwidth the report assumes (a setting: nothing on the host reports it)."""
    gpu, memory = e.get("host", "gpu"), e.get("host", "memory_gib")
    if gpu is None and memory is None:
        return UNKNOWN
    parts = [_known(gpu), f"SM {_known(e.get('host', 'compute_capability'))}"]
    parts += [f"{memory:g} GiB"] if isinstance(memory, int | float) else []
    parts += [f"~{bandwidth_gbs:g} GB/s (memory_bandwidth_gbs)"] if bandwidth_gbs else []
    return ", ".join(parts)


def _driver(e: Entry) -> str:
    driver, cuda = e.get("host", "driver"), e.get("host", "cuda")
    return f"{_known(driver)} / CUDA {_known(cuda)}" if driver or cuda else UNKNOWN


def _os(e: Entry) -> str:
    name, kernel, arch, host = (e.get("host", k) for k in ("os", "kernel", "arch", "hostname"))
    if not (name or kernel or arch):
        return UNKNOWN
    return f"{_known(name)}, kernel {_known(kernel)}, {_known(arch)}" + (f"; host {host}" if host else "")


def _dates(entries: list[Entry]) -> str:
    """The runs' dates (UTC): environment.json's, else the run's own start time."""
    days = sorted({str(e.get("date"))[:10] if e.get("date") else
                   datetime.fromtimestamp(e.run.started, UTC).date().isoformat() for e in entries})
    return days[0] if len(days) == 1 else f"{days[0]} to {days[-1]}"


def _options(tokens: list[str]) -> list[str]:
    """`--flag value` pairs and lone switches; positional words (`serve /model`) and the
    per-instance flags are left out."""
    out, i = [], 0
    while i < len(tokens):
        token = tokens[i]
        takes = token.startswith("--") and "=" not in token and i + 1 < len(tokens) \
            and not tokens[i + 1].startswith("--")
        if token.startswith("--") and token.split("=", 1)[0] not in LOCAL_FLAGS:
            out.append(f"{token} {tokens[i + 1]}" if takes else token)
        i += 2 if takes else 1
    return out


def _words(command: str) -> list[str]:
    try:
        return shlex.split(command)
    except ValueError:  # an unbalanced quote in a recorded command line: words are near enough
        return command.split()


def _by_option(args: list) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    option = None
    for token in map(str, args):
        if token.startswith("--"):
            option = token[2:]
            found.setdefault(option, [])
        elif option is not None:
            found[option].append(token)
    return found


def _distinct(values) -> str:
    return " · ".join(dict.fromkeys(values)) or UNKNOWN


def _known(value: Any) -> str:
    return UNKNOWN if value is None or value == "" else str(value)


def startup(entry: Entry) -> tuple[str, str, str, str]:
    """Seed 003's startup and memory per stack: the fetch, the start to serving, the memory share
    (the stack's fraction of the run's host memory) and the KV-cache tokens the engine reported."""
    fetch, start = (f"{t:.1f} s" for t in entry.startup) if entry.startup else (UNKNOWN, UNKNOWN)
    memory = entry.get("host", "memory_gib")
    share = entry.stack.resources.gpu_memory_utilization
    reserved = f"{share:g} x {memory:g} GiB = {share * memory:.1f} GiB" if isinstance(memory, int | float) \
        else f"{share:g} of memory"
    tokens = entry.get("kv_cache_tokens")
    return fetch, start, reserved, f"{tokens:,}" if isinstance(tokens, int) else UNKNOWN
