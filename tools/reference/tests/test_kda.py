"""KDA (recurrence, both gate forms, short conv) vs fla's naive references."""
import math

import pytest
import torch
import torch.nn.functional as F

from conftest import rel_err
from k31ref import ops

naive = pytest.importorskip("fla.ops.kda.naive")
gate_mod = pytest.importorskip("fla.ops.kda.gate")

H, K = 2, 128


def _inputs(T, seed, gate_form):
    g = torch.Generator().manual_seed(seed)
    q = ops.l2n(torch.randn(1, T, H, K, generator=g))
    k = ops.l2n(torch.randn(1, T, H, K, generator=g))
    v = torch.randn(1, T, H, K, generator=g)
    f = torch.randn(1, T, H, K, generator=g)  # raw gate input f_b(f_a(x))
    A_log = torch.log(torch.empty(H).uniform_(1, 16, generator=g))
    if gate_form == "bounded":
        dt_bias = torch.empty(H * K).uniform_(-1.5, 0.5, generator=g)
    else:
        dt = torch.exp(torch.empty(H * K).uniform_(math.log(1e-3), math.log(0.1), generator=g))
        dt_bias = dt + torch.log(-torch.expm1(-dt))
    beta = torch.sigmoid(torch.randn(1, T, H, generator=g))
    S0 = torch.randn(1, H, K, K, generator=g) * 0.5
    return q, k, v, f, A_log, dt_bias, beta, S0


@pytest.mark.parametrize("gate_form", ["bounded", "softplus"])
def test_gate_vs_fla(gate_form, measure):
    q, k, v, f, A_log, dt_bias, beta, S0 = _inputs(64, 1, gate_form)
    if gate_form == "bounded":
        ours = ops.kda_gate_bounded(f[0], A_log, dt_bias, -5.0)
        ref = gate_mod.naive_kda_lowerbound_gate(f, A_log, dt_bias, lower_bound=-5.0)[0]
    else:
        ours = ops.kda_gate_softplus(f[0], A_log, dt_bias)
        ref = gate_mod.naive_kda_gate(f, A_log, dt_bias)[0]
    measure(f"kda gate ({gate_form}) vs fla naive gate, fp32", rel_err(ours, ref), 1e-6)


@pytest.mark.parametrize("gate_form", ["bounded", "softplus"])
@pytest.mark.parametrize("T", [1, 17, 64, 200])
def test_recurrence_vs_fla_recurrent(T, gate_form, measure):
    q, k, v, f, A_log, dt_bias, beta, S0 = _inputs(T, 100 + T, gate_form)
    gf = ops.kda_gate_bounded if gate_form == "bounded" else ops.kda_gate_softplus
    args = (f[0], A_log, dt_bias, -5.0) if gate_form == "bounded" else (f[0], A_log, dt_bias)
    gg = gf(*args)
    o, S = ops.kda_recurrent(q[0], k[0], v[0], gg, beta[0], K ** -0.5, S0[0])
    o_ref, S_ref = naive.naive_recurrent_kda(q, k, v, gg[None], beta, scale=K ** -0.5, initial_state=S0,
                                             output_final_state=True)
    measure(f"KDA o  vs naive_recurrent_kda T={T} {gate_form} fp32", rel_err(o, o_ref[0]), 1e-5)
    measure(f"KDA S  vs naive_recurrent_kda T={T} {gate_form} fp32", rel_err(S, S_ref[0]), 1e-5)
    # the float64 reference against fla's fp32 loop
    o64, S64 = ops.kda_recurrent(q[0].double(), k[0].double(), v[0].double(), gg.double(), beta[0].double(),
                                 K ** -0.5, S0[0].double())
    measure(f"KDA o  (f64 ours) vs naive_recurrent_kda T={T} {gate_form}", rel_err(o64, o_ref[0]), 1e-5)


@pytest.mark.parametrize("T", [64, 192])
def test_recurrence_vs_fla_chunk(T, measure):
    q, k, v, f, A_log, dt_bias, beta, S0 = _inputs(T, 7 + T, "bounded")
    gg = ops.kda_gate_bounded(f[0], A_log, dt_bias, -5.0)
    o, S = ops.kda_recurrent(q[0], k[0], v[0], gg, beta[0], K ** -0.5, S0[0])
    o_ref, S_ref = naive.naive_chunk_kda(q, k, v, gg[None], beta, scale=K ** -0.5, initial_state=S0,
                                         output_final_state=True, chunk_size=64)
    measure(f"KDA o  vs naive_chunk_kda T={T} fp32", rel_err(o, o_ref[0]), 1e-5)
    measure(f"KDA S  vs naive_chunk_kda T={T} fp32", rel_err(S, S_ref[0]), 1e-5)


def test_state_handoff(measure):
    """Prefill T then continue N steps from the returned state == one pass over T+N (exact)."""
    q, k, v, f, A_log, dt_bias, beta, S0 = _inputs(80, 3, "bounded")
    gg = ops.kda_gate_bounded(f[0], A_log, dt_bias, -5.0)
    o, S = ops.kda_recurrent(q[0], k[0], v[0], gg, beta[0], None, S0[0])
    o1, S1 = ops.kda_recurrent(q[0, :50], k[0, :50], v[0, :50], gg[:50], beta[0, :50], None, S0[0])
    outs = [o1]
    for t in range(50, 80):
        ot, S1 = ops.kda_recurrent(q[0, t:t + 1], k[0, t:t + 1], v[0, t:t + 1], gg[t:t + 1], beta[0, t:t + 1], None, S1)
        outs.append(ot)
    measure("KDA prefill 50 + 30 decode steps vs one pass (o)", rel_err(torch.cat(outs), o), 1e-6)
    measure("KDA prefill 50 + 30 decode steps vs one pass (S)", rel_err(S1, S), 1e-6)


def test_short_conv_vs_torch_conv1d(measure):
    g = torch.Generator().manual_seed(5)
    T, C, W = 37, 64, 4
    x = torch.randn(T, C, generator=g, dtype=torch.float64)
    w = torch.randn(C, 1, W, generator=g, dtype=torch.float64)
    ref = F.silu(F.conv1d(x.t()[None], w, padding=W - 1, groups=C)[0, :, :T].t())
    y, _ = ops.short_conv(x, w[:, 0], None)
    measure("short conv vs torch conv1d (f64)", rel_err(y, ref), 1e-12)
    # split into prefill 10 + single steps, carrying the conv state
    y1, st = ops.short_conv(x[:10], w[:, 0], None)
    ys = [y1]
    for t in range(10, T):
        yt, st = ops.short_conv(x[t:t + 1], w[:, 0], st)
        ys.append(yt)
    measure("short conv prefill 10 + steps vs conv1d (f64)", rel_err(torch.cat(ys), ref), 1e-12)


def test_gated_norm_vs_fla(measure):
    ln = pytest.importorskip("fla.modules.norm.layernorm")
    g = torch.Generator().manual_seed(9)
    o = torch.randn(17, H, K, generator=g)
    w = torch.rand(K, generator=g) + 0.5
    G = torch.randn(17, H, K, generator=g)
    ref = ln.rms_norm_ref(o, w, None, eps=1e-5) * torch.sigmoid(G)
    measure("KDA gated output norm vs fla rms_norm_ref * sigmoid", rel_err(ops.gated_rms_norm(o, w, G, 1e-5), ref), 1e-6)
