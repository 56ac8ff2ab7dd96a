"""`vllm serve MODEL [flags]` for the simulated engine: vLLM's flags, checks and start-up.

Accepts the flags sparkctl renders (and a few more the compose projects use), rejects unknown
flags the way vLLM's argparse does (exit 2, message on stderr), checks the DFlash patches like
the real engine would fail without them, loads for the profile's time (taking real memory when
SPARKCTL_SIM_MEMORY_SCALE is set), then serves; VLLM_SERVER_DEV_MODE=1 adds the dev endpoints.
With `--nnodes N` it is one rank of a multi-node group (`ranks.py`): rank 0 serves once the others
joined, a `--headless` rank only answers rank 0's steps.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import contextlib
import json
import os
import re
import signal
import sys
import time
from pathlib import Path

from sparkctl.sim import calibrate
from sparkctl.sim.engine import VERSION, Engine, Faults, Memory, Vocabulary
from sparkctl.sim.engine import die as _die
from sparkctl.sim.engine import log as _log
from sparkctl.sim.profiles import PROFILES, Profile, auto_profile, min_memory_fraction
from sparkctl.sim.ranks import Group, worker

OVERLAY_MARKERS = {  # the DSpark draft's vllm_patches carry these lines
    "model_executor/models/qwen3_dflash.py": "DSPARK_PATCH = \"qwen3_dflash\"",
    "v1/spec_decode/llm_base_proposer.py": "DSPARK_PATCH = \"llm_base_proposer\"",
}
SHIM_ATTRIBUTES = ("_draft_kv_cache_group_ids", "_draft_layer_to_kv_cache_gid")


def main(argv: list[str] | None = None) -> int:
    # As PID 1 of its container the process would ignore SIGTERM; vLLM shuts down on it.
    signal.signal(signal.SIGTERM, _terminated)
    args = parser().parse_args(argv)
    model_dir = resolve_model(args.model)
    faults = Faults.parse(os.environ.get("SPARKCTL_SIM_FAULTS", ""))
    for key in ("crash_after", "crash_above", "slow_health"):
        if getattr(args, f"sim_{key}") is not None:
            setattr(faults, key, getattr(args, f"sim_{key}"))
    faults.hang_on_load |= args.sim_hang_on_load
    faults.crash_on_load |= args.sim_crash_on_load
    faults.garbage |= args.sim_garbage
    faults.empty |= args.sim_empty
    speculative = _speculative(args)
    profile = _profile(args.sim_profile or auto_profile(_model_name(model_dir), speculative))
    _preflight(args, model_dir, profile, speculative)
    memory = _memory(args, model_dir, speculative, float(os.environ.get("SPARKCTL_SIM_MEMORY_SCALE", "0")), faults)
    scale = float(os.environ.get("SPARKCTL_SIM_TIME_SCALE", "1"))
    _load(profile, float(os.environ.get("SPARKCTL_SIM_LOAD_SCALE", scale)), faults, memory)
    vocab = Vocabulary(model_dir, seed=args.sim_seed)
    engine = Engine(profile, vocab, num_speculative=speculative.get("num_speculative_tokens", 0),
                    scale=scale, max_model_len=args.max_model_len, memory_fraction=args.gpu_memory_utilization,
                    faults=faults, seed=args.sim_seed, memory=memory, sleep_mode=args.enable_sleep_mode,
                    prefix_caching=bool(args.enable_prefix_caching))
    if args.headless:  # a worker rank: no API server
        asyncio.run(worker(args.node_rank, args.master_addr, args.master_port))
        return 0
    dev_mode = bool(int(os.environ.get("VLLM_SERVER_DEV_MODE", "0")))  # vLLM's own parse
    asyncio.run(_serve(engine, args, dev_mode=dev_mode))
    return 0


def _profile(name: str) -> Profile:
    """The profile SPARKCTL_SIM_PROFILE_FILE holds (`sparkctl sim calibrate` writes one), else `name`."""
    path = os.environ.get("SPARKCTL_SIM_PROFILE_FILE")
    if not path:
        return PROFILES[name]
    try:
        return calibrate.loads(Path(path).read_text(), path)
    except (OSError, ValueError) as e:
        _die(f"SPARKCTL_SIM_PROFILE_FILE: {e}")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vllm")
    p.add_argument("--version", action="version", version=VERSION)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve")
    s.add_argument("model")
    s.add_argument("--served-model-name", nargs="+")
    s.add_argument("--host", default="0.0.0.0")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--max-model-len", type=int, default=131072)
    s.add_argument("--gpu-memory-utilization", type=_fraction, default=0.9)
    s.add_argument("--kv-cache-memory-bytes", type=_size)
    s.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction)
    s.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction)
    s.add_argument("--attention-backend")
    s.add_argument("--mamba-cache-dtype", choices=["auto", "float32", "float16", "bfloat16"])
    s.add_argument("--max-num-seqs", type=int)
    s.add_argument("--max-num-batched-tokens", type=int)
    s.add_argument("--kv-cache-dtype", choices=["auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16"])
    s.add_argument("--quantization", "-q")
    s.add_argument("--compilation-config", "-O", type=json.loads)
    s.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    s.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
    s.add_argument("--data-parallel-size", "-dp", type=int, default=1)
    s.add_argument("--nnodes", type=int, default=1)
    s.add_argument("--node-rank", type=int, default=0)
    s.add_argument("--master-addr", default="127.0.0.1")
    s.add_argument("--master-port", type=int, default=29501)
    s.add_argument("--headless", action="store_true")
    s.add_argument("--distributed-executor-backend", choices=["ray", "mp", "uni", "external_launcher"])
    s.add_argument("--speculative-config", type=json.loads)
    s.add_argument("--enforce-eager", action="store_true")
    s.add_argument("--enable-sleep-mode", action=argparse.BooleanOptionalAction, default=False)
    s.add_argument("--enable-auto-tool-choice", action="store_true")
    s.add_argument("--disable-uvicorn-access-log", action="store_true")
    s.add_argument("--tool-call-parser")
    s.add_argument("--reasoning-parser")
    s.add_argument("--sim-profile", choices=sorted(PROFILES), default=os.environ.get("SPARKCTL_SIM_PROFILE"),
                   help="default: $SPARKCTL_SIM_PROFILE, else chosen from the model and speculative config")
    s.add_argument("--sim-seed", type=int, default=0)
    s.add_argument("--sim-crash-after", type=int)
    s.add_argument("--sim-crash-above", type=int)
    s.add_argument("--sim-slow-health", type=float)
    s.add_argument("--sim-hang-on-load", action="store_true")
    s.add_argument("--sim-crash-on-load", action="store_true")
    s.add_argument("--sim-garbage", action="store_true")
    s.add_argument("--sim-empty", action="store_true")
    return p


def vllm_package_dir() -> Path:
    """vLLM's package dir in this image, found without importing it (as sparkctl does)."""
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("ModuleNotFoundError: No module named 'vllm'")
    return Path(next(iter(spec.submodule_search_locations)))


def _size(text: str) -> int:
    """vLLM's human-readable integer: `40000000000`, `40G` (10^9), `40GiB` (2^30)."""
    found = re.fullmatch(r"(\d+(?:\.\d+)?)([kmgt]?)(i?)b?", text.strip().lower())
    if found is None:
        raise argparse.ArgumentTypeError(f"not a size: {text!r}")
    number, unit, binary = found.groups()
    return int(float(number) * (1024 if binary else 1000) ** " kmgt".index(unit or " "))


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {value}")
    return value


def _speculative(args: argparse.Namespace) -> dict:
    config = args.speculative_config or {}
    if config and config.get("method") not in ("dflash", "eagle", "eagle3", "mtp", "ngram", "draft_model"):
        _die(f"ValueError: unknown speculative method {config.get('method')!r}")
    return config


def resolve_model(model: str) -> Path:
    """A model dir, or a repo id found in the Hugging Face cache (engines run offline)."""
    if Path(model).is_dir():
        return Path(model)
    hub = Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", "~/.cache/huggingface")) / "hub")
    repo = hub.expanduser() / ("models--" + model.replace("/", "--"))
    ref = repo / "refs" / "main"
    if not ref.is_file():
        _die(f"OSError: We couldn't connect to the Hub and {model} is not in the cache at {repo}")
    return repo / "snapshots" / ref.read_text().strip()


def _model_name(model_dir: Path) -> str:
    try:
        return json.loads((model_dir / "config.json").read_text()).get("_name_or_path") or str(model_dir)
    except (OSError, ValueError):
        return str(model_dir)


def _preflight(args: argparse.Namespace, model_dir: Path, profile: Profile, speculative: dict) -> None:
    """The start-up failures the real engine has, with the same words."""
    if not (model_dir / "tokenizer.json").is_file():
        _die(f"OSError: Can't load tokenizer for '{args.model}': no tokenizer.json")
    if args.gpu_memory_utilization < min_memory_fraction(profile):
        _die("ValueError: No available memory for the cache blocks. Try increasing "
             "`gpu_memory_utilization` when initializing the engine.")
    if speculative.get("method") == "dflash":
        _check_dflash(speculative)


def _check_dflash(config: dict) -> None:
    draft = Path(config.get("model") or "")
    if not draft.is_dir():
        _die(f"OSError: draft model {draft} not found")
    if not (draft / "vllm_patches").is_dir():  # a drafter the image supports natively (AEON Gemma-4)
        return
    # The DSpark draft's head lives in its vllm_patches, written for AEON's base proposer: the
    # overlays must be in place, and the 2-line shim bridges the proposer skew.
    vllm = vllm_package_dir()
    for rel, marker in OVERLAY_MARKERS.items():
        text = (vllm / rel).read_text() if (vllm / rel).is_file() else ""
        if marker not in text:
            _die(f"ImportError: cannot import name 'DSparkDFlashHead' from 'vllm.{rel[:-3].replace('/', '.')}' "
                 "(the draft's vllm_patches are not applied)")
    tree = ast.parse((vllm / "v1/spec_decode/dflash.py").read_text())
    cls = next((n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "DFlashProposer"), None)
    assigned = {t.id for n in (cls.body if cls else []) if isinstance(n, ast.Assign)
                for t in n.targets if isinstance(t, ast.Name)}
    missing = [a for a in SHIM_ATTRIBUTES if a not in assigned]
    if missing:
        _die(f"AttributeError: 'DFlashProposer' object has no attribute '{missing[0]}'")


def weight_bytes(model_dir: Path) -> int:
    """The size of the weight files vLLM loads: the safetensors, else the .bin files."""
    files = list(model_dir.glob("*.safetensors")) or list(model_dir.glob("*.bin"))
    return sum(f.stat().st_size for f in files)


def host_memory_bytes() -> int:
    """MemTotal from /proc/meminfo."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("MemTotal missing from /proc/meminfo")


def _memory(args: argparse.Namespace, model_dir: Path, speculative: dict, scale: float, faults: Faults) -> Memory:
    """The memory the engine holds awake: the weight files' real size (the draft's too) and the KV
    cache: --kv-cache-memory-bytes as given (a planner that sees a Spark of host memory x scale
    sizes it in this machine's bytes), else what --gpu-memory-utilization of (host memory x scale)
    leaves; plus, sized from the fraction only, start-up profiling's overshoot (a fault). Scale 0
    holds none."""
    if not scale:
        return Memory()
    weights = weight_bytes(model_dir)
    draft = speculative.get("model")
    if draft and Path(draft).is_dir():
        weights += weight_bytes(Path(draft))
    if args.kv_cache_memory_bytes is not None:
        _log(f"Reserved {args.kv_cache_memory_bytes / 2**30:.2f} GiB memory for KV Cache as specified by "
             "kv_cache_memory_bytes config and skipped memory profiling")
        return Memory(weights=weights, kv_cache=args.kv_cache_memory_bytes)
    kv_cache = int(args.gpu_memory_utilization * host_memory_bytes() * scale) - weights
    if kv_cache <= 0:
        _die("ValueError: No available memory for the cache blocks. Try increasing "
             "`gpu_memory_utilization` when initializing the engine.")
    profile = int((args.gpu_memory_utilization + faults.profile_overshoot) * host_memory_bytes() * scale) - weights
    return Memory(weights=weights, kv_cache=kv_cache, profile=profile if faults.profile_overshoot else 0)


def _load(profile: Profile, scale: float, faults: Faults, memory: Memory) -> None:
    _log(f"Loading weights ({profile.weights_gib:.1f} GiB, sim profile {profile.name})")
    memory.allocate("weights", profile.load_s * scale)
    if faults.hang_on_load:
        _log("Loading weights ...")
        while True:
            time.sleep(3600)
    if faults.crash_on_load:
        _die("RuntimeError: CUDA error: out of memory while loading weights (injected)")
    _log(f"Loading weights took {profile.load_s:.2f} seconds")
    # vLLM's compile cache: the sim image names vLLM's default root (a stack mounts it to keep the
    # graphs across starts); a sim process run outside the image keeps none unless it is named.
    root = os.environ.get("VLLM_CACHE_ROOT")
    compiled = Path(root) / "torch_compile_cache" / f"sim-{profile.name}" if root else None
    cached = compiled is not None and compiled.is_dir()
    compile_s = profile.cached_compile_s if cached else profile.compile_s
    if memory.sizes["profile"]:  # sizing the KV cache from the fraction: profiling's peak, then freed
        _log(f"Memory profiling took {memory.sizes['profile'] / 2**30:.2f} GiB beside the weights")
        memory.allocate("profile", compile_s * scale / 2)
        memory.free("profile")
    memory.allocate("kv_cache", compile_s * scale)
    if cached:
        _log(f"Directly load the compiled graph(s) from the cache, took {compile_s:.3f} s")
    else:
        _log(f"Compiling a graph for dynamic shape takes {compile_s:.2f} s")
        if compiled is not None:
            with contextlib.suppress(OSError):  # a read-only cache: every start compiles
                compiled.mkdir(parents=True, exist_ok=True)
    _log(f"torch.compile takes {compile_s:.2f} s in total")


async def _serve(engine: Engine, args: argparse.Namespace, *, dev_mode: bool) -> None:
    from aiohttp import web

    from sparkctl.sim.server import Api

    name = (args.served_model_name or [args.model])[0]
    if dev_mode:
        _log("SECURITY WARNING: Development endpoints are enabled! This should NOT be used in production!")
    group = None
    if args.nnodes > 1:  # rank 0 serves once every other rank has joined
        group = Group(args.nnodes)
        await group.form(args.master_addr, args.master_port)
    api = Api(engine, served_name=name, root=args.model, max_model_len=args.max_model_len, dev_mode=dev_mode,
              workers=args.tensor_parallel_size, group=group)
    runner = web.AppRunner(api.app(access_log=not args.disable_uvicorn_access_log), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, args.host, args.port).start()
    except OSError as e:
        _die(f"OSError: [Errno {e.errno}] error while attempting to bind on address "
             f"('{args.host}', {args.port}): address already in use")
    _log(f"Starting vLLM API server 0 on http://{args.host}:{args.port}")
    await engine.grow()
    await asyncio.Event().wait()


def _terminated(*_: object) -> None:
    _log("Shutting down on SIGTERM")
    raise SystemExit(0)


if __name__ == "__main__":
    sys.exit(main())
