"""The composition root: the Docker adapter, the state store, the image policy, the catalog and
the deploy pipeline, built from the settings in one way for the CLI's in-process commands and
for the daemon. Stack files (when one changed) and the image policy are read again on each
call, so edits apply without a restart; the adapters and the store are made once per process.
Each part is imported when first asked for: `sparkctl stacks list` must not pay for the Docker
SDK."""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING

from sparkctl.settings import Settings

if TYPE_CHECKING:
    from sparkctl.adapters.docker import DockerEngine
    from sparkctl.deploy.pipeline import Deployer
    from sparkctl.deploy.progress import Reporter
    from sparkctl.policy.images import ImagePolicy
    from sparkctl.spec.load import Catalog
    from sparkctl.state.store import Store


class Wiring:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    @cached_property
    def docker(self) -> DockerEngine:
        """The handle on this instance's Docker engine (one per endpoint: `SPARKCTL_DOCKER_HOST`)."""
        from sparkctl.adapters.docker import DockerEngine

        return DockerEngine(self.settings.docker_host, instance=self.settings.instance)

    @cached_property
    def store(self) -> Store:
        from sparkctl.state.store import Store

        return Store(self.settings.store_path)

    def catalog(self) -> Catalog:
        from sparkctl.spec.load import catalog_for

        return catalog_for(self.settings)

    def policy(self) -> ImagePolicy:
        from sparkctl.spec.imagefile import policy_for

        return policy_for(self.settings)

    def deployer(self, reporter: Reporter, *, catalog: Catalog | None = None, policy: ImagePolicy | None = None
                 ) -> Deployer:
        from sparkctl.adapters.hub import HubClient
        from sparkctl.deploy.pipeline import Deployer

        s = self.settings
        hub = HubClient(cache_dir=s.hf_cache_dir, token=s.hf_token.get_secret_value() if s.hf_token else None,
                        endpoint=s.hf_endpoint)
        return Deployer(s, catalog or self.catalog(), policy or self.policy(), self.docker, hub, self.store, reporter)
