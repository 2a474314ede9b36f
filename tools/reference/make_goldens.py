"""Regenerate tests/golden/ bit-identically (fixed seeds, deterministic single-threaded torch).

    python make_goldens.py                 # write into <repo>/tests/golden
    python make_goldens.py --out DIR       # write elsewhere
    python make_goldens.py --check         # regenerate into a temp dir, compare with the committed files

All reference values are computed in float64 from the exact stored inputs/weights and stored as float32
(int32 for indices). tests/golden/README.md documents every file and tensor.
"""
import argparse
import filecmp
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

from k31ref import Model, ops, randinit  # noqa: E402

F64, F32, BF16, I32 = torch.float64, torch.float32, torch.bfloat16, torch.int32

# TINY_SEED was picked by a deterministic scan of seeds 3100..3159 (see README): with it, every index-selection
# boundary of the 40 prompt rows has a relative gap >= CLEAR_REL_GAP in both MLA layers, so the prompt logits are
# robust to bf16 index keys; rows in the greedy continuation may not be (outputs.json lists them).
TINY_SEED = 3123
TINY_SEQ, TINY_PREFILL, TINY_GREEDY, TINY_TOPK = 40, 20, 16, 16
# index-selection boundary is called "clear" when the k-th/(k+1)-th score gap exceeds this fraction of the row's
# largest |score| (spec 5.3: bf16 rounding of index keys moves scores by ~1e-3 relative)
CLEAR_REL_GAP = 2e-3


def gen(seed):
    return torch.Generator().manual_seed(seed)


def bf16_exact(x):
    """Round to bf16 and return (bf16 tensor for the file, float64 copy of the exact same values)."""
    b = x.to(BF16).contiguous()
    return b, b.to(F64)


def f32_exact(x):
    b = x.to(F32).contiguous()
    return b, b.to(F64)


def save(path, tensors, meta=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    t = {k: (v.contiguous() if v.is_floating_point() or v.dtype in (torch.uint8,) else v.to(I32).contiguous())
         for k, v in tensors.items()}
    t = {k: (v.to(F32) if v.dtype == F64 else v) for k, v in t.items()}
    # a single metadata key: safetensors orders multi-key metadata by hash (not reproducible)
    save_file(t, str(path), metadata={"generator": "tools/reference/make_goldens.py"})


def _finite(o):
    """JSON without NaN/Infinity (serde_json rejects them): non-finite floats become null."""
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_finite(v) for v in o]
    return o


def write_json(path, obj):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_finite(obj), indent=1, sort_keys=True, allow_nan=False) + "\n")


# ------------------------------------------------------------------------------------------------- KDA


def make_kda(out):
    H, K = 2, 128
    t, cases = {}, []
    for form, Ts in (("bounded", (1, 17, 64, 200)), ("softplus", (1, 17, 64))):
        for T in Ts:
            g = gen(1000 + T + (0 if form == "bounded" else 7))
            name = f"{form}_T{T}"
            q_b, q = bf16_exact(torch.randn(T, H, K, generator=g, dtype=F64))
            k_b, k = bf16_exact(torch.randn(T, H, K, generator=g, dtype=F64))
            v_b, v = bf16_exact(torch.randn(T, H, K, generator=g, dtype=F64))
            f_b, f = bf16_exact(torch.randn(T, H, K, generator=g, dtype=F64))
            bl_b, bl = bf16_exact(torch.randn(T, H, generator=g, dtype=F64))
            A_b, A_log = f32_exact(torch.log(torch.empty(H, dtype=F64).uniform_(1, 16, generator=g)))
            if form == "bounded":
                dt_b, dt_bias = f32_exact(torch.empty(H * K, dtype=F64).uniform_(-2, 0, generator=g))
                gg = ops.kda_gate_bounded(f, A_log, dt_bias, -5.0)
            else:
                dt = torch.exp(torch.empty(H * K, dtype=F64).uniform_(math.log(1e-3), math.log(0.1), generator=g))
                dt_b, dt_bias = f32_exact(randinit.inverse_softplus(dt))
                gg = ops.kda_gate_softplus(f, A_log, dt_bias)
            S0_b, S0 = bf16_exact(torch.randn(H, K, K, generator=g, dtype=F64) * 0.5)
            beta = torch.sigmoid(bl)
            o, S = ops.kda_recurrent(ops.l2n(q), ops.l2n(k), v, gg, beta, K ** -0.5, S0)
            for nm, val in dict(q=q_b, k=k_b, v=v_b, f=f_b, b=bl_b, A_log=A_b, dt_bias=dt_b, S0=S0_b, g=gg,
                                beta=beta, o=o, S=S).items():
                t[f"{name}.{nm}"] = val
            cases.append({"name": name, "T": T, "H": H, "K": K, "V": K, "gate": form,
                          "lower_bound": -5.0 if form == "bounded" else None, "scale": K ** -0.5,
                          "g_min": float(gg.min()), "g_max": float(gg.max())})
    save(out / "ops" / "kda.safetensors", t)
    return {"kda.safetensors": cases}


# --------------------------------------------------------------------------------------- indexer / DSA


def _indexer_case(T, topk, seed, IH=4, ID=128, dup=None, zero_frac=None):
    g = gen(seed)
    if zero_frac is None:
        qI_b, qI = bf16_exact(torch.randn(T, IH, ID, generator=g, dtype=F64))
        kraw = torch.randn(T, ID, generator=g, dtype=F64)
        w_raw = torch.randn(T, IH, generator=g, dtype=F64)
    else:
        # every query leans along u; a fraction of the keys point along -u, so all their head dots are negative
        # and their scores are exactly 0 (non-negative head weights): exact-zero ties at the top-k boundary
        u = torch.randn(ID, generator=g, dtype=F64)
        qI_b, qI = bf16_exact(2 * u + torch.randn(T, IH, ID, generator=g, dtype=F64))
        neg = torch.rand(T, generator=g, dtype=F64) < zero_frac
        kraw = torch.where(neg[:, None], -u + 0.3 * torch.randn(T, ID, generator=g, dtype=F64),
                           torch.randn(T, ID, generator=g, dtype=F64))
        w_raw = torch.randn(T, IH, generator=g, dtype=F64).abs()
    if dup:
        kraw = kraw[torch.arange(T) % dup]
    kI_b, kI = bf16_exact(ops.layer_norm(kraw, torch.ones(ID, dtype=F64), None))
    w_b, w = f32_exact(w_raw * IH ** -0.5 * ID ** -0.5)
    scores = ops.indexer_scores(qI, kI, w, torch.arange(T))
    sel = ops.topk_select(scores, topk)
    gap = ops.topk_boundary_gap(scores, topk)
    return dict(qI=qI_b, kI=kI_b, w=w_b, scores=scores, selected=sel, gap=gap), (qI, kI, w, scores, sel)


# per-op indexer cases give the exact (bf16) inputs: only f32 accumulation order differs in an engine
CLEAR_REL_GAP_EXACT_INPUTS = 1e-5


def _row_stats(scores, sel, gap, topk, thr=CLEAR_REL_GAP):
    T = scores.shape[0]
    rowmax = torch.stack([scores[t][torch.isfinite(scores[t])].abs().max() for t in range(T)])
    rel = torch.where(torch.isinf(gap), gap, gap / rowmax.clamp_min(1e-30))
    clear = (rel >= thr)
    return rel, clear


def make_indexer(out):
    t, cases = {}, []
    for T in (1, 17, 64, 200):
        d, _ = _indexer_case(T, 64, 2000 + T)
        rel, clear = _row_stats(d["scores"], d["selected"], d["gap"], 64, CLEAR_REL_GAP_EXACT_INPUTS)
        for k, v in d.items():
            t[f"T{T}.{k}"] = v
        t[f"T{T}.clear"] = clear.to(I32)
        cases.append({"name": f"T{T}", "T": T, "topk": 64, "IH": 4, "ID": 128, "clear_rel_gap": CLEAR_REL_GAP_EXACT_INPUTS,
                      "rows_below_topk": min(T, 64), "unclear_rows": int((~clear).sum())})
    d, _ = _indexer_case(60, 16, 2100, dup=5)
    rel, clear = _row_stats(d["scores"], d["selected"], d["gap"], 16)
    for k, v in d.items():
        t[f"ties.{k}"] = v
    cases.append({"name": "ties", "T": 60, "topk": 16, "IH": 4, "ID": 128,
                  "note": "keys repeat with period 5: scores tie exactly; selection = score desc, position asc",
                  "tied_boundary_rows": int((d["gap"] == 0).sum())})
    d, _ = _indexer_case(60, 16, 2200, zero_frac=0.7)
    for k, v in d.items():
        t[f"zero_ties.{k}"] = v
    nz = int((d["scores"][torch.isfinite(d["scores"])] == 0).sum())
    cases.append({"name": "zero_ties", "T": 60, "topk": 16, "IH": 4, "ID": 128,
                  "note": "non-negative head weights, many keys with all head dots < 0: exact-zero score ties",
                  "zero_scores": nz, "tied_boundary_rows": int((d["gap"] == 0).sum())})
    save(out / "ops" / "indexer.safetensors", t)
    return {"indexer.safetensors": cases}


def make_sparse_mla(out):
    Hm, n, r, vd, Lkv, topk = 4, 32, 16, 32, 64, 16
    t, cases = {}, []
    for T in (1, 17, 64, 200):
        g = gen(3000 + T)
        qn_b, q_nope = bf16_exact(torch.randn(T, Hm, n, generator=g, dtype=F64))
        qp_b, q_pe = bf16_exact(torch.randn(T, Hm, r, generator=g, dtype=F64))
        c_b, c = bf16_exact(torch.randn(T, Lkv, generator=g, dtype=F64))
        kp_b, k_pe = bf16_exact(torch.randn(T, r, generator=g, dtype=F64))
        kvb_b, kvb = bf16_exact(torch.randn(Hm * (n + vd), Lkv, generator=g, dtype=F64) / Lkv ** 0.5)
        _, (qI, kI, w, scores, sel) = _indexer_case(T, topk, 3100 + T)
        Wkv = kvb.view(Hm, n + vd, Lkv)
        allowed = ops.selection_mask(sel, T) & (torch.arange(T)[None, :] <= torch.arange(T)[:, None])
        o, _ = ops.mla_attention(q_nope, q_pe, c, k_pe, Wkv[:, :n], Wkv[:, n:], allowed, (n + r) ** -0.5)
        for nm, val in dict(q_nope=qn_b, q_pe=qp_b, c=c_b, k_pe=kp_b, kv_b_proj=kvb_b, selected=sel,
                            o=o).items():
            t[f"T{T}.{nm}"] = val
        cases.append({"name": f"T{T}", "T": T, "Hm": Hm, "qk_nope": n, "qk_rope": r, "v_head": vd,
                      "kv_lora_rank": Lkv, "topk": topk, "scale": (n + r) ** -0.5})
    save(out / "ops" / "sparse_mla.safetensors", t)
    return {"sparse_mla.safetensors": cases}


# ------------------------------------------------------------------------------------------- MoE


def make_moe(out):
    tc = randinit.tiny_text_config()
    full = randinit.random_k31_weights(tc, seed=4000)
    pre = "model.layers.1.block_sparse_moe."
    w = {k[len(pre):]: v for k, v in full.items() if k.startswith(pre)}
    norm_w = full["model.layers.1.post_attention_layernorm.weight"]
    m = Model(randinit.parse_config(tc), {**{pre + k: v for k, v in w.items()}}, F64)
    # dequantise experts into the model's dict the same way the loader does
    for k in list(w):
        if k.endswith(".weight_packed"):
            base = k[: -len(".weight_packed")]
            m.w[pre + base + ".weight"] = ops.mxfp4_decode(w[k], w[base + ".weight_scale"], F64)
    T = 17
    g = gen(4100)
    x_b, x = bf16_exact(ops.rms_norm(torch.randn(T, 256, generator=g, dtype=F64), norm_w.to(F64), 1e-5))
    rec = {}
    y = m.moe(1, x, rec, "")
    t = {f"w.{k}": v for k, v in w.items()}
    t.update({"x": x_b, "router.idx": rec["router.idx"], "router.weights": rec["router.weights"],
              "router.scores": rec["router.scores"], "router.gap": rec["router.gap"], "latent": rec["moe.latent"],
              "y": y})
    # each routed expert's dense dequantised w1 for expert 0 (a direct MXFP4 check on real planes)
    t["expert0.w1.dequant"] = m.w[pre + "experts.0.w1.weight"]
    save(out / "ops" / "moe.safetensors", t)
    return {"moe.safetensors": [{"T": T, "hidden": 256, "experts": 16, "top_k": 4, "moe_intermediate": 64,
                                 "latent": 128, "shared": 2, "situ_beta": 4.0, "situ_linear_beta": 25.0,
                                 "renormalize": True, "routed_scaling_factor": 1.0, "rms_eps": 1e-5,
                                 "min_router_gap": float(rec["router.gap"].min())}]}


def make_attn_res(out):
    t, cases = {}, []
    d = 256
    for n in range(2, 10):
        g = gen(5000 + n)
        s_b, s = bf16_exact(torch.randn(5, n, d, generator=g, dtype=F64) * (torch.rand(1, n, 1, generator=g,
                                                                                      dtype=F64) * 3 + 0.1))
        nw_b, nw = bf16_exact(torch.empty(d, dtype=F64).uniform_(0.8, 1.2, generator=g))
        pw_b, pw = bf16_exact(torch.randn(1, d, generator=g, dtype=F64) / d ** 0.5)
        o, a = ops.attn_res(s, nw, pw, 1e-5)
        t.update({f"n{n}.sources": s_b, f"n{n}.norm_weight": nw_b, f"n{n}.proj_weight": pw_b, f"n{n}.out": o,
                  f"n{n}.alpha": a})
        cases.append({"name": f"n{n}", "tokens": 5, "sources": n, "d": d, "eps": 1e-5})
    save(out / "ops" / "attn_res.safetensors", t)
    return {"attn_res.safetensors": cases}


def make_mxfp4(out):
    packed = torch.arange(256, dtype=torch.int64).to(torch.uint8).reshape(16, 16)
    scale = torch.tensor([[127], [128], [126], [120], [134], [1], [254], [127]] * 2, dtype=torch.uint8)
    g = gen(6000)
    rp = torch.randint(0, 256, (64, 64), generator=g).to(torch.uint8)
    rs = torch.randint(110, 140, (64, 4), generator=g).to(torch.uint8)
    t = {"table.packed": packed, "table.scale": scale, "table.dequant": ops.mxfp4_decode(packed, scale, F64),
         "random.packed": rp, "random.scale": rs, "random.dequant": ops.mxfp4_decode(rp, rs, F64)}
    save(out / "ops" / "mxfp4.safetensors", t)
    return {"mxfp4.safetensors": [{"fp4_values": ops.FP4_VALUES, "layout": "even column = low nibble",
                                   "scale": "value * 2^(byte - 127)"}]}


# -------------------------------------------------------------------------------------- whole models


def with_bf16_caches(run):
    """run() with every cache append (MLA latent c, k_pe and index keys: `model._cat`'s only
    callers) rounded to bf16 first, as spec 5.5 stores them."""
    import k31ref.model as M
    orig = M._cat
    M._cat = lambda a, b: orig(a, b.to(BF16).to(b.dtype))
    try:
        return run()
    finally:
        M._cat = orig


def make_k31_tiny(out):
    tc = randinit.tiny_text_config(vocab_size=512, index_topk=TINY_TOPK)
    w = randinit.random_k31_weights(tc, TINY_SEED)
    mdir = out / "k31_tiny" / "model"
    randinit.save_k31_checkpoint(mdir, tc, w)
    m = Model.load(mdir, F64)
    ids = torch.randint(0, tc["vocab_size"], (TINY_SEQ,), generator=gen(TINY_SEED + 1))
    rec = {}
    full = m.forward(ids, None, rec)
    inc = m.logits_incremental(ids, TINY_PREFILL)
    dec = m.logits_incremental(ids, 1)
    steps = []
    toks, glog = m.greedy(ids, TINY_GREEDY, steps)
    # The same runs with the caches stored as the spec stores them (MLA latent c | k_pe and
    # index keys in bf16): an engine that follows the spec matches these to f32 rounding,
    # where the unrounded logits above sit ~1e-3 away.
    full_bf16, inc_bf16, dec_bf16 = with_bf16_caches(
        lambda: (m.forward(ids), m.logits_incremental(ids, TINY_PREFILL), m.logits_incremental(ids, 1)))
    t = {"input_ids": ids, "logits_full": full, "logits_incremental": inc, "logits_decode_only": dec,
         "greedy_tokens": torch.tensor(toks), "greedy_logits": glog, "output.hidden": rec["output.hidden"],
         "output.attn_res_alpha": rec["output.attn_res_alpha"],
         "logits_full_bf16_caches": full_bf16, "logits_incremental_bf16_caches": inc_bf16,
         "logits_decode_only_bf16_caches": dec_bf16}
    meta = {"config": "k31_tiny/model/config.json", "seq_len": TINY_SEQ, "prefill": TINY_PREFILL,
            "greedy_steps": TINY_GREEDY, "index_topk": TINY_TOPK, "clear_rel_gap": CLEAR_REL_GAP,
            "max_abs_full_minus_incremental": float((full - inc).abs().max()),
            "max_abs_full_minus_decode_only": float((full - dec).abs().max()),
            "rel_l2_bf16_caches_vs_unrounded": float((full_bf16 - full).norm() / full.norm()), "layers": {}}
    cfg = m.cfg
    for l in range(cfg.num_layers):
        p = f"layers.{l}."
        lm = {"kind": cfg.layer_kinds[l], "ffn": cfg.ffn_kinds[l]}
        for nm in ("mixer_out", "ffn_out", "attn_res.attn_alpha", "attn_res.mlp_alpha"):
            if p + nm in rec:
                t[p + nm] = rec[p + nm]
        if cfg.layer_kinds[l] == "kda":
            if l == 0:
                t[p + "kda.state"] = rec[p + "kda.state"]
                t[p + "kda.o"] = rec[p + "kda.o"]
            gg = rec[p + "kda.g"]
            lm["g_min"], lm["g_max"] = float(gg.min()), float(gg.max())
        else:
            sc, sel, gap = rec[p + "indexer.scores"], rec[p + "indexer.selected"], rec[p + "indexer.gap"]
            rel, clear = _row_stats(sc, sel, gap, TINY_TOPK)
            t[p + "indexer.scores"] = sc
            t[p + "indexer.selected"] = sel
            t[p + "indexer.gap"] = gap
            t[p + "indexer.clear"] = clear.to(I32)
            t[p + "mla.attn_out"] = rec[p + "mla.attn_out"]
            lm["indexer_rows_with_boundary"] = int(torch.isfinite(gap).sum())
            lm["indexer_unclear_rows"] = [i for i in range(TINY_SEQ) if not bool(clear[i])]
            lm["indexer_min_rel_gap"] = float(rel.min())
            # greedy decode steps: step i (i >= 1) processes position TINY_SEQ + i - 1
            g_rel = []
            for i, r in enumerate(steps):
                rr, _ = _row_stats(r[p + "indexer.scores"], r[p + "indexer.selected"], r[p + "indexer.gap"],
                                   TINY_TOPK)
                g_rel.append(float(rr[0]))
            lm["greedy_rel_gap_by_position"] = {str(TINY_SEQ + i): v for i, v in enumerate(g_rel)}
            lm["greedy_unclear_positions"] = [TINY_SEQ + i for i, v in enumerate(g_rel) if v < CLEAR_REL_GAP]
        if cfg.ffn_kinds[l] == "moe":
            t[p + "router.idx"] = rec[p + "router.idx"]
            t[p + "router.weights"] = rec[p + "router.weights"]
            t[p + "router.gap"] = rec[p + "router.gap"]
            lm["router_min_gap"] = float(rec[p + "router.gap"].min())
        meta["layers"][str(l)] = lm
    srt = torch.sort(glog, dim=-1, descending=True).values
    meta["greedy_min_top1_top2_gap"] = float((srt[:, 0] - srt[:, 1]).min())
    srt = torch.sort(full, dim=-1, descending=True).values
    meta["full_min_top1_top2_gap"] = float((srt[:, 0] - srt[:, 1]).min())
    meta["greedy_tokens"] = toks
    save(out / "k31_tiny" / "outputs.safetensors", t)
    write_json(out / "k31_tiny" / "outputs.json", meta)
    return meta


AWK_SEED = 5003  # scanned (5000-5079): indexer boundaries clear by >= 3.5e-4 of the row max, router by 8.7e-4
AWK_SEQ, AWK_PREFILL, AWK_GREEDY, AWK_TOPK = 100, 70, 8, 8


def awkward_text_config():
    """A second K3.1-layout model with other shapes than k31_tiny: KDA 3 heads x 64, MLA 3 heads with
    kv_lora 96 / v 24, indexer 4 x 32 picking 8, AttnRes blocks of 2, 12 experts top-3 in 3 groups
    (2 kept), routed scaling 2.5, one shared expert; 100 tokens, so prefill crosses a 64-token chunk."""
    c = randinit.tiny_text_config(vocab_size=512, index_topk=AWK_TOPK)
    c.update({"hidden_size": 192, "num_hidden_layers": 6, "intermediate_size": 384,
              "num_experts": 12, "num_experts_per_token": 3, "num_shared_experts": 1,
              "moe_intermediate_size": 96, "routed_expert_hidden_size": 64,
              "num_expert_group": 3, "topk_group": 2, "routed_scaling_factor": 2.5,
              "num_attention_heads": 3, "num_key_value_heads": 3, "q_lora_rank": 64, "kv_lora_rank": 96,
              "qk_nope_head_dim": 16, "qk_rope_head_dim": 16, "v_head_dim": 24,
              "index_n_heads": 4, "index_head_dim": 32, "attn_res_block_size": 2})
    c["linear_attn_config"] = dict(c["linear_attn_config"], num_heads=3, head_dim=64,
                                   full_attn_layers=[3, 6], kda_layers=[1, 2, 4, 5])
    return c


PLAIN_SEED = 7020  # scanned (7000-7039): indexer boundaries clear by >= 3.8e-4 of the row max, router by 7.9e-4
PLAIN_SEQ, PLAIN_PREFILL, PLAIN_GREEDY, PLAIN_TOPK = 80, 64, 8, 12


def plain_text_config():
    """The K3.1 layout with options k31_tiny leaves on turned off or swapped: AttnRes blocks of one layer,
    KDA with the low-rank output gate (4 heads x 32), MLA without the output gate, no shared experts, two
    dense layers, top-2 of 8 experts; 80 tokens, prefill of exactly one chunk. (A K3.1-layout config must name
    `gate_lower_bound` and `attn_res_block_size`: the engine refuses one without, tests/config.rs.)"""
    c = randinit.tiny_text_config(vocab_size=512, index_topk=PLAIN_TOPK)
    c.update({"hidden_size": 128, "num_hidden_layers": 5, "intermediate_size": 256, "first_k_dense_replace": 2,
              "num_experts": 8, "num_experts_per_token": 2, "num_shared_experts": 0,
              "moe_intermediate_size": 64, "routed_expert_hidden_size": 96,
              "num_attention_heads": 2, "num_key_value_heads": 2, "q_lora_rank": 48, "kv_lora_rank": 64,
              "mla_use_output_gate": False, "attn_res_block_size": 1})
    c["linear_attn_config"] = dict(c["linear_attn_config"], num_heads=4, head_dim=32, use_full_rank_gate=False,
                                   full_attn_layers=[2, 5], kda_layers=[1, 3, 4])
    return c


LONG_SEED = 9009  # scanned (9000-9011) at 260 tokens: indexer gaps >= 1.4e-4 of the row max, router >= 6.3e-5


def make_k31_awkward(out):
    make_k31_variant(out, "k31_awkward", awkward_text_config(), AWK_SEED, AWK_SEQ, AWK_PREFILL, AWK_GREEDY)


def make_k31_long(out):
    """k31_awkward's shapes over 260 tokens: a prefill of 200 (three full KDA chunks and a ragged one), the
    indexer picking 8 of up to 260 positions, then 60 decode steps."""
    make_k31_variant(out, "k31_long", awkward_text_config(), LONG_SEED, 260, 200, 8)


def make_k31_plain(out):
    make_k31_variant(out, "k31_plain", plain_text_config(), PLAIN_SEED, PLAIN_SEQ, PLAIN_PREFILL, PLAIN_GREEDY)


def make_k31_variant(out, name, tc, seed, seq, prefill, greedy):
    """Logits only, every run with the caches stored in bf16 as the engine stores them (the unrounded
    full / incremental logits too, for the record)."""
    mdir = out / name / "model"
    randinit.save_k31_checkpoint(mdir, tc, randinit.random_k31_weights(tc, seed))
    m = Model.load(mdir, F64)
    ids = torch.randint(0, tc["vocab_size"], (seq,), generator=gen(seed + 1))
    full = m.forward(ids)
    inc = m.logits_incremental(ids, prefill)
    rec = {}
    full_b, inc_b, dec_b, (toks, glog) = with_bf16_caches(lambda: (
        m.forward(ids, None, rec), m.logits_incremental(ids, prefill), m.logits_incremental(ids, 1),
        m.greedy(ids, greedy)))
    t = {"input_ids": ids, "logits_full": full, "logits_incremental": inc, "logits_full_bf16_caches": full_b,
         "logits_incremental_bf16_caches": inc_b, "logits_decode_only_bf16_caches": dec_b,
         "greedy_tokens": torch.tensor(toks), "greedy_logits": glog}
    gaps = {}
    for l in range(m.cfg.num_layers):
        p = f"layers.{l}."
        if p + "router.gap" in rec:
            gaps[p + "router_min_gap"] = float(rec[p + "router.gap"].min())
    # How far rounding alone moves this model's logits: the same reference in f32 (an f32 engine's
    # tolerance follows from it; k31_plain amplifies rounding ~40x more than k31_tiny).
    m32 = Model.load(mdir, F32)
    full_b32 = with_bf16_caches(lambda: m32.forward(ids)).to(F64)
    srt = torch.sort(glog, dim=-1, descending=True).values
    meta = {"config": f"{name}/model/config.json", "seed": seed, "seq_len": seq, "prefill": prefill,
            "rel_l2_f32_reference_vs_f64_bf16_caches": float(f"{float((full_b32 - full_b).norm() / full_b.norm()):.1e}"),
            "greedy_steps": greedy, "greedy_tokens": toks, "index_topk": tc["index_topk"],
            "greedy_min_top1_top2_gap": float((srt[:, 0] - srt[:, 1]).min()),
            "rel_l2_bf16_caches_vs_unrounded": float((full_b - full).norm() / full.norm()), **gaps}
    save(out / name / "outputs.safetensors", t)
    write_json(out / name / "outputs.json", meta)
    return meta


def make_kimi_linear(out):
    make_kimi_linear_variant(out, "kimi_linear_tiny", "tiny")


def make_kimi_linear_awkward(out):
    make_kimi_linear_variant(out, "kimi_linear_awkward", "awkward")


def make_kimi_linear_variant(out, name, variant):
    """transformers' Kimi Linear (hf_kimi_linear.py --variant; the awkward one: KDA 3 heads x 64, MLA 3 heads
    with kv_lora 32 and v 16, group-limited routing, two full-attention layers, 70 tokens), and k31ref on the
    same checkpoint: its agreement with transformers, and its logits with the MLA cache stored in bf16 as the
    engine stores it (transformers' fp32-cache logits sit 6e-4 / 1.1e-3 from those)."""
    d = out / name
    if d.exists():
        shutil.rmtree(d)
    env = dict(os.environ, PYTHONHASHSEED="0")
    subprocess.run([sys.executable, str(HERE / "hf_kimi_linear.py"), str(d), "--variant", variant], check=True,
                   env=env, capture_output=True)
    from safetensors import safe_open
    from safetensors.torch import load_file
    ref = load_file(str(d / "hf_outputs.safetensors"))
    with safe_open(str(d / "hf_outputs.safetensors"), "pt") as f:
        prefill = json.loads(f.metadata()["info"])["prefill"]
    m = Model.load(d / "model", F64)
    ids = ref["input_ids"]
    full = m.logits_full(ids)
    rel = float((full - ref["logits_full"].to(F64)).abs().max() / ref["logits_full"].abs().max())
    full_b, inc_b, dec_b = with_bf16_caches(
        lambda: (m.logits_full(ids), m.logits_incremental(ids, prefill), m.logits_incremental(ids, 1)))
    save(d / "k31ref_bf16_caches.safetensors", {"logits_full_bf16_caches": full_b,
                                                "logits_incremental_bf16_caches": inc_b,
                                                "logits_decode_only_bf16_caches": dec_b})
    meta = {"prefill": prefill, "seq_len": int(ids.numel()), "greedy_tokens": ref["greedy_tokens"].tolist(),
            "k31ref_f64_vs_transformers_full_logits_rel": float(f"{rel:.2e}"),
            "k31ref_bf16_caches_vs_transformers_full_logits_rel_l2": float(f"{float((full_b - ref['logits_full'].to(F64)).norm() / ref['logits_full'].norm()):.2e}")}
    write_json(d / "outputs.json", meta)
    return meta


def sha256(p):
    return hashlib.sha256(p.read_bytes()).hexdigest()


def generate(out: Path):
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    out.mkdir(parents=True, exist_ok=True)
    index = {}
    for fn in (make_kda, make_indexer, make_sparse_mla, make_moe, make_attn_res, make_mxfp4):
        index.update(fn(out))
    write_json(out / "ops" / "index.json", index)
    make_k31_tiny(out)
    make_k31_awkward(out)
    make_k31_plain(out)
    make_k31_long(out)
    make_kimi_linear(out)
    make_kimi_linear_awkward(out)
    files = sorted(p for p in out.rglob("*") if p.is_file() and p.name != "MANIFEST.json" and p.suffix != ".md")
    write_json(out / "MANIFEST.json", {str(p.relative_to(out)): {"sha256": sha256(p), "bytes": p.stat().st_size}
                                       for p in files})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=REPO / "tests" / "golden")
    ap.add_argument("--check", action="store_true", help="regenerate into a temp dir and compare with --out")
    a = ap.parse_args()
    if not a.check:
        generate(a.out)
        print(f"wrote {a.out}")
        return
    with tempfile.TemporaryDirectory() as d:
        generate(Path(d))
        new = json.loads((Path(d) / "MANIFEST.json").read_text())
        old = json.loads((a.out / "MANIFEST.json").read_text())
        bad = sorted(k for k in set(new) | set(old) if new.get(k) != old.get(k))
        for k in new:
            if not filecmp.cmp(Path(d) / k, a.out / k, shallow=False):
                bad.append(k)
        if bad:
            print("MISMATCH:", sorted(set(bad)))
            sys.exit(1)
        print(f"identical: {len(new)} files")


if __name__ == "__main__":
    main()
