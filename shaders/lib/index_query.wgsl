// The indexer's query as its kernels read it (bindings q and w, params p of the including
// file): f32 as produced, or with p.q_bf16 rounded to bf16 (nearest even), as the reference
// model's bf16 Linear outputs are (spec 5.3): the precision of the scores is a setting.

fn bf16_round4(v: vec4<f32>) -> vec4<f32> {
    let u = bitcast<vec4<u32>>(v);
    let r = u + vec4<u32>(0x7fffu) + ((u >> vec4<u32>(16u)) & vec4<u32>(1u));
    return bitcast<vec4<f32>>(r & vec4<u32>(0xffff0000u));
}

// q[i] (a vec4 of one head's dims).
fn query4(i: u32) -> vec4<f32> {
    let v = q[i];
    return select(v, bf16_round4(v), p.q_bf16 != 0u);
}

// w[i] (a raw head weight, before w_scale).
fn raw_weight(i: u32) -> f32 {
    let v = w[i];
    return select(v, bf16_round4(vec4<f32>(v)).x, p.q_bf16 != 0u);
}
