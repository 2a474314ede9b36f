// The GEMV params and output (gemv.wgsl, gemv_sg.wgsl).

struct GemvParams {
    rows: u32,
    cols: u32,
    row_offset: u32,
    accumulate: u32,
}

@group(0) @binding(0) var<uniform> p: GemvParams;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
#include "lib/store_y.wgsl"
