"""Deterministic random K3.1 checkpoints in the docs/formats.md layout.

Init scales keep a random model finite and its gates non-degenerate:
projections ~ N(0, 1/fan_in), norm weights ~ U(0.8, 1.2), A_log = log U(1, 16),
dt_bias = inverse-softplus(dt) with dt log-uniform in [1e-3, 0.1], embeddings ~ N(0, 1).
Routed experts are drawn dense, then quantised to MXFP4 (architecture.md section 7).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file

from . import ops
from .config import parse_config

BF16, F32 = torch.bfloat16, torch.float32


def tiny_text_config(vocab_size=512, index_topk=16) -> dict:
    """architecture.md 10.2 (`tiny`) with a small vocabulary and a configurable index_topk."""
    return {
        "architectures": ["KimiLinearForCausalLM"],
        "model_type": "kimi_linear",
        "vocab_size": vocab_size, "hidden_size": 256, "num_hidden_layers": 8,
        "rms_norm_eps": 1e-05, "max_position_embeddings": 1048576, "tie_word_embeddings": False,
        "hidden_act": "situ", "activation_situ_beta": 4.0, "activation_situ_linear_beta": 25.0,
        "intermediate_size": 512, "first_k_dense_replace": 1, "moe_layer_freq": 1,
        "num_experts": 16, "num_experts_per_token": 4, "num_shared_experts": 2,
        "moe_intermediate_size": 64, "routed_expert_hidden_size": 128, "latent_moe_use_norm": True,
        "moe_router_activation_func": "sigmoid", "topk_method": "noaux_tc", "use_grouped_topk": True,
        "num_expert_group": 1, "topk_group": 1, "moe_renormalize": True, "routed_scaling_factor": 1.0,
        "num_attention_heads": 4, "num_key_value_heads": 4,
        "q_lora_rank": 96, "kv_lora_rank": 64,
        "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32,
        "mla_use_nope": True, "mla_use_output_gate": True,
        "index_n_heads": 4, "index_head_dim": 32, "index_topk": index_topk, "index_topk_freq": 1,
        "index_rope_dim": 0, "index_use_hadamard": False,
        "attn_res_block_size": 3,
        "num_nextn_predict_layers": 0,
        "linear_attn_config": {
            "num_heads": 2, "head_dim": 128, "short_conv_kernel_size": 4,
            "gate_lower_bound": -5.0, "use_full_rank_gate": True,
            "full_attn_layers": [4, 8], "kda_layers": [1, 2, 3, 5, 6, 7],
        },
        "quantization_config": {
            "quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized",
            "kv_cache_scheme": None,
            "config_groups": {"group_0": {"format": "mxfp4-pack-quantized", "targets": ["Linear"],
                                          "input_activations": None,
                                          "weights": {"num_bits": 4, "type": "float", "group_size": 32,
                                                      "symmetric": True, "strategy": "group",
                                                      "scale_dtype": "torch.uint8"}}},
            "ignore": ["re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
                       "re:.*routed_expert_(down|up)_proj.*", "re:.*_res_proj.*", "re:.*lm_head.*"],
        },
    }


def wrap_config(text_config: dict) -> dict:
    return {
        "architectures": ["KimiK31ForConditionalGeneration"],
        "model_type": "kimi_k31",
        "bos_token_id": 163584, "eos_token_id": 163586, "pad_token_id": 163839,
        "media_placeholder_token_id": 163605,
        "tie_word_embeddings": False,
        "text_config": text_config,
    }


class _Rng:
    def __init__(self, seed):
        self.g = torch.Generator().manual_seed(seed)

    def normal(self, *shape, std=1.0):
        return torch.randn(*shape, generator=self.g, dtype=torch.float64) * std

    def uniform(self, *shape, a=0.0, b=1.0):
        return a + (b - a) * torch.rand(*shape, generator=self.g, dtype=torch.float64)

    def proj(self, out, inp, gain=1.0):
        return self.normal(out, inp, std=gain / math.sqrt(inp))

    def norm(self, n):
        return self.uniform(n, a=0.8, b=1.2)


def inverse_softplus(y):
    return y + torch.log(-torch.expm1(-y))


def random_k31_weights(text_config: dict, seed: int) -> dict:
    """Returns {canonical name (model.* / lm_head.*): tensor in its file dtype}."""
    cfg = parse_config(text_config)
    r = _Rng(seed)
    d, V = cfg.hidden_size, cfg.vocab_size
    t = {}

    def put(name, x, dtype=BF16):
        t[name] = x.to(dtype).contiguous()

    put("model.embed_tokens.weight", r.normal(V, d))
    put("model.norm.weight", r.norm(d))
    put("lm_head.weight", r.proj(V, d))
    if cfg.attn_res_block_size is not None:
        put("model.output_attn_res_norm.weight", r.norm(d))
        put("model.output_attn_res_proj.weight", r.proj(1, d))
    H, K, Wc = cfg.kda_heads, cfg.kda_head_dim, cfg.conv_size
    P = H * K
    for l in range(cfg.num_layers):
        p = f"model.layers.{l}."
        put(p + "input_layernorm.weight", r.norm(d))
        put(p + "post_attention_layernorm.weight", r.norm(d))
        if cfg.attn_res_block_size is not None:
            for nm in ("self_attention_res", "mlp_res"):
                put(p + nm + "_norm.weight", r.norm(d))
                put(p + nm + "_proj.weight", r.proj(1, d))
        a = p + "self_attn."
        if cfg.layer_kinds[l] == "kda":
            for nm in ("q", "k", "v"):
                put(a + f"{nm}_proj.weight", r.proj(P, d))
            for nm in ("q", "k", "v"):
                put(a + f"{nm}_conv1d.weight", r.normal(P, 1, Wc, std=1.0 / math.sqrt(Wc)), F32)
            put(a + "f_a_proj.weight", r.proj(K, d))
            put(a + "f_b_proj.weight", r.proj(P, K, gain=0.5))
            if cfg.gate_lower_bound is not None:
                # bounded gate: L*sigmoid(A*(f+dt_bias)); spread A*z around 0 so exp(g) covers (e^L, 1)
                put(a + "dt_bias", r.uniform(P, a=-2.0, b=0.0), F32)
            else:
                dt = torch.exp(r.uniform(P, a=math.log(1e-3), b=math.log(0.1)))
                put(a + "dt_bias", inverse_softplus(dt), F32)
            put(a + "A_log", torch.log(r.uniform(H, a=1.0, b=16.0)), F32)
            put(a + "b_proj.weight", r.proj(H, d))
            if cfg.full_rank_gate:
                put(a + "g_proj.weight", r.proj(P, d))
            else:
                put(a + "g_a_proj.weight", r.proj(K, d))
                put(a + "g_b_proj.weight", r.proj(P, K))
            put(a + "o_norm.weight", r.norm(K))
            put(a + "o_proj.weight", r.proj(d, P))
        else:
            Hm, n, rr, vd = cfg.mla_heads, cfg.qk_nope, cfg.qk_rope, cfg.v_head
            Lq, Lkv = cfg.q_lora_rank, cfg.kv_lora_rank
            if Lq is not None:
                put(a + "q_a_proj.weight", r.proj(Lq, d))
                put(a + "q_a_layernorm.weight", r.norm(Lq))
                put(a + "q_b_proj.weight", r.proj(Hm * (n + rr), Lq))
            else:
                put(a + "q_proj.weight", r.proj(Hm * (n + rr), d))
            put(a + "kv_a_proj_with_mqa.weight", r.proj(Lkv + rr, d))
            put(a + "kv_a_layernorm.weight", r.norm(Lkv))
            put(a + "kv_b_proj.weight", r.proj(Hm * (n + vd), Lkv))
            if cfg.mla_output_gate:
                put(a + "g_proj.weight", r.proj(Hm * vd, d))
            put(a + "o_proj.weight", r.proj(d, Hm * vd))
            if cfg.index_topk is not None:
                IH, ID = cfg.index_heads, cfg.index_head_dim
                put(a + "indexer.wq_b.weight", r.proj(IH * ID, Lq))
                put(a + "indexer.wk.weight", r.proj(ID, d))
                put(a + "indexer.k_norm.weight", r.norm(ID), F32)
                put(a + "indexer.k_norm.bias", r.normal(ID, std=0.1), F32)
                put(a + "indexer.weights_proj.weight", r.proj(IH, d))
        if cfg.ffn_kinds[l] == "dense":
            m = p + "mlp."
            I = cfg.intermediate_size
            put(m + "gate_proj.weight", r.proj(I, d))
            put(m + "up_proj.weight", r.proj(I, d))
            put(m + "down_proj.weight", r.proj(d, I))
        else:
            m = p + "block_sparse_moe."
            E, Ie, Lm, S = cfg.num_experts, cfg.moe_intermediate_size, cfg.latent_size, cfg.num_shared_experts
            put(m + "gate.weight", r.proj(E, d))
            put(m + "gate.e_score_correction_bias", r.normal(E, std=0.05), F32)
            put(m + "routed_expert_down_proj.weight", r.proj(Lm, d))
            put(m + "routed_expert_norm.weight", r.norm(Lm))
            put(m + "routed_expert_up_proj.weight", r.proj(d, Lm))
            for e in range(E):
                for nm, (o, i) in (("w1", (Ie, Lm)), ("w3", (Ie, Lm)), ("w2", (Lm, Ie))):
                    pk, sc = ops.mxfp4_encode(r.proj(o, i))
                    t[m + f"experts.{e}.{nm}.weight_packed"] = pk
                    t[m + f"experts.{e}.{nm}.weight_scale"] = sc
            if S:
                put(m + "shared_experts.gate_proj.weight", r.proj(S * Ie, d))
                put(m + "shared_experts.up_proj.weight", r.proj(S * Ie, d))
                put(m + "shared_experts.down_proj.weight", r.proj(d, S * Ie))
    return t


def save_k31_checkpoint(out_dir, text_config: dict, tensors: dict, prefix="language_model."):
    """Write config.json (10.1 wrapper) and model.safetensors with prefixed names, sorted keys."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(wrap_config(text_config), indent=1, sort_keys=False) + "\n")
    named = {prefix + k: v for k, v in sorted(tensors.items())}
    save_file(named, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
