"""Named model shapes (`model: NAME`, `ModelConfig.preset`): a test-sized model up to
Llama-3-8B and DeepSeek-V3, as ModelConfig fields."""

from __future__ import annotations

PRESETS: dict[str, dict] = {
    # Tests: fast on 2 CPU cores, 4 layers so pp=2 with 2 virtual stages has a layer per stage.
    "tiny": {
        "vocab_size": 256,
        "dim": 64,
        "n_layers": 4,
        "n_heads": 4,
        "n_kv_heads": 2,
        "ffn_hidden_dim": 128,
        "max_seq_len": 256,
    },
    # GPT-2-small sized Llama.
    "125m": {
        "vocab_size": 32000,
        "dim": 768,
        "n_layers": 12,
        "n_heads": 12,
        "n_kv_heads": 12,
        "ffn_hidden_dim": 2048,
        "max_seq_len": 2048,
    },
    # Llama-3.2-1B shape.
    "1b": {
        "vocab_size": 128256,
        "dim": 2048,
        "n_layers": 16,
        "n_heads": 32,
        "n_kv_heads": 8,
        "ffn_hidden_dim": 8192,
        "rope_theta": 500000.0,
        "max_seq_len": 4096,
        "tie_embeddings": True,
    },
    # DeepSeek-V3 shape, 671B parameters, 37B active (FLOP and memory planning).
    "deepseek_v3": {
        "vocab_size": 129280,
        "dim": 7168,
        "n_layers": 61,
        "n_heads": 128,
        "ffn_hidden_dim": 18432,
        "norm_eps": 1e-6,
        "mla": {"kv_lora_rank": 512, "q_lora_rank": 1536},
        "n_experts": 256,
        "top_k": 8,
        "moe_hidden_dim": 2048,
        "n_shared_experts": 1,
        "first_dense_layers": 3,
        "router_score": "sigmoid",
        "n_expert_groups": 8,
        "topk_groups": 4,
        "routed_scaling_factor": 2.5,
        "moe_aux_loss_coef": 0.0,
        "rope_scaling": {
            "rope_type": "yarn",
            "factor": 40.0,
            "original_max_seq_len": 4096,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
        "max_seq_len": 163840,
    },
    # Llama-3-8B shape (FLOP and memory planning).
    "llama3_8b": {
        "vocab_size": 128256,
        "dim": 4096,
        "n_layers": 32,
        "n_heads": 32,
        "n_kv_heads": 8,
        "ffn_hidden_dim": 14336,
        "rope_theta": 500000.0,
        "max_seq_len": 8192,
    },
}
