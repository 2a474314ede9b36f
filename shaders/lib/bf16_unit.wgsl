// Eight bf16 weights (one 16-byte unit; element 2i is the low half of word i) times eight
// activations a = elements 0-3, b = elements 4-7.
fn unit_dot(q: vec4<u32>, a: vec4<f32>, b: vec4<f32>) -> f32 {
    let lo = bitcast<vec4<f32>>(q << vec4<u32>(16u));
    let hi = bitcast<vec4<f32>>(q & vec4<u32>(0xffff0000u));
    return dot(vec4<f32>(lo.x, hi.x, lo.y, hi.y), a) + dot(vec4<f32>(lo.z, hi.z, lo.w, hi.w), b);
}
