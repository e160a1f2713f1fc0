"""The cache across processes, on torch.distributed (gloo on a CPU, the same code on NCCL).

    launch      start N processes in one gloo group; a dead peer or a stuck collective -> PeerFailed
    tp          tensor parallelism: heads (and their K/V) split across ranks; run_tp
    transfer    disaggregated prefill/decode: a connector ships the prompt's cache; run_disaggregated
    tier        a host tier under the paged prefix cache: evicted blocks come back on a hit; add_host_tier
"""

from .launch import PeerFailed, launch
from .tier import HostTierPool, add_host_tier
from .tp import TPConfigError, TPResult, run_tp
from .transfer import (Connector, DisaggResult, FileConnector, GlooConnector, KVMessage, TransferMismatch,
                       header_bytes, run_disaggregated)

__all__ = ["PeerFailed", "launch", "TPConfigError", "TPResult", "run_tp", "Connector", "DisaggResult",
           "FileConnector", "GlooConnector", "KVMessage", "TransferMismatch", "header_bytes", "run_disaggregated",
           "HostTierPool", "add_host_tier"]
