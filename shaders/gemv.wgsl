// Matrix-vector product y[row_offset + r] = sum_c W[r, c] * x[c] for one row chunk of W.
//
// Preconditions (checked on the host): W holds `rows` x `cols` elements of this chunk in
// row-major order; bf16 weights are packed two per u32 (element 2i in the low half);
// x has `cols` f32 values; y has at least row_offset + rows values.
// One workgroup per row; rows beyond 65535 fold into a 2-D grid.

struct GemvParams {
    rows: u32,
    cols: u32,
    row_offset: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: GemvParams;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

const WG: u32 = 256u;
var<workgroup> partial: array<f32, WG>;

fn bf16_lo(word: u32) -> f32 {
    return bitcast<f32>(word << 16u);
}

fn bf16_hi(word: u32) -> f32 {
    return bitcast<f32>(word & 0xffff0000u);
}

fn bf16_at(i: u32) -> f32 {
    let word = w[i >> 1u];
    return select(bf16_lo(word), bf16_hi(word), (i & 1u) == 1u);
}

fn reduce_and_store(lid: u32, row: u32, acc: f32) {
    partial[lid] = acc;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if (lid < s) {
            partial[lid] += partial[lid + s];
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        y[p.row_offset + row] = partial[0];
    }
}

@compute @workgroup_size(256)
fn gemv_bf16(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let row = wg.x + wg.y * nwg.x;
    if (row >= p.rows) {
        return;
    }
    var acc = 0.0;
    let base = row * p.cols;
    if ((p.cols & 1u) == 0u) {
        // Even rows start on a word: read two weights per load.
        let wbase = base >> 1u;
        let words = p.cols >> 1u;
        for (var j = lid; j < words; j += WG) {
            let word = w[wbase + j];
            acc += bf16_lo(word) * x[2u * j] + bf16_hi(word) * x[2u * j + 1u];
        }
    } else {
        for (var c = lid; c < p.cols; c += WG) {
            acc += bf16_at(base + c) * x[c];
        }
    }
    reduce_and_store(lid, row, acc);
}

@group(0) @binding(4) var<storage, read> wf: array<f32>;

@compute @workgroup_size(256)
fn gemv_f32(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let row = wg.x + wg.y * nwg.x;
    if (row >= p.rows) {
        return;
    }
    var acc = 0.0;
    let base = row * p.cols;
    for (var c = lid; c < p.cols; c += WG) {
        acc += wf[base + c] * x[c];
    }
    reduce_and_store(lid, row, acc);
}
