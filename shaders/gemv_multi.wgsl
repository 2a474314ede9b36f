// Several bf16 matrices sharing one input vector in one dispatch (decode projections that
// read the same normed hidden state: one pass and one tail instead of several). Same
// per-subgroup scheme as gemv_sg.wgsl (whose unit_dot is repeated here: WGSL has no
// includes). Entry e covers workgroup blocks [start[e], start[e + 1]) of RPW rows of its own
// weight binding and writes its own output at row_offset[e]; unused entries have
// start = 0xffffffff and bind placeholders. Preconditions (host-checked): cols % 8 == 0.

override RS: u32 = 2u;
override RPW: u32 = 16u;
const MAX_RS: u32 = 4u;

#include "lib/bf16_unit.wgsl"

struct MultiParams {
    cols: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
    start: vec4<u32>,
    rows: vec4<u32>,
    row_offset: vec4<u32>,
}

@group(0) @binding(0) var<uniform> mp: MultiParams;
@group(0) @binding(1) var<storage, read> mx4: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> mw0: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> mw1: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read> mw2: array<vec4<u32>>;
@group(0) @binding(5) var<storage, read> mw3: array<vec4<u32>>;
@group(0) @binding(6) var<storage, read_write> my0: array<f32>;
@group(0) @binding(7) var<storage, read_write> my1: array<f32>;
@group(0) @binding(8) var<storage, read_write> my2: array<f32>;
@group(0) @binding(9) var<storage, read_write> my3: array<f32>;

fn mw(e: u32, i: u32) -> vec4<u32> {
    switch e {
        case 0u: {
            return mw0[i];
        }
        case 1u: {
            return mw1[i];
        }
        case 2u: {
            return mw2[i];
        }
        default: {
            return mw3[i];
        }
    }
}

fn my_store(e: u32, i: u32, v: f32) {
    switch e {
        case 0u: {
            my0[i] = v;
        }
        case 1u: {
            my1[i] = v;
        }
        case 2u: {
            my2[i] = v;
        }
        default: {
            my3[i] = v;
        }
    }
}

@compute @workgroup_size(256)
fn gemv_bf16_sg_multi(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(subgroup_size) sgs: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(num_subgroups) nsg: u32,
) {
    let block = wg.x + wg.y * nwg.x;
    var e = 0u;
    if (block >= mp.start.y) {
        e = 1u;
    }
    if (block >= mp.start.z) {
        e = 2u;
    }
    if (block >= mp.start.w) {
        e = 3u;
    }
    let rows = mp.rows[e];
    let first = (block - mp.start[e]) * RPW;
    let units = mp.cols / 8u;
    for (var r0 = sg * RS; r0 < RPW; r0 += nsg * RS) {
        let row0 = first + r0;
        if (row0 >= rows) {
            break;
        }
        var acc: array<f32, MAX_RS>;
        var u = lane;
        for (; u + sgs < units; u += 2u * sgs) {
            let v = u + sgs;
            let a0 = mx4[2u * u];
            let b0 = mx4[2u * u + 1u];
            let a1 = mx4[2u * v];
            let b1 = mx4[2u * v + 1u];
            var q0: array<vec4<u32>, MAX_RS>;
            var q1: array<vec4<u32>, MAX_RS>;
            for (var i = 0u; i < RS; i++) {
                let rb = min(row0 + i, rows - 1u) * units;
                q0[i] = mw(e, rb + u);
                q1[i] = mw(e, rb + v);
            }
            for (var i = 0u; i < RS; i++) {
                acc[i] += unit_dot(q0[i], a0, b0) + unit_dot(q1[i], a1, b1);
            }
        }
        if (u < units) {
            let a0 = mx4[2u * u];
            let b0 = mx4[2u * u + 1u];
            for (var i = 0u; i < RS; i++) {
                acc[i] += unit_dot(mw(e, min(row0 + i, rows - 1u) * units + u), a0, b0);
            }
        }
        for (var i = 0u; i < RS; i++) {
            let total = subgroupAdd(acc[i]);
            if (lane == 0u && row0 + i < rows) {
                my_store(e, mp.row_offset[e] + row0 + i, total);
            }
        }
    }
}
