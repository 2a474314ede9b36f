// Small row ops of the global layer: in-place RMSNorm / LayerNorm of a segment of each row
// (spec 2.1, 2.2; f32 math, f32 weights) and the bf16 cache-row write.
//
// Preconditions (host): x is [rows, stride] f32 and offset + n <= stride; gamma and beta hold
// n f32 values (beta is read by layer_norm only); cache_write: src [rows, src_stride] f32 with
// offset + width <= src_stride, width even; dst is one cache page of rows of width bf16 packed
// two per u32, dst_row0 + rows within the page.

struct NormParams {
    rows: u32,
    stride: u32,
    offset: u32,
    n: u32,
    eps: f32,
    _p0: u32,
    _p1: u32,
    _p2: u32,
}

struct CacheWriteParams {
    rows: u32,
    src_stride: u32,
    src_offset: u32,
    width: u32,
    dst_row0: u32,
    _p0: u32,
    _p1: u32,
    _p2: u32,
}

const WG: u32 = 256u;

@group(0) @binding(0) var<uniform> np: NormParams;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read> gamma: array<f32>;
@group(0) @binding(3) var<storage, read> beta: array<f32>;

#include "lib/wg_sum.wgsl"

@compute @workgroup_size(256)
fn rms_norm(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let base = wg.x * np.stride + np.offset;
    var ss = 0.0;
    for (var i = lid; i < np.n; i += WG) {
        ss += x[base + i] * x[base + i];
    }
    let r = inverseSqrt(wg_sum(lid, ss) / f32(np.n) + np.eps);
    for (var i = lid; i < np.n; i += WG) {
        x[base + i] = x[base + i] * r * gamma[i];
    }
}

@compute @workgroup_size(256)
fn layer_norm(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let base = wg.x * np.stride + np.offset;
    var s = 0.0;
    for (var i = lid; i < np.n; i += WG) {
        s += x[base + i];
    }
    let mean = wg_sum(lid, s) / f32(np.n);
    var ss = 0.0;
    for (var i = lid; i < np.n; i += WG) {
        let d = x[base + i] - mean;
        ss += d * d;
    }
    let r = inverseSqrt(wg_sum(lid, ss) / f32(np.n) + np.eps);
    for (var i = lid; i < np.n; i += WG) {
        x[base + i] = (x[base + i] - mean) * r * gamma[i] + beta[i];
    }
}

@group(0) @binding(4) var<uniform> cp: CacheWriteParams;
@group(0) @binding(5) var<storage, read> src: array<f32>;
@group(0) @binding(6) var<storage, read_write> dst: array<u32>;

#include "lib/bf16_bits.wgsl"

@compute @workgroup_size(256)
fn cache_write(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    let words = cp.width / 2u;
    if (i >= cp.rows * words) {
        return;
    }
    let row = i / words;
    let w = i % words;
    let s = row * cp.src_stride + cp.src_offset + 2u * w;
    dst[(cp.dst_row0 + row) * words + w] = bf16_bits(src[s]) | (bf16_bits(src[s + 1u]) << 16u);
}
