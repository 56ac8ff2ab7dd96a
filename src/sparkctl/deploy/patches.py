"""The patch step: change vLLM's files for a stack without changing the image.

Finds vLLM's package dir inside the image and copies the target files out of a never-started
container (both cached per digest: an image's files never change), applies overlays (whole
files from the draft or model snapshot), unified diffs and class-attribute shims on the host,
checks each result (it parses, the shim re-applies as a no-op), and writes them to an overlay
dir keyed by their hash. The pipeline bind-mounts each file read-only over its path; the hash
goes into the fingerprint. `planned_mounts` lists those mounts without the image, for
`sparkctl stacks render`: what only the image can tell is a placeholder.
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sparkctl.adapters.docker import DockerEngine
from sparkctl.deploy import edits
from sparkctl.errors import SparkctlError
from sparkctl.spec.base import inside
from sparkctl.spec.patchset import Overlay, PatchSet, Shim

FIND_VLLM = ("import importlib.util as u; s = u.find_spec('vllm'); "
             "print(list(s.submodule_search_locations)[0] if s and s.submodule_search_locations else '')")
VLLM_DIRS = "vllm-dirs.json"  # in the state dir: vLLM's package dir per image digest, once found
# What `planned_mounts` cannot know without the image.
VLLM_DIR_AT_DEPLOY = "<vLLM package dir in the image, found at deploy>"
HASH_AT_DEPLOY = "<hash of the patched files, computed at deploy>"


class PatchError(SparkctlError):
    """A patch does not apply to this image: nothing was started."""


@dataclass(frozen=True)
class PatchResult:
    vllm_dir: str
    mounts: tuple[tuple[str, str], ...]  # (host file, path in the container)
    hash: str  # of every patched file's path and content; "" when nothing is patched
    diff: str  # unified diff of the changes, for `sparkctl patch check`


def prepare(patch_sets: list[PatchSet], *, image: str, digest: str, docker: DockerEngine,
            sources: Mapping[str, Path], state_dir: Path, overlays_dir: Path, patches_dir: Path) -> PatchResult:
    """Apply `patch_sets` to the image's files; `sources` maps "draft"/"model" to snapshot dirs.
    The patched files go to `overlays_dir` (the instance's), in a folder named by their hash."""
    if not patch_sets:
        return PatchResult("", (), "", "")
    vllm_dir = find_vllm(docker, image, digest, cache=state_dir / VLLM_DIRS)
    steps = _steps(patch_sets, patches_dir)
    originals = image_files(docker, image, [f"{vllm_dir}/{rel}" for rel in steps],
                            cache=state_dir / "image-files" / f"{digest.replace(':', '-')}.json")
    patched: dict[str, str] = {}
    for rel, actions in steps.items():
        original = originals[f"{vllm_dir}/{rel}"]
        text = original.decode() if original is not None else None
        for action in actions:
            text = _apply(action, text, rel=rel, sources=sources, vllm_dir=vllm_dir)
        _check(rel, text, actions, vllm_dir)
        patched[rel] = text
    digest_of = hashlib.sha256(json.dumps(sorted(patched.items())).encode()).hexdigest()[:16]
    folder = _write(overlays_dir / digest_of, patched)
    mounts = tuple((str(folder / rel), f"{vllm_dir}/{rel}") for rel in sorted(patched))
    diff = "".join(_diff(f"{vllm_dir}/{rel}", originals[f"{vllm_dir}/{rel}"], patched[rel]) for rel in sorted(patched))
    return PatchResult(vllm_dir, mounts, digest_of, diff)


def planned_mounts(patch_sets: list[PatchSet], *, patches_dir: Path, overlays_dir: Path,
                   vllm_dir: str | None = None) -> tuple[tuple[str, str], ...]:
    """The mounts `prepare` makes, one per file the patch sets change, as far as they are known
    without the image: the overlay folder's name (a hash of the patched files) is a placeholder,
    and so is vLLM's dir in the image unless `vllm_dir` is given."""
    folder, where = overlays_dir / HASH_AT_DEPLOY, vllm_dir or VLLM_DIR_AT_DEPLOY
    return tuple((str(folder / rel), f"{where}/{rel}") for rel in sorted(_steps(patch_sets, patches_dir)))


def known_vllm_dir(digest: str, *, cache: Path) -> str | None:
    """vLLM's package dir in the image `digest`, if a deploy or `patch check` found it before."""
    return _found(cache).get(digest)


def find_vllm(docker: DockerEngine, image: str, digest: str, *, cache: Path) -> str:
    """vLLM's package dir in the image, found with importlib (vLLM is not imported)."""
    known = _found(cache)
    if digest in known:
        return known[digest]
    found = docker.run_once(image, ["python3"], ["-c", FIND_VLLM]).strip()
    if not found.startswith("/"):
        raise PatchError(f"no vLLM package in {image}: `python3` there cannot find `vllm`; "
                         "this stack's patches need a vLLM image")
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(known | {digest: found}, indent=2))
    return found


def image_files(docker: DockerEngine, image: str, paths: list[str], *, cache: Path) -> dict[str, bytes | None]:
    """The files at `paths` in the image (None: absent), read once per digest: a repeated `up`
    starts no scratch container."""
    known: dict[str, str | None] = _found(cache)
    missing = [p for p in paths if p not in known]
    if missing:
        read = docker.read_files(image, missing)
        known |= {p: data.decode() if data is not None else None for p, data in read.items()}
        cache.parent.mkdir(parents=True, exist_ok=True)
        scratch = cache.with_name(f".{cache.name}.{os.getpid()}")
        scratch.write_text(json.dumps(known))
        scratch.replace(cache)
    return {p: known[p].encode() if known[p] is not None else None for p in paths}


def _found(cache: Path) -> dict[str, str]:
    return json.loads(cache.read_text()) if cache.is_file() else {}


@dataclass(frozen=True)
class _Diff:
    source: Path  # the diff file, for error messages
    change: edits.FileDiff


Action = Overlay | _Diff | Shim


def _steps(patch_sets: list[PatchSet], patches_dir: Path) -> dict[str, list[Action]]:
    """Per target file (relative to vLLM's dir), the actions in order: overlays, diffs, shims."""
    steps: dict[str, list[Action]] = {}
    for patch_set in patch_sets:
        for overlay in patch_set.overlays:
            steps.setdefault(overlay.target, []).append(overlay)
        for name in patch_set.diffs:
            path = within(patches_dir, name)
            if not path.is_file():
                raise PatchError(f"patch set {patch_set.name}: diff file {path} does not exist")
            for file_diff in edits.parse_diff(path.read_text(), source=str(path)):
                rel = file_diff.path  # relative to vLLM's package dir (`vllm/x.py` or `x.py`)
                rel = rel.split("vllm/", 1)[1] if "vllm/" in rel else rel
                try:
                    inside(rel)
                except ValueError as e:
                    raise PatchError(f"{path}: {e}") from None
                steps.setdefault(rel, []).append(_Diff(path, file_diff))
        for shim in patch_set.shims:
            steps.setdefault(shim.file, []).append(shim)
    return steps


def _apply(action: Action, text: str | None, *, rel: str, sources: Mapping[str, Path], vllm_dir: str) -> str:
    if isinstance(action, Overlay):
        origin, _, path = action.source.partition(":")
        source = sources.get(origin)
        if source is None or not within(source, path).is_file():
            where = source or f"no {origin} snapshot"
            raise PatchError(f"overlay source {action.source} is missing (looked in {where}); "
                             f"the {origin} repo does not carry it at this revision")
        return within(source, path).read_text()
    if text is None:
        raise PatchError(f"patch target {vllm_dir}/{rel} is missing from the image: the image's vLLM "
                         "is not the one this patch set was written for")
    if isinstance(action, _Diff):
        return edits.apply_diff(text, action.change, source=str(action.source))
    return edits.apply_shim(text, action.class_name, action.attributes, filename=f"{vllm_dir}/{rel}")


def _check(rel: str, text: str, actions: list[Action], vllm_dir: str) -> None:
    try:
        ast.parse(text, filename=rel)
    except SyntaxError as e:
        raise PatchError(f"patched {vllm_dir}/{rel} is not valid Python (line {e.lineno}: {e.msg})") from None
    for shim in (a for a in actions if isinstance(a, Shim)):
        if edits.apply_shim(text, shim.class_name, shim.attributes) != text:
            raise PatchError(f"shim on {vllm_dir}/{rel} is not idempotent")


def _write(folder: Path, files: dict[str, str]) -> Path:
    """Write once per content hash; a finished folder is never rewritten."""
    if folder.is_dir():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".tmp-"))
    for rel, text in files.items():
        target = within(scratch, rel)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        target.chmod(0o444)
    scratch.chmod(0o755)
    try:
        os.rename(scratch, folder)
    except OSError:  # written meanwhile by another process, with the same content
        shutil.rmtree(scratch, ignore_errors=True)
    return folder


def _diff(path: str, original: bytes | None, patched: str) -> str:
    before = original.decode().splitlines(keepends=True) if original is not None else []
    return "".join(difflib.unified_diff(before, patched.splitlines(keepends=True),
                                        fromfile=f"image:{path}", tofile=f"patched:{path}"))


def within(base: Path, rel: str) -> Path:
    """`base / rel`, refused if it resolves outside `base` (a `..`, an absolute path, a symlink
    out). The HF cache's snapshots are symlinks into the repo's blobs/, so a snapshot path may
    resolve into its repo folder, one level up, and no further."""
    path = base / rel
    allowed = (base.resolve(), base.resolve().parent.parent) if base.parent.name == "snapshots" else (base.resolve(),)
    if not any(path.resolve().is_relative_to(root) for root in allowed):
        raise PatchError(f"{rel!r} leads outside {base}: refused")
    return path
