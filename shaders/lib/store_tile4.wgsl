// Stores a 4 x 4 register tile (rows s0..s3 of 4 consecutive floats each) into DST from `at`,
// rows `stride` floats apart: kda_chunk.wgsl's register state pass writes the final state this
// way. Included once per buffer, DST and store_tile4 renamed.
fn store_tile4(at: u32, stride: u32, s0: vec4<f32>, s1: vec4<f32>, s2: vec4<f32>, s3: vec4<f32>) {
    DST[at] = s0.x;
    DST[at + 1u] = s0.y;
    DST[at + 2u] = s0.z;
    DST[at + 3u] = s0.w;
    let a1 = at + stride;
    DST[a1] = s1.x;
    DST[a1 + 1u] = s1.y;
    DST[a1 + 2u] = s1.z;
    DST[a1 + 3u] = s1.w;
    let a2 = at + 2u * stride;
    DST[a2] = s2.x;
    DST[a2 + 1u] = s2.y;
    DST[a2 + 2u] = s2.z;
    DST[a2 + 3u] = s2.w;
    let a3 = at + 3u * stride;
    DST[a3] = s3.x;
    DST[a3 + 1u] = s3.y;
    DST[a3 + 2u] = s3.z;
    DST[a3 + 3u] = s3.w;
}
