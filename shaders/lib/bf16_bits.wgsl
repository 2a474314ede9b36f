// Round to nearest even bf16 (finite inputs).
fn bf16_bits(v: f32) -> u32 {
    let u = bitcast<u32>(v);
    return (u + 0x7fffu + ((u >> 16u) & 1u)) >> 16u;
}
