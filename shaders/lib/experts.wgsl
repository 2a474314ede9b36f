// The routed-expert kernels' params, shared bindings and scalar helpers (moe.wgsl, moe_sg.wgsl;
// slot layout in moe.wgsl's header).

struct ExpertParams {
    tokens: u32,
    top_k: u32,
    n_in: u32,
    n_mid: u32,
    table_base: u32,
    num_experts: u32,
    slot_words4: u32,
    act: u32,
    off_w1: u32,
    off_w3: u32,
    off_w2: u32,
    off_s1: u32,
    off_s3: u32,
    off_s2: u32,
    beta: f32,
    linear_beta: f32,
    accumulate: u32, // 1: the layer output (stage 2 / combine) is added to what out holds
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: ExpertParams;
@group(0) @binding(1) var<storage, read> pool: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> table: array<u32>;
@group(0) @binding(3) var<storage, read> idx: array<u32>;
@group(0) @binding(4) var<storage, read> wts: array<f32>;
@group(0) @binding(5) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read_write> out: array<f32>;

// 2^(s - 127); s = 0 is the subnormal 2^-127.
fn e8m0(s: u32) -> f32 {
    return select(bitcast<f32>(s << 23u), bitcast<f32>(0x00400000u), s == 0u);
}

#include "lib/activation.wgsl"

// SiTU-GLU (act = 0) or SiLU-GLU (act = 1) of one (gate, up) pair.
fn glu(g: f32, u: f32) -> f32 {
    return glu_act(g, u, p.act, p.beta, p.linear_beta);
}

// Writes one element of the layer output, or adds it (accumulate).
fn store_out(i: u32, v: f32) {
    if (p.accumulate != 0u) {
        out[i] += v;
    } else {
        out[i] = v;
    }
}

fn slot_base(e: u32) -> u32 {
    return table[p.table_base + e] * p.slot_words4;
}
