//! CPU reference of the KDA layer (spec 4.2, 2.3): the gates, the causal short convolution,
//! the l2 norm, the delta-rule recurrence and the gated output norm, token by token with f64
//! accumulation. Obviously right and slow; the GPU ops are checked against it.

use crate::config::{KdaGate, KdaOutputGate};

/// `l2n(x) = x / sqrt(sum x^2 + 1e-6)` (fla's form, not torch's normalize).
pub fn l2n(x: &[f32]) -> Vec<f32> {
    let ss: f64 = x.iter().map(|&a| a as f64 * a as f64).sum();
    let r = 1.0 / (ss + 1e-6).sqrt();
    x.iter().map(|&a| (a as f64 * r) as f32).collect()
}

fn sigmoid(z: f64) -> f64 {
    1.0 / (1.0 + (-z).exp())
}

fn softplus(z: f64) -> f64 {
    if z > 20.0 { z } else { z.exp().ln_1p() }
}

/// Log-decay `g` [T, H, K] from the raw gate input `f` [T, H*K] (before `dt_bias`).
pub fn gate(gate: KdaGate, f: &[f32], a_log: &[f32], dt_bias: &[f32], heads: usize, dk: usize) -> Vec<f32> {
    let p = heads * dk;
    f.iter()
        .enumerate()
        .map(|(i, &fi)| {
            let c = i % p;
            let a = (a_log[c / dk] as f64).exp();
            let z = fi as f64 + dt_bias[c] as f64;
            (match gate {
                KdaGate::Bounded { lower_bound } => lower_bound as f64 * sigmoid(a * z),
                KdaGate::Softplus => -a * softplus(z),
            }) as f32
        })
        .collect()
}

/// `beta = sigmoid(b)`.
pub fn beta(b: &[f32]) -> Vec<f32> {
    b.iter().map(|&x| sigmoid(x as f64) as f32).collect()
}

/// Delta-rule recurrence per head (spec 4.2), state rows = key channels.
/// q (already l2-normalised and scaled), k (l2-normalised), g: [T, H, K]; v: [T, H, V];
/// beta: [T, H]; s0: [H, K, V] or empty for zero. Returns (o [T, H, V], final state [H, K, V]).
#[allow(clippy::too_many_arguments)]
pub fn recurrence(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    s0: &[f32],
    t_len: usize,
    heads: usize,
    dk: usize,
    dv: usize,
) -> (Vec<f32>, Vec<f32>) {
    let mut s: Vec<f64> = if s0.is_empty() { vec![0.0; heads * dk * dv] } else { s0.iter().map(|&x| x as f64).collect() };
    let mut o = vec![0f32; t_len * heads * dv];
    let mut u = vec![0f64; dv];
    for t in 0..t_len {
        for h in 0..heads {
            let kv = |x: &[f32], i: usize| x[(t * heads + h) * dk + i] as f64;
            let st = &mut s[h * dk * dv..(h + 1) * dk * dv];
            for c in 0..dk {
                let d = kv(g, c).exp();
                st[c * dv..(c + 1) * dv].iter_mut().for_each(|x| *x *= d);
            }
            let b = beta[t * heads + h] as f64;
            for (j, uj) in u.iter_mut().enumerate() {
                let sk: f64 = (0..dk).map(|c| st[c * dv + j] * kv(k, c)).sum();
                *uj = b * (v[(t * heads + h) * dv + j] as f64 - sk);
            }
            for c in 0..dk {
                let kc = kv(k, c);
                for j in 0..dv {
                    st[c * dv + j] += kc * u[j];
                }
            }
            for j in 0..dv {
                o[(t * heads + h) * dv + j] = (0..dk).map(|c| st[c * dv + j] * kv(q, c)).sum::<f64>() as f32;
            }
        }
    }
    (o, s.into_iter().map(|x| x as f32).collect())
}

/// Causal depthwise convolution with SiLU: x [T, C] pre-conv inputs, w [C, W] (tap W-1 is
/// the current token), window [W-1, C] the inputs before t = 0 (oldest first).
pub fn conv_silu(x: &[f32], w: &[f32], window: &[f32], t_len: usize, ch: usize, taps: usize) -> Vec<f32> {
    let at = |t: isize, c: usize| -> f64 {
        if t >= 0 {
            x[t as usize * ch + c] as f64
        } else {
            let i = (taps as isize - 1) + t; // t = -1 -> last window row
            if i >= 0 { window[i as usize * ch + c] as f64 } else { 0.0 }
        }
    };
    let mut y = vec![0f32; t_len * ch];
    for t in 0..t_len {
        for c in 0..ch {
            let z: f64 = (0..taps).map(|j| w[c * taps + j] as f64 * at(t as isize - (taps - 1 - j) as isize, c)).sum();
            y[t * ch + c] = (z * sigmoid(z)) as f32;
        }
    }
    y
}

/// The conv window after `x`: the last W-1 pre-conv inputs [W-1, C], oldest first.
pub fn conv_window_after(x: &[f32], window: &[f32], t_len: usize, ch: usize, taps: usize) -> Vec<f32> {
    let mut all: Vec<f32> = window.to_vec();
    all.extend_from_slice(&x[..t_len * ch]);
    all[all.len() - (taps - 1) * ch..].to_vec()
}

/// `y = x W^T`, x [T, n_in], W [n_out, n_in].
pub fn linear(x: &[f32], w: &[f32], t_len: usize, n_in: usize, n_out: usize) -> Vec<f32> {
    let mut y = vec![0f32; t_len * n_out];
    for t in 0..t_len {
        let xr = &x[t * n_in..(t + 1) * n_in];
        for o in 0..n_out {
            y[t * n_out + o] = w[o * n_in..(o + 1) * n_in].iter().zip(xr).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() as f32;
        }
    }
    y
}

/// Per-head RMSNorm of o [T, H, V] (eps 1e-5, weight [V]) times sigmoid(gate) [T, H*V].
pub fn gated_norm(o: &[f32], gate: &[f32], weight: &[f32], rows: usize, dv: usize, eps: f64) -> Vec<f32> {
    let mut y = vec![0f32; rows * dv];
    for r in 0..rows {
        let x = &o[r * dv..(r + 1) * dv];
        let ms: f64 = x.iter().map(|&a| a as f64 * a as f64).sum::<f64>() / dv as f64;
        let rs = 1.0 / (ms + eps).sqrt();
        for j in 0..dv {
            y[r * dv + j] = (x[j] as f64 * rs * weight[j] as f64 * sigmoid(gate[r * dv + j] as f64)) as f32;
        }
    }
    y
}

/// Weights of one KDA layer as f32 values (bf16 ones already widened), HF shapes.
#[derive(Clone, Debug)]
pub struct KdaWeights {
    pub q_proj: Vec<f32>, // [P, d]
    pub k_proj: Vec<f32>,
    pub v_proj: Vec<f32>,
    pub q_conv: Vec<f32>, // [P, W]
    pub k_conv: Vec<f32>,
    pub v_conv: Vec<f32>,
    pub f_a: Vec<f32>, // [K, d]
    pub f_b: Vec<f32>, // [P, K]
    pub dt_bias: Vec<f32>, // [P]
    pub a_log: Vec<f32>,   // [H]
    pub b_proj: Vec<f32>,  // [H, d]
    pub g_proj: Vec<f32>,  // [P, d] (FullRank)
    pub g_a: Vec<f32>,     // [K, d] (LowRank)
    pub g_b: Vec<f32>,     // [P, K] (LowRank)
    pub o_norm: Vec<f32>,  // [V]
    pub o_proj: Vec<f32>,  // [d, P]
}

/// Shape of one layer.
#[derive(Clone, Copy, Debug)]
pub struct KdaShape {
    pub d: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub taps: usize,
    pub gate: KdaGate,
    pub output_gate: KdaOutputGate,
}

/// Per-sequence state: recurrent [H, K, V] and conv windows [W-1, P] for q, k, v.
#[derive(Clone, Debug)]
pub struct KdaState {
    pub s: Vec<f32>,
    pub conv: [Vec<f32>; 3],
}

impl KdaState {
    pub fn zeros(sh: &KdaShape) -> KdaState {
        let p = sh.heads * sh.head_dim;
        let w = vec![0f32; (sh.taps - 1) * p];
        KdaState { s: vec![0f32; sh.heads * sh.head_dim * sh.head_dim], conv: [w.clone(), w.clone(), w] }
    }
}

/// The whole layer on x [T, d] -> [T, d], advancing `state`. Also returns the recurrence
/// output o [T, H, V] before the gated norm (for debugging).
pub fn layer(sh: &KdaShape, w: &KdaWeights, x: &[f32], t_len: usize, state: &mut KdaState) -> (Vec<f32>, Vec<f32>) {
    let (d, h, k, taps) = (sh.d, sh.heads, sh.head_dim, sh.taps);
    let p = h * k;
    let mut qkv = Vec::new();
    for (i, (pw, cw)) in [(&w.q_proj, &w.q_conv), (&w.k_proj, &w.k_conv), (&w.v_proj, &w.v_conv)].into_iter().enumerate() {
        let pre = linear(x, pw, t_len, d, p);
        qkv.push(conv_silu(&pre, cw, &state.conv[i], t_len, p, taps));
        state.conv[i] = conv_window_after(&pre, &state.conv[i], t_len, p, taps);
    }
    let scale = 1.0 / (k as f32).sqrt();
    let norm = |x: &[f32], s: f32| -> Vec<f32> { x.chunks(k).flat_map(|c| l2n(c).into_iter().map(move |a| a * s)).collect() };
    let q = norm(&qkv[0], scale);
    let kk = norm(&qkv[1], 1.0);
    let f = linear(&linear(x, &w.f_a, t_len, d, k), &w.f_b, t_len, k, p);
    let g = gate(sh.gate, &f, &w.a_log, &w.dt_bias, h, k);
    let b = beta(&linear(x, &w.b_proj, t_len, d, h));
    let (o, s) = recurrence(&q, &kk, &qkv[2], &g, &b, &state.s, t_len, h, k, k);
    state.s = s;
    let gl = match sh.output_gate {
        KdaOutputGate::FullRank => linear(x, &w.g_proj, t_len, d, p),
        KdaOutputGate::LowRank => linear(&linear(x, &w.g_a, t_len, d, k), &w.g_b, t_len, k, p),
    };
    let y = gated_norm(&o, &gl, &w.o_norm, t_len * h, k, 1e-5);
    (linear(&y, &w.o_proj, t_len, p, d), o)
}
