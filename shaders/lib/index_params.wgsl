// The indexer kernels' parameters (ops::dsa::IndexParams).

struct IndexParams {
    n_queries: u32,
    row_stride: u32,
    q_pos0: u32,
    n_pos: u32,
    page0: u32,
    shift_max: u32,
    w_scale: f32,
    q_bf16: u32, // 1: q and w rounded to bf16 at load (lib/index_query.wgsl)
}
