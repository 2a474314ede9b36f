// Included by the linear kernels (linear*.wgsl): the parameters of one row chunk of W.
// y[t, row_offset + r] (+)= sum_c W[r, c] x[t, c] for r < rows, c < cols, t < tokens.

struct LinearParams {
    rows: u32,
    cols: u32,
    tokens: u32,
    row_offset: u32,
    y_stride: u32,
    accumulate: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: LinearParams;
