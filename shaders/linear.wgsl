// Batched linear layer for prefill (T >= 2; one token goes through the GEMV), SIMT: the default
// where cooperative matrices are absent (linear_coop.wgsl is the tensor-core twin).
//   y[t, row_offset + r] (+)= sum_c W[r, c] x[t, c]
// for one row chunk of W [rows, cols], bf16 (two per u32, element 2i low) or f32 (W_F32),
// x [tokens, cols] f32, y [tokens, y_stride] f32. This file reads W and x in 16-byte loads:
// the host runs it only where cols is a multiple of 8 (bf16) or 4 (f32), so a row starts on
// a 16-byte boundary and 8 consecutive k are all within cols or all past it (linear_any.wgsl
// takes any cols). Tiling: lib/linear_simt.wgsl.

#include "lib/linear_params.wgsl"
@group(0) @binding(1) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
#include "lib/store_y.wgsl"

// f32 weights (small f32 tensors such as a router gate saved in f32) share the u32 binding.
override W_F32: bool = false;

fn bf_lo(v: u32) -> f32 {
    return bitcast<f32>(v << 16u);
}

fn bf_hi(v: u32) -> f32 {
    return bitcast<f32>(v & 0xffff0000u);
}

// W[row, k..k+8]; k is a multiple of 8 (and of 4 for the f32 halves).
fn fetch_w(row: u32, k: u32) -> Slab {
    var s = Slab();
    if (k >= p.cols) {
        return s;
    }
    if (W_F32) {
        let i = (row * p.cols + k) / 4u;
        s.a = bitcast<vec4<f32>>(w[i]);
        if (k + 4u < p.cols) {
            s.b = bitcast<vec4<f32>>(w[i + 1u]);
        }
        return s;
    }
    let v = w[(row * p.cols + k) / 8u];
    s.a = vec4<f32>(bf_lo(v.x), bf_hi(v.x), bf_lo(v.y), bf_hi(v.y));
    s.b = vec4<f32>(bf_lo(v.z), bf_hi(v.z), bf_lo(v.w), bf_hi(v.w));
    return s;
}

fn fetch_x(t: u32, k: u32) -> Slab {
    var s = Slab();
    if (k >= p.cols) {
        return s;
    }
    let i = (t * p.cols + k) / 4u;
    s.a = x[i];
    if (k + 4u < p.cols) {
        s.b = x[i + 1u];
    }
    return s;
}

#include "lib/linear_simt.wgsl"
