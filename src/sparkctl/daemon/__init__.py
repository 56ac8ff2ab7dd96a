"""The daemon: keeps the machine converged to the desired state and serves a local API."""
