// Matrix-vector product y[row_offset + r] = sum_c W[r, c] * x[c] for one row chunk of W.
//
// Preconditions (checked on the host): W holds `rows` x `cols` elements of this chunk in
// row-major order; bf16 weights are packed two per u32 (element 2i in the low half);
// x has `cols` f32 values; y has at least row_offset + rows values.
// One workgroup per row; rows beyond 65535 fold into a 2-D grid.

#include "lib/gemv_out.wgsl"

@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<f32>;

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
        store_y(p.row_offset + row, partial[0]);
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

// Fast path when cols % 8 == 0: 16-byte weight loads (8 bf16) and ROWS rows per workgroup
// sharing each activation load. Grid: ceil(rows / ROWS) workgroups.
@group(0) @binding(5) var<storage, read> w4: array<vec4<u32>>;
@group(0) @binding(6) var<storage, read> x4: array<vec4<f32>>;

const WG4: u32 = 128u;
const MAX_ROWS: u32 = 8u;
override ROWS: u32 = 4u;
var<workgroup> partial4: array<f32, 1024>; // [MAX_ROWS, WG4]

fn bf2(word: u32) -> vec2<f32> {
    return vec2<f32>(bf16_lo(word), bf16_hi(word));
}

@compute @workgroup_size(128)
fn gemv_bf16_v4(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let row0 = (wg.x + wg.y * nwg.x) * ROWS;
    if (row0 >= p.rows) {
        return;
    }
    let units = p.cols / 8u;
    var acc: array<f32, MAX_ROWS>;
    for (var u = lid; u < units; u += WG4) {
        let a = x4[2u * u];
        let b = x4[2u * u + 1u];
        for (var r = 0u; r < ROWS; r++) {
            let q = w4[min(row0 + r, p.rows - 1u) * units + u];
            acc[r] += dot(vec4<f32>(bf2(q.x), bf2(q.y)), a) + dot(vec4<f32>(bf2(q.z), bf2(q.w)), b);
        }
    }
    for (var r = 0u; r < ROWS; r++) {
        partial4[r * WG4 + lid] = acc[r];
    }
    workgroupBarrier();
    for (var s = WG4 / 2u; s > 0u; s = s >> 1u) {
        if (lid < s) {
            for (var r = 0u; r < ROWS; r++) {
                partial4[r * WG4 + lid] += partial4[r * WG4 + lid + s];
            }
        }
        workgroupBarrier();
    }
    if (lid < ROWS && row0 + lid < p.rows) {
        store_y(p.row_offset + row0 + lid, partial4[lid * WG4]);
    }
}
