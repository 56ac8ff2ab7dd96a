"""Stand-in for vLLM's stock Qwen3 DFlash draft model (the DSpark draft replaces this file)."""


class Qwen3DFlashForCausalLM:
    def __init__(self, vllm_config, prefix=""):
        self.vllm_config = vllm_config
        self.prefix = prefix
