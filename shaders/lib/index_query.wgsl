// The indexer's query as its kernels read it (bindings q and w, params p of the including
// file): f32 as produced, or with p.q_bf16 rounded to bf16 (nearest even), as the reference
// model's bf16 Linear outputs are (spec 5.3): the precision of the scores is a setting.

#include "lib/bf16_bits.wgsl"

fn as_bf16(x: f32) -> f32 {
    return bitcast<f32>(bf16_bits(x) << 16u);
}

// q[i] (a vec4 of one head's dims).
fn query4(i: u32) -> vec4<f32> {
    let v = q[i];
    return select(v, vec4<f32>(as_bf16(v.x), as_bf16(v.y), as_bf16(v.z), as_bf16(v.w)), p.q_bf16 != 0u);
}

// w[i] (a raw head weight, before w_scale).
fn raw_weight(i: u32) -> f32 {
    let v = w[i];
    return select(v, as_bf16(v), p.q_bf16 != 0u);
}
