// Several bf16 matrices sharing one input vector in one dispatch (decode projections that
// read the same normed hidden state: one pass and one tail instead of several). Same
// per-subgroup scheme as gemv_sg.wgsl. Entry e covers workgroup blocks [start[e], start[e + 1]) of RPW rows of its own
// weight binding and writes its own output at row_offset[e]; unused entries have
// start = 0xffffffff and bind placeholders. With glu != 0 entries 2 and 3 are one gated
// pair: entry 2's blocks cover the rows of both matrices (mw2 the gate, mw3 the up
// projection, the same shape), and my2 gets act(gate x, up x) (the shared experts' activation
// without the dependent dispatch it needed as a separate op). Preconditions (host-checked):
// cols % 8 == 0.

override RS: u32 = 2u;
override RPW: u32 = 16u;
// Workgroup size.
override WGM: u32 = 256u;
const MAX_RS: u32 = 4u;

#include "lib/bf16_unit.wgsl"

struct MultiParams {
    cols: u32,
    glu: u32, // 0: four plain entries; 1 + act code (lib/activation.wgsl): entries 2, 3 gated
    beta: f32,
    linear_beta: f32,
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

// One body per entry (a renamed copy of the include each): a switch on the entry for every
// load cost ~8 % of the KDA and dense layers' GEMV time on an H200.
fn store0(i: u32, v: f32) {
    my0[i] = v;
}
fn store1(i: u32, v: f32) {
    my1[i] = v;
}
fn store2(i: u32, v: f32) {
    my2[i] = v;
}
fn store3(i: u32, v: f32) {
    my3[i] = v;
}
#include "lib/gemv_multi_rows.wgsl" MW=mw0 STORE=store0 entry_rows=entry_rows0
#include "lib/gemv_multi_rows.wgsl" MW=mw1 STORE=store1 entry_rows=entry_rows1
#include "lib/gemv_multi_rows.wgsl" MW=mw2 STORE=store2 entry_rows=entry_rows2
#include "lib/gemv_multi_rows.wgsl" MW=mw3 STORE=store3 entry_rows=entry_rows3
#include "lib/activation.wgsl"

// Rows [first, first + RPW) of the gated pair: each subgroup RS rows of the gate and the same
// rows of the up projection per pass (2 * RS row streams, every load issued before the
// arithmetic), then my2 = act of the two totals.
fn glu_rows(first: u32, rows: u32, at: u32, lane: u32, sgs: u32, sg: u32, nsg: u32) {
    let units = mp.cols / 8u;
    for (var r0 = sg * RS; r0 < RPW; r0 += nsg * RS) {
        let row0 = first + r0;
        if (row0 >= rows) {
            break;
        }
        var gacc: array<f32, MAX_RS>;
        var uacc: array<f32, MAX_RS>;
        var u = lane;
        for (; u + sgs < units; u += 2u * sgs) {
            let v = u + sgs;
            let a0 = mx4[2u * u];
            let b0 = mx4[2u * u + 1u];
            let a1 = mx4[2u * v];
            let b1 = mx4[2u * v + 1u];
            var g0: array<vec4<u32>, MAX_RS>;
            var g1: array<vec4<u32>, MAX_RS>;
            var u0: array<vec4<u32>, MAX_RS>;
            var u1: array<vec4<u32>, MAX_RS>;
            for (var i = 0u; i < RS; i++) {
                let rb = min(row0 + i, rows - 1u) * units;
                g0[i] = mw2[rb + u];
                g1[i] = mw2[rb + v];
                u0[i] = mw3[rb + u];
                u1[i] = mw3[rb + v];
            }
            for (var i = 0u; i < RS; i++) {
                gacc[i] += unit_dot(g0[i], a0, b0) + unit_dot(g1[i], a1, b1);
                uacc[i] += unit_dot(u0[i], a0, b0) + unit_dot(u1[i], a1, b1);
            }
        }
        if (u < units) {
            let a0 = mx4[2u * u];
            let b0 = mx4[2u * u + 1u];
            for (var i = 0u; i < RS; i++) {
                let rb = min(row0 + i, rows - 1u) * units;
                gacc[i] += unit_dot(mw2[rb + u], a0, b0);
                uacc[i] += unit_dot(mw3[rb + u], a0, b0);
            }
        }
        for (var i = 0u; i < RS; i++) {
            let gt = subgroupAdd(gacc[i]);
            let ut = subgroupAdd(uacc[i]);
            if (lane == 0u && row0 + i < rows) {
                my2[at + row0 + i] = glu_act(gt, ut, mp.glu - 1u, mp.beta, mp.linear_beta);
            }
        }
    }
}

@compute @workgroup_size(WGM)
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
    let at = mp.row_offset[e];
    switch e {
        case 0u: {
            entry_rows0(first, rows, at, lane, sgs, sg, nsg);
        }
        case 1u: {
            entry_rows1(first, rows, at, lane, sgs, sg, nsg);
        }
        case 2u: {
            if (mp.glu != 0u) {
                glu_rows(first, rows, at, lane, sgs, sg, nsg);
            } else {
                entry_rows2(first, rows, at, lane, sgs, sg, nsg);
            }
        }
        default: {
            entry_rows3(first, rows, at, lane, sgs, sg, nsg);
        }
    }
}
