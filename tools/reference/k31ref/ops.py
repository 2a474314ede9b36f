"""Primitive operators of the K3.1 text model (architecture.md sections 2-7).

Every function is plain PyTorch and runs in the dtype of its inputs (use float32 or
float64). Nothing is rounded to bf16 here: the reference is "exact math on the stored
weights"; the engine compares against it with a tolerance.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F


# ----------------------------------------------------------------------------- norms


def rms_norm(x: torch.Tensor, w: torch.Tensor | None, eps: float) -> torch.Tensor:
    """RMSNorm over the last axis (section 2.1): x * rsqrt(mean(x^2) + eps) * w."""
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y if w is None else y * w


def layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, eps: float = 1e-6) -> torch.Tensor:
    """LayerNorm with biased variance (section 2.2, indexer key)."""
    mu = x.mean(-1, keepdim=True)
    var = (x - mu).pow(2).mean(-1, keepdim=True)
    y = (x - mu) / torch.sqrt(var + eps) * w
    return y if b is None else y + b


def l2n(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """fla's l2 normalisation: x / sqrt(sum(x^2) + eps) (section 2.3)."""
    return x / torch.sqrt(x.pow(2).sum(-1, keepdim=True) + eps)


# ----------------------------------------------------------------------- activations


def situ(gate: torch.Tensor, up: torch.Tensor, beta: float, linear_beta: float | None) -> torch.Tensor:
    """SiTU-GLU (section 2.4): beta*tanh(gate/beta)*sigmoid(gate) * [beta_lin*tanh(up/beta_lin)]."""
    act = beta * torch.tanh(gate / beta) * torch.sigmoid(gate)
    if linear_beta is not None:
        up = linear_beta * torch.tanh(up / linear_beta)
    return act * up


def silu_glu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


def glu(gate, up, act: str, beta: float | None = None, linear_beta: float | None = None):
    if act == "situ":
        return situ(gate, up, beta, linear_beta)
    if act == "silu":
        return silu_glu(gate, up)
    raise ValueError(f"unsupported hidden_act {act!r}")


def softplus(z: torch.Tensor) -> torch.Tensor:
    """log(1 + e^z), returning z for z > 20 (the kernels' threshold)."""
    return F.softplus(z, beta=1.0, threshold=20.0)


# ---------------------------------------------------------------------------- KDA


def kda_gate_bounded(f: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, lower_bound: float) -> torch.Tensor:
    """K3 bounded forget gate: g = L * sigmoid(exp(A_log[h]) * (f + dt_bias)).

    f: [..., H, K] raw f_b(f_a(x)); A_log: [H]; dt_bias: [H*K]. Returns log-decay g <= 0.
    """
    H, K = f.shape[-2:]
    z = f + dt_bias.reshape(H, K)
    return lower_bound * torch.sigmoid(torch.exp(A_log.reshape(H, 1)) * z)


def kda_gate_softplus(f: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor) -> torch.Tensor:
    """Kimi Linear forget gate: g = -exp(A_log[h]) * softplus(f + dt_bias)."""
    H, K = f.shape[-2:]
    z = f + dt_bias.reshape(H, K)
    return -torch.exp(A_log.reshape(H, 1)) * softplus(z)


def short_conv(x: torch.Tensor, w: torch.Tensor, state: torch.Tensor | None):
    """Depthwise causal conv + SiLU (section 4.2).

    x: [T, C] pre-conv inputs; w: [C, W] (checkpoint [C,1,W] squeezed; index W-1 multiplies
    the current token); state: [W-1, C] previous pre-conv inputs (oldest first) or None (zeros).
    Returns (silu(conv(x)) [T, C], new_state [W-1, C]).
    """
    T, C = x.shape
    W = w.shape[-1]
    if state is None:
        state = x.new_zeros(W - 1, C)
    xx = torch.cat([state, x], 0)  # [W-1+T, C]
    y = x.new_zeros(T, C)
    for j in range(W):
        y = y + w[:, j] * xx[j : j + T]
    return F.silu(y), xx[T:].clone() if W > 1 else x.new_zeros(0, C)


def kda_recurrent(q, k, v, g, beta, scale: float | None = None, S0: torch.Tensor | None = None):
    """Delta-rule recurrence with per-key-channel decay (section 4.2).

    q, k: [T, H, K] (already l2-normalised; scale applied here), v: [T, H, V],
    g: [T, H, K] log-decay, beta: [T, H] (post-sigmoid), S0: [H, K, V] or None.
    Per step: S <- diag(exp g_t) S; S <- S + beta_t k_t (v_t - S^T k_t)^T; o_t = S^T (scale q_t).
    Returns o [T, H, V], S [H, K, V].
    """
    T, H, K = q.shape
    V = v.shape[-1]
    if scale is None:
        scale = K ** -0.5
    S = q.new_zeros(H, K, V) if S0 is None else S0.clone()
    o = q.new_zeros(T, H, V)
    for t in range(T):
        S = S * torch.exp(g[t]).unsqueeze(-1)
        kt = k[t]
        u = v[t] - torch.einsum("hkv,hk->hv", S, kt)
        S = S + beta[t][:, None, None] * kt.unsqueeze(-1) * u.unsqueeze(-2)
        o[t] = torch.einsum("hkv,hk->hv", S, q[t] * scale)
    return o, S


def gated_rms_norm(o: torch.Tensor, w: torch.Tensor, gate: torch.Tensor, eps: float) -> torch.Tensor:
    """KDA output norm: RMSNorm(o; w) * sigmoid(gate), per head (norm before gate)."""
    return rms_norm(o, w, eps) * torch.sigmoid(gate)


# ---------------------------------------------------------------------- DSA indexer


def indexer_scores(qI: torch.Tensor, kI: torch.Tensor, w: torch.Tensor, q_pos: torch.Tensor) -> torch.Tensor:
    """Lightning-indexer scores (section 5.3).

    qI: [T, IH, ID]; kI: [S, ID]; w: [T, IH] (already multiplied by IH^-1/2 * ID^-1/2);
    q_pos: [T] absolute positions of the queries (keys are positions 0..S-1).
    I[t, s] = sum_j w[t, j] * relu(qI[t, j] . kI[s]); positions s > q_pos[t] are -inf.
    """
    dots = torch.einsum("tjd,sd->tjs", qI, kI)
    sc = torch.einsum("tj,tjs->ts", w, torch.relu(dots))
    S = kI.shape[0]
    mask = torch.arange(S)[None, :] > q_pos[:, None]
    return sc.masked_fill(mask, float("-inf"))


def topk_select(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Top-k of each row among finite entries: score descending, then position ascending.

    scores: [T, S] with -inf at invalid positions. Returns int64 [T, k] padded with -1 when a
    row has fewer than k valid positions (then all valid positions are selected).
    """
    T, S = scores.shape
    out = torch.full((T, k), -1, dtype=torch.int64)
    sc = scores.detach().to(torch.float64).cpu().numpy()
    pos = np.arange(S)
    for t in range(T):
        valid = np.isfinite(sc[t])
        p = pos[valid]
        s = sc[t][valid]
        order = np.lexsort((p, -s))  # primary: -score ascending, secondary: position ascending
        sel = p[order[:k]]
        out[t, : len(sel)] = torch.from_numpy(sel)
    return out


def topk_boundary_gap(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Per row: (k-th largest valid score) - ((k+1)-th largest); +inf when <= k valid positions."""
    T = scores.shape[0]
    gaps = torch.full((T,), float("inf"), dtype=torch.float64)
    for t in range(T):
        s = scores[t][torch.isfinite(scores[t])].to(torch.float64)
        if s.numel() > k:
            v = torch.sort(s, descending=True).values
            gaps[t] = v[k - 1] - v[k]
    return gaps


def selection_mask(sel: torch.Tensor, S: int) -> torch.Tensor:
    """[T, k] indices (-1 = none) -> bool [T, S] mask."""
    T = sel.shape[0]
    m = torch.zeros(T, S + 1, dtype=torch.bool)
    idx = torch.where(sel >= 0, sel, torch.full_like(sel, S))
    m.scatter_(1, idx, True)
    return m[:, :S]


# ---------------------------------------------------------------------------- MLA


def mla_attention(q_nope, q_pe, c, k_pe, W_UK, W_UV, allowed, scale):
    """Materialised gated-NoPE MLA attention core (section 5.4), without gate and o_proj.

    q_nope: [T, Hm, n]; q_pe: [T, Hm, r]; c: [S, Lkv] (normalised latent); k_pe: [S, r];
    W_UK: [Hm, n, Lkv]; W_UV: [Hm, v, Lkv]; allowed: bool [T, S]. Returns (o [T, Hm, v], p [T, Hm, S]).
    """
    k_nope = torch.einsum("hnl,sl->shn", W_UK, c)
    vv = torch.einsum("hvl,sl->shv", W_UV, c)
    logits = (torch.einsum("thn,shn->ths", q_nope, k_nope) + torch.einsum("thr,sr->ths", q_pe, k_pe)) * scale
    logits = logits.masked_fill(~allowed[:, None, :], float("-inf"))
    p = torch.softmax(logits, dim=-1)
    o = torch.einsum("ths,shv->thv", p, vv)
    return o, p


def mla_attention_absorbed(q_nope, q_pe, c, k_pe, W_UK, W_UV, allowed, scale):
    """Absorbed form (section 5.4): q~ = W_UK^T q_nope, attention over the 576-wide cache rows."""
    qt = torch.einsum("hnl,thn->thl", W_UK, q_nope)
    logits = (torch.einsum("thl,sl->ths", qt, c) + torch.einsum("thr,sr->ths", q_pe, k_pe)) * scale
    logits = logits.masked_fill(~allowed[:, None, :], float("-inf"))
    p = torch.softmax(logits, dim=-1)
    ol = torch.einsum("ths,sl->thl", p, c)
    return torch.einsum("hvl,thl->thv", W_UV, ol)


# ------------------------------------------------------------------------- router


def route(x, W, bias, top_k: int, act: str = "sigmoid", n_group: int = 1, topk_group: int = 1,
          renormalize: bool = True, scaling: float = 1.0):
    """DeepSeek-V3 style router (section 6.2). Returns (idx [T,k] int64 ascending by rank, weights [T,k],
    scores [T,E] unbiased, choice [T,E] biased).

    Ties in the biased scores are broken toward the lower expert index; the returned order is
    rank order (largest biased score first)."""
    logits = x @ W.t()
    if act == "sigmoid":
        scores = torch.sigmoid(logits)
    elif act == "softmax":
        scores = torch.softmax(logits, -1)
    else:
        raise ValueError(act)
    choice = scores + (bias if bias is not None else 0.0)
    T, E = choice.shape
    if n_group > 1 and n_group > topk_group:
        gs = choice.view(T, n_group, -1).topk(2, dim=-1).values.sum(-1)
        gidx = torch.topk(gs, topk_group, dim=-1).indices
        gmask = torch.zeros_like(gs, dtype=torch.bool).scatter_(1, gidx, True)
        emask = gmask.unsqueeze(-1).expand(T, n_group, E // n_group).reshape(T, E)
        masked = choice.masked_fill(~emask, float("-inf"))
    else:
        masked = choice
    idx = topk_select(masked, top_k)
    w = scores.gather(1, idx)
    if top_k > 1 and renormalize:
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
    w = w * scaling
    return idx, w, scores, choice


# --------------------------------------------------------------------------- MXFP4

FP4_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def mxfp4_decode(packed: torch.Tensor, scale: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """compressed-tensors mxfp4-pack-quantized -> dense (section 7.1).

    packed: uint8 [out, in/2] (even column = low nibble); scale: uint8 [out, in/32] (E8M0, bias 127).
    """
    out, half = packed.shape
    p = packed.to(torch.int64)
    nib = torch.stack([p & 0xF, (p >> 4) & 0xF], dim=-1).reshape(out, half * 2)
    lut = torch.tensor(FP4_VALUES, dtype=torch.float64)
    vals = lut[nib]
    e = scale.to(torch.float64) - 127.0
    mult = torch.pow(2.0, e).repeat_interleave(32, dim=1)
    return (vals * mult).to(dtype)


def mxfp4_encode(w: torch.Tensor):
    """Quantise a dense [out, in] matrix (in % 32 == 0) to (packed u8 [out,in/2], scale u8 [out,in/32]).

    Shared exponent per group of 32: 127 + floor(log2(amax)) - 2 (OCP / compressed-tensors), elements
    rounded to the nearest E2M1 value (ties to the even code), saturating at +-6.
    """
    w = w.to(torch.float64)
    out, n = w.shape
    assert n % 32 == 0
    g = w.reshape(out, n // 32, 32)
    amax = g.abs().amax(-1)
    e = torch.where(amax > 0, torch.floor(torch.log2(torch.where(amax > 0, amax, torch.ones_like(amax)))) - 2,
                    torch.full_like(amax, -127.0))
    e = e.clamp(-127, 127)
    scaled = g / torch.pow(2.0, e).unsqueeze(-1)
    mags = torch.tensor(FP4_VALUES[:8], dtype=torch.float64)
    a = scaled.abs().clamp(max=6.0)
    d = (a.unsqueeze(-1) - mags).abs()  # [.., 8]
    # nearest; a tie (two adjacent codes, one even, one odd) goes to the even code
    best = d.min(-1, keepdim=True).values
    cand = (d == best)
    code = torch.argmax(cand.to(torch.int64) * (1 + (torch.arange(8) % 2 == 0).to(torch.int64)), dim=-1)
    sign = (scaled < 0) & (code > 0)
    nib = code + 8 * sign.to(torch.int64)
    nib = nib.reshape(out, n)
    packed = (nib[:, 0::2] | (nib[:, 1::2] << 4)).to(torch.uint8)
    scale = (e + 127).to(torch.uint8)
    return packed, scale


# ------------------------------------------------------------------------ AttnRes


def attn_res(sources: torch.Tensor, norm_w: torch.Tensor, proj_w: torch.Tensor, eps: float):
    """Block AttnRes aggregation (section 3.1).

    sources: [T, n, d]; norm_w: [d]; proj_w: [1, d] or [d]. Returns (out [T, d], alpha [T, n]).
    """
    k = sources * torch.rsqrt(sources.pow(2).mean(-1, keepdim=True) + eps)
    wq = norm_w * proj_w.reshape(-1)
    s = (k * wq).sum(-1)
    alpha = torch.softmax(s, dim=-1)
    out = torch.einsum("tn,tnd->td", alpha, sources)
    return out, alpha
