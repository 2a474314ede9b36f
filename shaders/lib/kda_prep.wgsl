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
    run: u32,       // kda_prep_run: tokens per subgroup
    cumsum: u32,    // kda_prep_run: 1 = write g as its within-chunk cumulative sum (runs are chunks)
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
    return log_decay(exp(a_log[h]), f + dt_bias[h * p.dk + c]);
}

// The log decay from a = exp(A_log[h]) and z = f + dt_bias.
fn log_decay(a: f32, z: f32) -> f32 {
    if (p.gate_kind == 0u) {
        return p.lower_bound * sigmoid(a * z);
    }
    let sp = select(log(1.0 + exp(z)), z, z > 20.0);
    return -a * sp;
}

// Pre-conv input of channel ch (of 3P) at segment-relative token t (may be negative:
// then it comes from the ring, or is 0 before the sequence start). The segment's load is
// issued whatever t is (clamped into the segment), the ring's only near its start.
fn conv_input(t: i32, ch: u32) -> f32 {
    let n3 = 3u * p.heads * p.dk;
    let a = i32(p.pos) + t;
    let from_qkv = qkv[u32(clamp(t, 0, i32(p.t_len) - 1)) * n3 + ch];
    var from_ring = 0.0;
    if (t < 0 && a >= 0) {
        from_ring = ring[(u32(a) % p.taps) * n3 + ch];
    }
    return select(from_ring, from_qkv, t >= 0);
}

// silu(sum_j w[ch, j] x[t - (W-1) + j]) for channel ch at token t: up to four taps with every
// load issued first (K3.1's kernel is 4), a loop past that. A tap loop waited on each load in
// turn: kda_prep_sg at T = 8192 x 96 heads 4.50 -> 4.05 ms on an H200.
fn conv_silu(t: u32, ch: u32) -> f32 {
    if (p.post_conv == 1u) {
        return qkv[t * 3u * p.heads * p.dk + ch];
    }
    let ti = i32(t) - i32(p.taps) + 1;
    let w = ch * p.taps;
    let x0 = conv_input(ti, ch);
    let x1 = conv_input(ti + 1, ch);
    let x2 = conv_input(ti + 2, ch);
    let x3 = conv_input(ti + 3, ch);
    let w0 = conv_w[w];
    let w1 = conv_w[w + min(1u, p.taps - 1u)];
    let w2 = conv_w[w + min(2u, p.taps - 1u)];
    let w3 = conv_w[w + min(3u, p.taps - 1u)];
    var z = w0 * x0;
    z += select(0.0, w1 * x1, p.taps > 1u);
    z += select(0.0, w2 * x2, p.taps > 2u);
    z += select(0.0, w3 * x3, p.taps > 3u);
    for (var j = 4u; j < p.taps; j++) {
        z += conv_w[w + j] * conv_input(ti + i32(j), ch);
    }
    return silu(z);
}
