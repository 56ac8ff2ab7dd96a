"""Make a tiny model directory: a byte-level BPE tokenizer with a chat template, a Llama config
and random weights (safetensors). Small enough for tests and the demo; loadable by vLLM's CPU
build and readable by llama-benchy's tokenizer loader. Used by tests and the local Hub.
"""

from __future__ import annotations

import json
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
_CORPUS = [
    "The quick brown fox jumps over the lazy dog while the model streams tokens.",
    "Speculative decoding drafts several tokens and the target model verifies them.",
    "Unified memory on the Spark holds the weights, the KV cache and the page cache.",
    "Benchmarks measure prefill and decode throughput at growing context depths.",
]
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|user|>", "<|assistant|>", "<|system|>"]


def write_tokenizer(target: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_CORPUS * 20, trainer)
    target.mkdir(parents=True, exist_ok=True)
    tok.save(str(target / "tokenizer.json"))
    (target / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": SPECIALS[0], "eos_token": SPECIALS[1],
        "chat_template": CHAT_TEMPLATE, "model_max_length": 2048}, indent=2))


def write_model(target: Path, *, weights: bool = True) -> Path:
    """A Llama with hidden 256, 2 layers, 4 heads (head_dim 64, as vLLM's CPU attention needs)."""
    write_tokenizer(target)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
              "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 2048,
              "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "torch_dtype": "float32",
              "bos_token_id": 0, "eos_token_id": 1, "tie_word_embeddings": False}
    (target / "config.json").write_text(json.dumps(config, indent=2))
    (target / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": 1}))
    if weights:
        _write_weights(target / "model.safetensors", config)
    return target


def _write_weights(path: Path, c: dict) -> None:
    import numpy as np
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    h, i, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    kv = h // c["num_attention_heads"] * c["num_key_value_heads"]

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    tensors = {"model.embed_tokens.weight": w(v, h), "model.norm.weight": np.ones(h, np.float32),
               "lm_head.weight": w(v, h)}
    for n in range(c["num_hidden_layers"]):
        p = f"model.layers.{n}."
        tensors |= {p + "self_attn.q_proj.weight": w(h, h), p + "self_attn.k_proj.weight": w(kv, h),
                    p + "self_attn.v_proj.weight": w(kv, h), p + "self_attn.o_proj.weight": w(h, h),
                    p + "mlp.gate_proj.weight": w(i, h), p + "mlp.up_proj.weight": w(i, h),
                    p + "mlp.down_proj.weight": w(h, i), p + "input_layernorm.weight": np.ones(h, np.float32),
                    p + "post_attention_layernorm.weight": np.ones(h, np.float32)}
    save_file(tensors, str(path), metadata={"format": "pt"})


def cached_model(cache_root: Path) -> Path:
    """`write_model` once per content of this module: later calls reuse the directory."""
    import hashlib
    import os
    import tempfile

    key = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]
    target = cache_root / f"tiny-{key}"
    if (target / "config.json").is_file():
        return target
    cache_root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=cache_root))
    write_model(scratch)
    for path in [scratch, *scratch.iterdir()]:
        path.chmod(0o755 if path.is_dir() else 0o644)  # readable inside containers
    try:
        os.rename(scratch, target)
    except OSError:  # another process got there first
        import shutil

        shutil.rmtree(scratch)
    return target
