"""The parts every process builds from the settings, one way: the Docker adapter, the state
store, the image policy, the catalog and the deploy pipeline, for the daemon (whose composition
root is `daemon/app.Daemon`), a host agent and the CLI's file-reading commands. Stack files (when
one changed) and the image policy are read again on each call, so edits apply without a restart
(a file that does not load is reported once, and left out); the adapters and the store are made
once per process. Each part is imported when first asked for: `sparkctl stacks render` does not
pay for the Docker SDK."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from functools import cached_property
from typing import TYPE_CHECKING

from sparkctl.settings import Settings

if TYPE_CHECKING:
    from sparkctl.adapters.docker import DockerEngine
    from sparkctl.adapters.hub import HubClient
    from sparkctl.deploy.pipeline import Deployer
    from sparkctl.deploy.progress import Reporter
    from sparkctl.policy.images import ImagePolicy
    from sparkctl.spec.load import Catalog, Invalid
    from sparkctl.state.store import Store


class Wiring:
    def __init__(self, settings: Settings, *, docker: DockerEngine | None = None,
                 on_invalid: Callable[[Invalid], None] | None = None) -> None:
        """`docker`: a handle already made (a host agent's on its host's engine), else one is made
        from the settings when first asked for. `on_invalid` hears of each stack or patch-set file
        left out of the catalog (with the stacks built on it), once while it stays as it is; by
        default a warning in the log (the daemon's, an agent's)."""
        self.settings = settings
        self._docker = docker
        self.on_invalid = on_invalid or _log_invalid
        self._reported: frozenset[Invalid] = frozenset()
        self._reporting = threading.Lock()

    @property
    def docker(self) -> DockerEngine:
        """The handle on this instance's Docker engine (one per endpoint: `SPARKCTL_DOCKER_HOST`)."""
        if self._docker is None:
            from sparkctl.adapters.docker import DockerEngine

            self._docker = DockerEngine(self.settings.docker_host, instance=self.settings.instance)
        return self._docker

    @cached_property
    def store(self) -> Store:
        return self.open_store()

    def open_store(self, *, readonly: bool = False) -> Store:
        """The state store, with the image policy's files under its records (`readonly`: the CLI's)."""
        from sparkctl.spec.imagefile import PolicyFiles
        from sparkctl.state.store import Store

        files = PolicyFiles(self.settings.images_file, self.settings.owner_images_file)
        return Store(self.settings.store_path, readonly=readonly, policy_files=files)

    def catalog(self) -> Catalog:
        from sparkctl.spec.load import catalog_for

        catalog = catalog_for(self.settings)
        causes = frozenset(i for i in catalog.invalid if i.cause is None)  # the rest are named in theirs
        with self._reporting:  # the daemon's loops and API threads all read it
            fresh = sorted(causes - self._reported, key=lambda i: (str(i.file), i.name))
            self._reported = causes
        for invalid in fresh:
            self.on_invalid(invalid)
        return catalog

    def policy(self) -> ImagePolicy:
        """The image policy in force: the shipped file, the owner's, then what sparkctl recorded."""
        return self.store.images.policy()

    def hub(self) -> HubClient:
        from sparkctl.adapters.hub import HubClient

        s = self.settings
        return HubClient(cache_dir=s.hf_cache_dir, token=s.hf_token.get_secret_value() if s.hf_token else None,
                         endpoint=s.hf_endpoint)

    def deployer(self, reporter: Reporter, *, catalog: Catalog | None = None,
                 parked: Callable[[], Mapping[str, int]] = dict) -> Deployer:
        """`parked`: the parked stacks and their levels (what they hold counts at admission), as
        the daemon, which owns desired.yaml, has them."""
        from sparkctl.deploy.pipeline import Deployer

        return Deployer(self.settings, catalog or self.catalog(), self.policy(), self.docker, self.hub(), self.store,
                        reporter, parked=parked)


def _log_invalid(invalid: Invalid) -> None:
    import structlog

    structlog.get_logger().warning("stack_file_invalid", file=str(invalid.file), line=invalid.line, key=invalid.key,
                                   problem=invalid.problem, stack=invalid.name, kind=invalid.kind,
                                   dependents=list(invalid.dependents),
                                   hint="the other stacks load; commands about this one fail until the file is fixed")
