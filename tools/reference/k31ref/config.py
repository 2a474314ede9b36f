"""Normalised text-model configuration.

Accepts (a) the K3.1 wrapper config.json (architecture.md 10.1/10.2: text model under
`text_config`, `linear_attn_config`, 1-based layer lists), (b) a bare Moonshot-style text
config, and (c) transformers' `KimiLinearConfig.save_pretrained` output (`layer_types`,
`mlp_layer_types`, `linear_num_heads`, ...).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class TextConfig:
    vocab_size: int
    hidden_size: int
    num_layers: int
    rms_eps: float
    layer_kinds: list  # "kda" | "mla" per 0-based layer
    ffn_kinds: list  # "dense" | "moe" per layer
    hidden_act: str = "situ"
    situ_beta: float = 4.0
    situ_linear_beta: float | None = 25.0
    intermediate_size: int = 0
    # MoE
    num_experts: int = 0
    experts_per_token: int = 0
    num_shared_experts: int = 0
    moe_intermediate_size: int = 0
    latent_size: int | None = None  # routed_expert_hidden_size (LatentMoE) or None
    latent_norm: bool = False
    router_act: str = "sigmoid"
    num_expert_group: int = 1
    topk_group: int = 1
    renormalize: bool = True
    routed_scaling_factor: float = 1.0
    # MLA
    mla_heads: int = 0
    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_nope: int = 0
    qk_rope: int = 0
    v_head: int = 0
    mla_output_gate: bool = False
    q_a_eps: float = 1e-6
    kv_a_eps: float = 1e-6
    # DSA indexer (None -> dense MLA)
    index_topk: int | None = None
    index_heads: int = 0
    index_head_dim: int = 0
    index_ln_eps: float = 1e-6
    # AttnRes (None -> ordinary additive residual)
    attn_res_block_size: int | None = None
    # KDA
    kda_heads: int = 0
    kda_head_dim: int = 0
    conv_size: int = 4
    gate_lower_bound: float | None = None
    full_rank_gate: bool = False
    kda_norm_eps: float | None = None  # defaults to rms_eps
    tie_word_embeddings: bool = False
    raw: dict = field(default_factory=dict, repr=False)

    @property
    def kda_eps(self):
        return self.rms_eps if self.kda_norm_eps is None else self.kda_norm_eps


def _layer_kinds_from_lac(lac: dict, n: int) -> list:
    kda = set(lac.get("kda_layers") or [])
    full = set(lac.get("full_attn_layers") or [])
    kinds = []
    for l in range(n):
        if (l + 1) in kda:
            kinds.append("kda")
        elif (l + 1) in full or not kda:
            kinds.append("mla")
        else:
            kinds.append("mla")
    return kinds


def parse_config(cfg: dict) -> TextConfig:
    """Build a TextConfig from any of the accepted config.json dialects."""
    top = cfg
    tc = cfg.get("text_config", cfg)
    n = tc["num_hidden_layers"]
    g = tc.get
    # layer schedule
    if g("linear_attn_config") is not None:
        lac = tc["linear_attn_config"]
        kinds = _layer_kinds_from_lac(lac, n)
        kda_heads, kda_hd = lac["num_heads"], lac["head_dim"]
        conv = lac.get("short_conv_kernel_size", 4)
        lb = lac.get("gate_lower_bound")
        full_rank = bool(lac.get("use_full_rank_gate", False))
    else:
        lt = g("layer_types") or ["full_attention"] * n
        kinds = ["kda" if t == "linear_attention" else "mla" for t in lt]
        kda_heads = g("linear_num_heads") or g("num_attention_heads")
        kda_hd = g("linear_head_dim") or 128
        conv = g("linear_conv_kernel_dim") or 4
        lb = g("gate_lower_bound")
        full_rank = bool(g("use_full_rank_gate", False))
    # FFN schedule
    num_experts = g("num_experts", g("num_local_experts", g("n_routed_experts")))
    if g("mlp_layer_types") is not None:
        ffn = ["moe" if t == "sparse" else "dense" for t in tc["mlp_layer_types"]]
    else:
        fk = g("first_k_dense_replace", 0) or 0
        freq = g("moe_layer_freq", 1) or 1
        ffn = ["moe" if (num_experts and l >= fk and l % freq == 0) else "dense" for l in range(n)]
    act = g("hidden_act", "silu")
    c = TextConfig(
        vocab_size=tc["vocab_size"],
        hidden_size=tc["hidden_size"],
        num_layers=n,
        rms_eps=g("rms_norm_eps", 1e-5),
        layer_kinds=kinds,
        ffn_kinds=ffn,
        hidden_act=act,
        situ_beta=(g("activation_situ_beta") or 1.0) if act == "situ" else 1.0,
        situ_linear_beta=g("activation_situ_linear_beta") if act == "situ" else None,
        intermediate_size=g("intermediate_size", 0),
        num_experts=num_experts or 0,
        experts_per_token=g("num_experts_per_token", g("num_experts_per_tok", 0)) or 0,
        num_shared_experts=g("num_shared_experts", g("n_shared_experts", 0)) or 0,
        moe_intermediate_size=g("moe_intermediate_size", 0) or 0,
        latent_size=g("routed_expert_hidden_size"),
        latent_norm=bool(g("latent_moe_use_norm", False)),
        router_act=g("moe_router_activation_func", g("scoring_func", "sigmoid")) or "sigmoid",
        num_expert_group=g("num_expert_group", g("n_group", 1)) or 1,
        topk_group=g("topk_group", 1) or 1,
        renormalize=bool(g("moe_renormalize", g("norm_topk_prob", True))),
        routed_scaling_factor=float(g("routed_scaling_factor", 1.0) or 1.0),
        mla_heads=g("num_attention_heads", 0),
        q_lora_rank=g("q_lora_rank"),
        kv_lora_rank=g("kv_lora_rank", 0) or 0,
        qk_nope=g("qk_nope_head_dim", 0) or 0,
        qk_rope=g("qk_rope_head_dim", 0) or 0,
        v_head=g("v_head_dim", 0) or 0,
        mla_output_gate=bool(g("mla_use_output_gate", False)),
        q_a_eps=g("q_a_layernorm_eps", 1e-6),
        kv_a_eps=g("kv_a_layernorm_eps", 1e-6),
        index_topk=g("index_topk"),
        index_heads=g("index_n_heads", 0) or 0,
        index_head_dim=g("index_head_dim", 0) or 0,
        attn_res_block_size=g("attn_res_block_size"),
        kda_heads=kda_heads,
        kda_head_dim=kda_hd,
        conv_size=conv,
        gate_lower_bound=lb,
        full_rank_gate=full_rank,
        tie_word_embeddings=bool(g("tie_word_embeddings", top.get("tie_word_embeddings", False))),
        raw=cfg,
    )
    if c.index_topk is not None:
        if (g("index_rope_dim") or 0) != 0:
            raise ValueError("index_rope_dim != 0 is not supported (K3.1 uses 0)")
        if g("index_use_hadamard"):
            raise ValueError("index_use_hadamard is not supported")
        if (g("index_topk_freq") or 1) != 1:
            raise ValueError("index_topk_freq != 1 is not supported")
    return c


def load_config(model_dir) -> TextConfig:
    return parse_config(json.loads((Path(model_dir) / "config.json").read_text()))
