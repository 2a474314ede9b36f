// Device-to-device copy of `words4` vec4<f32> values: the bandwidth ceiling every
// memory-bound kernel is judged against (benches measure it in the same run).

struct CopyParams {
    words4: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: CopyParams;
@group(0) @binding(1) var<storage, read> src: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> dst: array<vec4<f32>>;

@compute @workgroup_size(256)
fn copy_vec4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let stride = nwg.x * 256u;
    for (var i = gid.x + gid.y * stride; i < p.words4; i += stride * nwg.y) {
        dst[i] = src[i];
    }
}
