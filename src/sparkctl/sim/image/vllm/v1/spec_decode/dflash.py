"""Stand-in for vLLM's DFlash proposer, with the class layout of the aeon image's file.

Like the real file, `DFlashProposer` does not define `_draft_kv_cache_group_ids` or
`_draft_layer_to_kv_cache_gid`: the DSpark base proposer needs them, hence sparkctl's shim.
"""

from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer


class DFlashProposer(SpecDecodeBaseProposer):
    def __init__(self, vllm_config, device, runner=None):
        super().__init__(vllm_config, device, runner)
        self.block_size = 16

    def set_inputs_first_pass(self, target_token_ids, next_token_ids, target_positions):
        return target_token_ids, target_positions

    def dummy_run(self, num_tokens):
        return num_tokens

    @property
    def dflash_config(self):
        return getattr(self.vllm_config, "speculative_config", None)
