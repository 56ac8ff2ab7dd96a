"""What the doctor's checks look at, each part read once, when a check first asks for it: the
engine's facts, the stacks to check (those named, else the desired ones), the image policy, each
image's size at its registry and each weights repo at the Hub. A part that cannot be read is
kept as the error that says why, for every check that needs it to report."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from sparkctl.adapters import registry
from sparkctl.adapters.hub import Snapshot
from sparkctl.bench.environment import Probe
from sparkctl.container import EngineFacts
from sparkctl.errors import SparkctlError
from sparkctl.policy.images import ImagePolicy, mirrored, parse_ref
from sparkctl.settings import Settings
from sparkctl.spec.engine import Weights
from sparkctl.spec.models import Stack
from sparkctl.state import desired as desired_file
from sparkctl.wiring import Wiring


@dataclass
class Spark:
    settings: Settings
    wiring: Wiring
    named: tuple[str, ...] = ()  # the stacks to check; none: the desired ones
    probe: Probe = field(default_factory=Probe)  # nvidia-smi and /etc files, as the benchmark reads them
    meminfo: Path = Path("/proc/meminfo")

    @cached_property
    def engine(self) -> EngineFacts | SparkctlError:
        try:
            return self.wiring.docker.facts()
        except SparkctlError as e:
            return e

    @cached_property
    def desired(self) -> desired_file.Desired:
        return desired_file.load(self.settings.state_dir / "desired.yaml")

    @cached_property
    def unknown(self) -> dict[str, str]:
        """The stacks asked for that the catalog cannot give: name -> why."""
        catalog = self.wiring.catalog()
        return {name: str(e) for name in self.names if (e := _refusal(catalog.stack, name))}

    @cached_property
    def stacks(self) -> list[Stack]:
        catalog = self.wiring.catalog()
        return [catalog.stack(name) for name in self.names if name not in self.unknown]

    @property
    def names(self) -> tuple[str, ...]:
        return self.named or self.desired.stacks

    @cached_property
    def policy(self) -> ImagePolicy:
        return self.wiring.policy()

    @cached_property
    def image_bytes(self) -> dict[str, int | SparkctlError]:
        """Each stack image's compressed size at its registry (or mirror), by ref."""
        sizes: dict[str, int | SparkctlError] = {}
        for ref in {s.image.ref for s in self.stacks}:
            try:
                sizes[ref] = registry.image_bytes(ref, mirrors=self.settings.registry_mirrors)
            except SparkctlError as e:
                sizes[ref] = e
        return sizes

    def source(self, ref: str) -> str:
        """Where the image is fetched from: its registry, or the mirror configured for it."""
        return parse_ref(mirrored(parse_ref(ref), self.settings.registry_mirrors)).registry

    @cached_property
    def snapshots(self) -> dict[tuple[str, str], Snapshot | SparkctlError]:
        """Each weights repo of the stacks at the Hub, with its files' sizes, by (repo, revision)."""
        hub = self.wiring.hub()
        found: dict[tuple[str, str], Snapshot | SparkctlError] = {}
        for weights in self.weights:
            try:
                found[(weights.repo, weights.revision)] = hub.resolve(weights.repo, weights.revision)
            except SparkctlError as e:
                found[(weights.repo, weights.revision)] = e
        return found

    @property
    def weights(self) -> list[Weights]:
        seen = {(w.repo, w.revision): w for s in self.stacks for w in (s.model, s.draft) if w and w.repo}
        return list(seen.values())


def _refusal(find, name: str) -> SparkctlError | None:  # noqa: ANN001 - Catalog.stack
    try:
        find(name)
    except SparkctlError as e:
        return e
    return None
