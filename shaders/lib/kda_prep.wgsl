// KDA params, the bindings kda_prep and its subgroup twin share (kda.wgsl, kda_sg.wgsl), and
// the per-channel conv / gate helpers.

struct KdaParams {
    t_len: u32,     // tokens in this call
    heads: u32,
    dk: u32,        // head dim K (= V)
    taps: u32,      // conv kernel W
    pos: u32,       // absolute position of token 0 of this call
    gate_kind: u32, // 0 bounded, 1 softplus
    lower_bound: f32,
    scale: f32,     // K^-1/2 on q
    eps: f32,       // RMSNorm eps of the output norm
    post_conv: u32, // 1: qkv already holds post-conv, post-SiLU values (tests, goldens)
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: KdaParams;
@group(0) @binding(1) var<storage, read> qkv: array<f32>;       // [T, 3P]
@group(0) @binding(2) var<storage, read> fgate: array<f32>;     // [T, P] raw f (before dt_bias)
@group(0) @binding(3) var<storage, read> blog: array<f32>;      // [T, H] raw beta logits
@group(0) @binding(4) var<storage, read> conv_w: array<f32>;    // [3P, W]
@group(0) @binding(5) var<storage, read> a_log: array<f32>;     // [H]
@group(0) @binding(6) var<storage, read> dt_bias: array<f32>;   // [P]
@group(0) @binding(7) var<storage, read_write> ring: array<f32>; // [W, 3P]
@group(0) @binding(10) var<storage, read_write> q_out: array<f32>; // [T, H, K] l2n(q) * scale
@group(0) @binding(11) var<storage, read_write> k_out: array<f32>; // [T, H, K] l2n(k)
@group(0) @binding(12) var<storage, read_write> v_out: array<f32>; // [T, H, V]
@group(0) @binding(13) var<storage, read_write> g_out: array<f32>; // [T, H, K] log decay
@group(0) @binding(14) var<storage, read_write> beta_out: array<f32>; // [T, H]

#include "lib/activation.wgsl"

fn silu(z: f32) -> f32 {
    return z * sigmoid(z);
}

// Log decay of one (head, key channel) from the raw gate input.
fn gate(h: u32, c: u32, f: f32) -> f32 {
    let a = exp(a_log[h]);
    let z = f + dt_bias[h * p.dk + c];
    if (p.gate_kind == 0u) {
        return p.lower_bound * sigmoid(a * z);
    }
    let sp = select(log(1.0 + exp(z)), z, z > 20.0);
    return -a * sp;
}

// Pre-conv input of channel ch (of 3P) at segment-relative token t (may be negative:
// then it comes from the ring, or is 0 before the sequence start).
fn conv_input(t: i32, ch: u32) -> f32 {
    let n3 = 3u * p.heads * p.dk;
    if (t >= 0) {
        return qkv[u32(t) * n3 + ch];
    }
    let a = i32(p.pos) + t;
    if (a < 0) {
        return 0.0;
    }
    return ring[(u32(a) % p.taps) * n3 + ch];
}

// silu(sum_j w[ch, j] x[t - (W-1) + j]) for channel ch at token t.
fn conv_silu(t: u32, ch: u32) -> f32 {
    if (p.post_conv == 1u) {
        return qkv[t * 3u * p.heads * p.dk + ch];
    }
    var z = 0.0;
    for (var j = 0u; j < p.taps; j++) {
        z += conv_w[ch * p.taps + j] * conv_input(i32(t) - i32(p.taps - 1u - j), ch);
    }
    return silu(z);
}
