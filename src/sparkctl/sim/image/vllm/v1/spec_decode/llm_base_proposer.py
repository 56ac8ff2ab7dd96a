"""Stand-in for vLLM's speculative-decoding base proposer (stock layout, no DSpark changes)."""


class SpecDecodeBaseProposer:
    def __init__(self, vllm_config, device, runner=None):
        self.vllm_config = vllm_config
        self.device = device
        self.runner = runner

    def load_model(self, target_model):
        # The DSpark proposer reads these per-class tables; the stock base never sets them.
        return (self._draft_kv_cache_group_ids, self._draft_layer_to_kv_cache_gid)

    def propose(self, target_token_ids, target_positions, target_hidden_states):
        raise NotImplementedError
