// linear.wgsl for any cols (the SIMT tiling of lib/linear_simt.wgsl with scalar loads, each k
// checked against cols): the fallback where rows are not 16-byte aligned (cols not a multiple
// of 8 for bf16 W, of 4 for f32 W). Same contract as linear.wgsl.

#include "lib/linear_params.wgsl"
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
#include "lib/store_y.wgsl"

override W_F32: bool = false;

// Element i of W (row-major), 0 past the row's end (k >= cols).
fn w_at(row: u32, k: u32) -> f32 {
    if (k >= p.cols) {
        return 0.0;
    }
    let i = row * p.cols + k;
    if (W_F32) {
        return bitcast<f32>(w[i]);
    }
    let word = w[i >> 1u];
    return bitcast<f32>(select(word << 16u, word & 0xffff0000u, (i & 1u) == 1u));
}

fn x_at(t: u32, k: u32) -> f32 {
    if (k >= p.cols) {
        return 0.0;
    }
    return x[t * p.cols + k];
}

fn fetch_w(row: u32, k: u32) -> Slab {
    return Slab(vec4<f32>(w_at(row, k), w_at(row, k + 1u), w_at(row, k + 2u), w_at(row, k + 3u)),
                vec4<f32>(w_at(row, k + 4u), w_at(row, k + 5u), w_at(row, k + 6u), w_at(row, k + 7u)));
}

fn fetch_x(t: u32, k: u32) -> Slab {
    return Slab(vec4<f32>(x_at(t, k), x_at(t, k + 1u), x_at(t, k + 2u), x_at(t, k + 3u)),
                vec4<f32>(x_at(t, k + 4u), x_at(t, k + 5u), x_at(t, k + 6u), x_at(t, k + 7u)));
}

#include "lib/linear_simt.wgsl"
