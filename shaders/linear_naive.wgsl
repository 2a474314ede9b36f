// The first batched linear kernel, kept as the benchmark's baseline (linear.wgsl replaced it:
// about 0.3 TFLOP/s on the H200, its register tile indexed dynamically). Same contract as
// linear.wgsl. Tiles of 64 rows x 32 tokens, K in steps of 32 through workgroup memory; each
// of the 128 threads computes 4 rows x 4 tokens.

#include "lib/linear_params.wgsl"
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
#include "lib/store_y.wgsl"

const BR: u32 = 64u;
const BT: u32 = 32u;
const BK: u32 = 32u;
var<workgroup> wt: array<f32, 2080>; // [BK, BR + 1]
var<workgroup> xt: array<f32, 1056>; // [BK, BT + 1]

// f32 weights (small f32 tensors such as a router gate saved in f32) share the u32 binding.
override W_F32: bool = false;

fn w_at(i: u32) -> f32 {
    if (W_F32) {
        return bitcast<f32>(w[i]);
    }
    let word = w[i >> 1u];
    return bitcast<f32>(select(word << 16u, word & 0xffff0000u, (i & 1u) == 1u));
}

@compute @workgroup_size(128)
fn linear_naive(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let r0 = wg.x * BR;
    let t0 = wg.y * BT;
    let tr = (lid % 16u) * 4u;
    let tt = (lid / 16u) * 4u;
    var acc: array<f32, 16>;
    for (var k0 = 0u; k0 < p.cols; k0 += BK) {
        // 64 x 32 weights and 32 x 32 activations: 16 + 8 elements per thread.
        for (var q = 0u; q < 16u; q++) {
            let e = lid + q * 128u;
            let r = e / BK;
            let k = e % BK;
            var v = 0.0;
            if (r0 + r < p.rows && k0 + k < p.cols) {
                v = w_at((r0 + r) * p.cols + k0 + k);
            }
            wt[k * (BR + 1u) + r] = v;
        }
        for (var q = 0u; q < 8u; q++) {
            let e = lid + q * 128u;
            let t = e / BK;
            let k = e % BK;
            var v = 0.0;
            if (t0 + t < p.tokens && k0 + k < p.cols) {
                v = x[(t0 + t) * p.cols + k0 + k];
            }
            xt[k * (BT + 1u) + t] = v;
        }
        workgroupBarrier();
        for (var k = 0u; k < BK; k++) {
            let a = vec4<f32>(wt[k * (BR + 1u) + tr], wt[k * (BR + 1u) + tr + 1u], wt[k * (BR + 1u) + tr + 2u], wt[k * (BR + 1u) + tr + 3u]);
            let b = vec4<f32>(xt[k * (BT + 1u) + tt], xt[k * (BT + 1u) + tt + 1u], xt[k * (BT + 1u) + tt + 2u], xt[k * (BT + 1u) + tt + 3u]);
            for (var i = 0u; i < 4u; i++) {
                for (var j = 0u; j < 4u; j++) {
                    acc[i * 4u + j] += a[i] * b[j];
                }
            }
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < 4u; i++) {
        for (var j = 0u; j < 4u; j++) {
            let r = r0 + tr + i;
            let t = t0 + tt + j;
            if (r < p.rows && t < p.tokens) {
                store_y(t * p.y_stride + p.row_offset + r, acc[i * 4u + j]);
            }
        }
    }
}
