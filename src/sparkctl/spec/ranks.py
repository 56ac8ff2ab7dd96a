"""A multi-node stack's ranks, rendered: each rank's `vllm serve` flags and its host's network
environment. Pure; `render.render` adds them to a rank's container plan and `stacks render
--rank R` prints them.

vLLM's native multi-node mode (the `mp` executor, no Ray inside the engine): every rank runs
`--nnodes N --node-rank r --master-addr ADDR --master-port P` with the same parallel sizes; ranks
above 0 add `--headless` (no API server), rank 0 serves HTTP. Flag names as in vLLM's
`ParallelConfig` (master_addr, master_port, node_rank, nnodes) and `vllm serve --headless`.
Each rank's network settings come from its own host's inventory entry, never from another host's
or from the default route: the address its engine binds and advertises (`VLLM_HOST_IP`), and the
interface gloo, NCCL, TensorPipe and UCX use; `NCCL_IB_HCA` only where the inventory names the
host's RDMA device (hosts may be cabled to different CX-7 ports).
"""

from __future__ import annotations

from dataclasses import dataclass

from sparkctl.spec.models import Parallel


@dataclass(frozen=True)
class RankHost:
    """What a rank needs of the host it runs on (from that host's `serving` entry)."""

    name: str
    interface: str
    address: str
    hca: str | None = None


@dataclass(frozen=True)
class Rank:
    index: int
    master: str  # rank 0's serving address
    host: RankHost

    @property
    def headless(self) -> bool:
        return self.index > 0


def rank_args(parallel: Parallel, rank: Rank) -> list[str]:
    """The multi-node flags of one rank, after the stack's own."""
    args = ["--distributed-executor-backend", "mp", "--nnodes", str(parallel.nodes), "--node-rank", str(rank.index),
            "--master-addr", rank.master, "--master-port", str(parallel.master_port)]
    args += ["--tensor-parallel-size", str(parallel.tensor), "--pipeline-parallel-size", str(parallel.pipeline)]
    if parallel.data > 1:
        args += ["--data-parallel-size", str(parallel.data)]
    return [*args, "--headless"] if rank.headless else args


NETWORK_ENV = ("VLLM_HOST_IP", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "UCX_NET_DEVICES",
               "NCCL_IB_HCA")


def rank_env(host: RankHost) -> dict[str, str]:
    """The network environment of a rank on `host`: its own interface and address only (render
    drops these keys from the stack's env first, so none is carried from one host to another)."""
    env = {"VLLM_HOST_IP": host.address, "GLOO_SOCKET_IFNAME": host.interface, "NCCL_SOCKET_IFNAME": host.interface,
           "TP_SOCKET_IFNAME": host.interface, "UCX_NET_DEVICES": host.interface}
    return env | ({"NCCL_IB_HCA": host.hca} if host.hca else {})
