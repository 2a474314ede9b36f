"""Plain-PyTorch K3.1 / K3 / Kimi Linear text model (architecture.md sections 1-8).

One code path serves a full forward, a prefill and single-token decode steps: `forward(ids, cache)`
appends `len(ids)` tokens to the cache and returns their logits. Everything is computed in the
model dtype (float64 by default; float32 optional) from the stored weights, with no bf16 rounding of
activations. `record` (a dict) collects named per-layer intermediates.
"""
from __future__ import annotations

import math
from pathlib import Path

import torch

from . import ops
from .checkpoint import load_weights
from .config import TextConfig, load_config


class Cache:
    """Per-sequence state: KDA conv windows and recurrent states, MLA latent and index-key caches."""

    def __init__(self, cfg: TextConfig):
        self.pos = 0
        self.conv = [None] * cfg.num_layers  # KDA: (q, k, v) states [W-1, P]
        self.S = [None] * cfg.num_layers  # KDA: [H, K, V]
        self.c = [None] * cfg.num_layers  # MLA: [S, Lkv] normalised latent
        self.kpe = [None] * cfg.num_layers  # MLA: [S, r]
        self.kI = [None] * cfg.num_layers  # indexer keys [S, ID]


def _cat(a, b):
    return b if a is None else torch.cat([a, b], 0)


class Model:
    def __init__(self, cfg: TextConfig, weights: dict, dtype=torch.float64):
        self.cfg = cfg
        self.dtype = dtype
        self.w = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in weights.items()}

    @classmethod
    def load(cls, model_dir, dtype=torch.float64):
        cfg = load_config(model_dir)
        return cls(cfg, load_weights(Path(model_dir), cfg), dtype)

    # ---------------------------------------------------------------- helpers
    def W(self, name):
        return self.w[name]

    def has(self, name):
        return name in self.w

    @staticmethod
    def lin(x, w):
        return x @ w.t()

    # ---------------------------------------------------------------- mixers
    def kda(self, l, x, cache: Cache, rec, pre):
        cfg = self.cfg
        p = f"model.layers.{l}.self_attn."
        H, K = cfg.kda_heads, cfg.kda_head_dim
        T = x.shape[0]
        qs, ks, vs = cache.conv[l] if cache.conv[l] is not None else (None, None, None)
        cw = lambda n: self.W(p + n).reshape(self.W(p + n).shape[0], -1)  # [C,1,W] -> [C,W]
        q, qs = ops.short_conv(self.lin(x, self.W(p + "q_proj.weight")), cw("q_conv1d.weight"), qs)
        k, ks = ops.short_conv(self.lin(x, self.W(p + "k_proj.weight")), cw("k_conv1d.weight"), ks)
        v, vs = ops.short_conv(self.lin(x, self.W(p + "v_proj.weight")), cw("v_conv1d.weight"), vs)
        cache.conv[l] = (qs, ks, vs)
        q = ops.l2n(q.view(T, H, K))
        k = ops.l2n(k.view(T, H, K))
        v = v.view(T, H, K)
        f = self.lin(self.lin(x, self.W(p + "f_a_proj.weight")), self.W(p + "f_b_proj.weight")).view(T, H, K)
        A_log = self.W(p + "A_log").reshape(-1)[:H]
        dt_bias = self.W(p + "dt_bias").reshape(-1)
        if cfg.gate_lower_bound is not None:
            g = ops.kda_gate_bounded(f, A_log, dt_bias, cfg.gate_lower_bound)
        else:
            g = ops.kda_gate_softplus(f, A_log, dt_bias)
        beta = torch.sigmoid(self.lin(x, self.W(p + "b_proj.weight")))
        o, S = ops.kda_recurrent(q, k, v, g, beta, K ** -0.5, cache.S[l])
        cache.S[l] = S
        if self.has(p + "g_proj.weight"):
            G = self.lin(x, self.W(p + "g_proj.weight"))
        else:
            G = self.lin(self.lin(x, self.W(p + "g_a_proj.weight")), self.W(p + "g_b_proj.weight"))
        y = ops.gated_rms_norm(o, self.W(p + "o_norm.weight"), G.view(T, H, K), cfg.kda_eps)
        out = self.lin(y.reshape(T, H * K), self.W(p + "o_proj.weight"))
        if rec is not None:
            rec[pre + "kda.q"] = q
            rec[pre + "kda.k"] = k
            rec[pre + "kda.v"] = v
            rec[pre + "kda.g"] = g
            rec[pre + "kda.beta"] = beta
            rec[pre + "kda.o"] = o
            rec[pre + "kda.state"] = S
            rec[pre + "kda.conv_state"] = torch.stack([qs, ks, vs], 0)
        return out

    def mla(self, l, x, cache: Cache, rec, pre):
        cfg = self.cfg
        p = f"model.layers.{l}.self_attn."
        T = x.shape[0]
        Hm, n, r, vd, Lkv = cfg.mla_heads, cfg.qk_nope, cfg.qk_rope, cfg.v_head, cfg.kv_lora_rank
        pos0 = cache.pos
        q_pos = torch.arange(pos0, pos0 + T)
        if cfg.q_lora_rank is not None:
            cq = ops.rms_norm(self.lin(x, self.W(p + "q_a_proj.weight")), self.W(p + "q_a_layernorm.weight"), cfg.q_a_eps)
            q = self.lin(cq, self.W(p + "q_b_proj.weight"))
        else:
            cq = None
            q = self.lin(x, self.W(p + "q_proj.weight"))
        q = q.view(T, Hm, n + r)
        q_nope, q_pe = q[..., :n], q[..., n:]
        kv = self.lin(x, self.W(p + "kv_a_proj_with_mqa.weight"))
        c_new = ops.rms_norm(kv[:, :Lkv], self.W(p + "kv_a_layernorm.weight"), cfg.kv_a_eps)
        kpe_new = kv[:, Lkv:]
        cache.c[l] = _cat(cache.c[l], c_new)
        cache.kpe[l] = _cat(cache.kpe[l], kpe_new)
        c, kpe = cache.c[l], cache.kpe[l]
        Skv = c.shape[0]
        Wkv = self.W(p + "kv_b_proj.weight").view(Hm, n + vd, Lkv)
        W_UK, W_UV = Wkv[:, :n], Wkv[:, n:]
        causal = torch.arange(Skv)[None, :] <= q_pos[:, None]
        allowed = causal
        if cfg.index_topk is not None:
            IH, ID = cfg.index_heads, cfg.index_head_dim
            ip = p + "indexer."
            kI_new = ops.layer_norm(self.lin(x, self.W(ip + "wk.weight")), self.W(ip + "k_norm.weight"),
                                    self.w.get(ip + "k_norm.bias"), cfg.index_ln_eps)
            cache.kI[l] = _cat(cache.kI[l], kI_new)
            qI = self.lin(cq, self.W(ip + "wq_b.weight")).view(T, IH, ID)
            wI = self.lin(x, self.W(ip + "weights_proj.weight")) * (IH ** -0.5) * (ID ** -0.5)
            scores = ops.indexer_scores(qI, cache.kI[l], wI, q_pos)
            sel = ops.topk_select(scores, cfg.index_topk)
            allowed = ops.selection_mask(sel, Skv) & causal
            if rec is not None:
                rec[pre + "indexer.q"] = qI
                rec[pre + "indexer.k"] = kI_new
                rec[pre + "indexer.w"] = wI
                rec[pre + "indexer.scores"] = scores
                rec[pre + "indexer.selected"] = sel
                rec[pre + "indexer.gap"] = ops.topk_boundary_gap(scores, cfg.index_topk)
        scale = (n + r) ** -0.5
        o, probs = ops.mla_attention(q_nope, q_pe, c, kpe, W_UK, W_UV, allowed, scale)
        o = o.reshape(T, Hm * vd)
        if self.has(p + "g_proj.weight"):
            o = o * torch.sigmoid(self.lin(x, self.W(p + "g_proj.weight")))
        out = self.lin(o, self.W(p + "o_proj.weight"))
        if rec is not None:
            rec[pre + "mla.c"] = c_new
            rec[pre + "mla.k_pe"] = kpe_new
            rec[pre + "mla.attn_out"] = o  # gated, before o_proj
        return out

    # ---------------------------------------------------------------- FFNs
    def mlp(self, x, gate_w, up_w, down_w):
        cfg = self.cfg
        return self.lin(ops.glu(self.lin(x, gate_w), self.lin(x, up_w), cfg.hidden_act, cfg.situ_beta,
                                cfg.situ_linear_beta), down_w)

    def dense(self, l, x):
        for base in (f"model.layers.{l}.mlp.", f"model.layers.{l}.block_sparse_moe."):
            if self.has(base + "gate_proj.weight"):
                return self.mlp(x, self.W(base + "gate_proj.weight"), self.W(base + "up_proj.weight"),
                                self.W(base + "down_proj.weight"))
        raise KeyError(f"dense MLP weights of layer {l} not found")

    def moe(self, l, x, rec, pre):
        cfg = self.cfg
        p = f"model.layers.{l}.block_sparse_moe."
        idx, wts, scores, choice = ops.route(
            x, self.W(p + "gate.weight"), self.w.get(p + "gate.e_score_correction_bias"), cfg.experts_per_token,
            cfg.router_act, cfg.num_expert_group, cfg.topk_group, cfg.renormalize, cfg.routed_scaling_factor)
        z = x
        if cfg.latent_size is not None:
            z = self.lin(x, self.W(p + "routed_expert_down_proj.weight"))
        T = x.shape[0]
        y = z.new_zeros(T, z.shape[1])
        for e in torch.unique(idx).tolist():
            rows, slot = torch.nonzero(idx == e, as_tuple=True)
            ep = p + f"experts.{e}."
            ye = self.mlp(z[rows], self.W(ep + "w1.weight"), self.W(ep + "w3.weight"), self.W(ep + "w2.weight"))
            y.index_add_(0, rows, ye * wts[rows, slot].unsqueeze(-1))
        ylat = y
        if cfg.latent_size is not None:
            if cfg.latent_norm:
                y = ops.rms_norm(y, self.W(p + "routed_expert_norm.weight"), cfg.rms_eps)
            y = self.lin(y, self.W(p + "routed_expert_up_proj.weight"))
        if cfg.num_shared_experts and self.has(p + "shared_experts.gate_proj.weight") and \
                self.W(p + "shared_experts.gate_proj.weight").numel() > 0:
            y = y + self.mlp(x, self.W(p + "shared_experts.gate_proj.weight"), self.W(p + "shared_experts.up_proj.weight"),
                             self.W(p + "shared_experts.down_proj.weight"))
        if rec is not None:
            rec[pre + "router.idx"] = idx
            rec[pre + "router.weights"] = wts
            rec[pre + "router.scores"] = scores
            b = torch.sort(choice, dim=-1, descending=True).values
            k = cfg.experts_per_token
            rec[pre + "router.gap"] = b[:, k - 1] - b[:, k] if b.shape[1] > k else torch.full((T,), float("inf"))
            rec[pre + "moe.latent"] = ylat
        return y

    # ---------------------------------------------------------------- model
    def new_cache(self) -> Cache:
        return Cache(self.cfg)

    def forward(self, ids, cache: Cache | None = None, record: dict | None = None, logits_rows=None):
        """Append `ids` (1-D) to `cache` (a fresh one if None); return f-dtype logits [T, vocab]."""
        cfg = self.cfg
        if cache is None:
            cache = self.new_cache()
        ids = torch.as_tensor(ids, dtype=torch.int64).reshape(-1)
        e = self.W("model.embed_tokens.weight")[ids]
        eps = cfg.rms_eps
        S = cfg.attn_res_block_size
        rec = record
        bank = []  # list of [T, d]
        carry = e
        for l in range(cfg.num_layers):
            pre = f"layers.{l}."
            lp = f"model.layers.{l}."
            if S is not None:
                x_in = carry
                if bank:
                    h, alpha = ops.attn_res(torch.stack(bank + [x_in], 1), self.W(lp + "self_attention_res_norm.weight"),
                                            self.W(lp + "self_attention_res_proj.weight"), eps)
                    if rec is not None:
                        rec[pre + "attn_res.attn_alpha"] = alpha
                else:
                    h = x_in
                if l % S == 0:
                    bank.append(x_in)
                    part = None
                else:
                    part = x_in
            else:
                h = carry
            xn = ops.rms_norm(h, self.W(lp + "input_layernorm.weight"), eps)
            if cfg.layer_kinds[l] == "kda":
                a = self.kda(l, xn, cache, rec, pre)
            else:
                a = self.mla(l, xn, cache, rec, pre)
            if rec is not None:
                rec[pre + "mixer_out"] = a
            if S is not None:
                part = a if part is None else part + a
                h2, alpha = ops.attn_res(torch.stack(bank + [part], 1), self.W(lp + "mlp_res_norm.weight"),
                                         self.W(lp + "mlp_res_proj.weight"), eps)
                if rec is not None:
                    rec[pre + "attn_res.mlp_alpha"] = alpha
            else:
                part = carry + a
                h2 = part
            xn2 = ops.rms_norm(h2, self.W(lp + "post_attention_layernorm.weight"), eps)
            m = self.dense(l, xn2) if cfg.ffn_kinds[l] == "dense" else self.moe(l, xn2, rec, pre)
            if rec is not None:
                rec[pre + "ffn_out"] = m
            carry = part + m
            if rec is not None:
                rec[pre + "carry"] = carry
        if S is not None:
            h, alpha = ops.attn_res(torch.stack(bank + [carry], 1), self.W("model.output_attn_res_norm.weight"),
                                    self.W("model.output_attn_res_proj.weight"), eps)
            if rec is not None:
                rec["output.attn_res_alpha"] = alpha
        else:
            h = carry
        y = ops.rms_norm(h, self.W("model.norm.weight"), eps)
        if rec is not None:
            rec["output.hidden"] = y
        if logits_rows is not None:
            y = y[logits_rows]
        head = self.W("model.embed_tokens.weight") if (cfg.tie_word_embeddings and not self.has("lm_head.weight")) \
            else self.W("lm_head.weight")
        logits = self.lin(y, head)
        cache.pos += ids.numel()
        return logits

    # ---------------------------------------------------------------- drivers
    def logits_full(self, ids, record=None):
        return self.forward(ids, None, record)

    def logits_incremental(self, ids, prefill: int):
        """Prefill `prefill` tokens, then decode the rest one token at a time; returns all rows."""
        cache = self.new_cache()
        ids = torch.as_tensor(ids, dtype=torch.int64).reshape(-1)
        outs = []
        if prefill > 0:
            outs.append(self.forward(ids[:prefill], cache))
        for t in range(prefill, ids.numel()):
            outs.append(self.forward(ids[t : t + 1], cache))
        return torch.cat(outs, 0)

    def greedy(self, prompt, n_new: int, records: list | None = None):
        """Greedy continuation (argmax, ties -> lowest id) via prefill + decode; returns (tokens, logits rows).
        With `records` (a list), the intermediates of each decode step are appended to it."""
        cache = self.new_cache()
        logits = self.forward(torch.as_tensor(prompt), cache)[-1:]
        toks, rows = [], []
        for i in range(n_new):
            rows.append(logits[0])
            t = int(torch.argmax(logits[0]))
            toks.append(t)
            if i + 1 < n_new:
                rec = {} if records is not None else None
                logits = self.forward(torch.tensor([t]), cache, rec)
                if records is not None:
                    records.append(rec)
        return toks, torch.stack(rows, 0)
