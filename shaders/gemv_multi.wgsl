// Several bf16 matrices sharing one input vector in one dispatch (decode projections that
// read the same normed hidden state: one pass and one tail instead of several). Same
// per-subgroup scheme as gemv_sg.wgsl. Entry e covers workgroup blocks [start[e], start[e + 1]) of RPW rows of its own
// weight binding and writes its own output at row_offset[e]; unused entries have
// start = 0xffffffff and bind placeholders. With glu != 0 entries 2 and 3 are one gated
// pair: entry 2's blocks cover the rows of both matrices (mw2 the gate, mw3 the up
// projection, the same shape), and my2 gets act(gate x, up x) (the shared experts' activation
// without the dependent dispatch it needed as a separate op). The route entry point (the MoE
// decode's projection pass) also selects the token's experts: entry 0 holds the router
// logits, and the last of its workgroups to finish (a done counter, left zero) runs
// lib/router_pick.wgsl on them while the other entries' workgroups still stream their rows,
// so the selection costs no dependent dispatch. Preconditions (host-checked): cols % 8 == 0;
// for the route entry entry 0 starts at block 0 and the router's bounds hold.

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
    // The route entry's selection (lib/router_pick.wgsl's RouterPick; experts = rows.x).
    top_k: u32,
    n_group: u32,
    topk_group: u32,
    renormalize: u32,
    scaling: f32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
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

// The gated pair: the gate rows' totals wait in workgroup memory for the up rows' (the same
// invocation stores and reads a row's: both passes walk the rows in the same order), then my2
// gets act(gate x, up x). Rows are the workgroup's RPW (<= 64), entry 2 starts at row 0.
var<workgroup> gate_totals: array<f32, 64>;
fn stash_gate(i: u32, v: f32) {
    gate_totals[i % RPW] = v;
}
fn store_glu(i: u32, v: f32) {
    my2[i] = glu_act(gate_totals[i % RPW], v, mp.glu - 1u, mp.beta, mp.linear_beta);
}
#include "lib/gemv_multi_rows.wgsl" MW=mw2 STORE=stash_gate entry_rows=gate_rows
#include "lib/gemv_multi_rows.wgsl" MW=mw3 STORE=store_glu entry_rows=up_rows

fn multi_rows(block: u32, lane: u32, sgs: u32, sg: u32, nsg: u32) {
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
                gate_rows(first, rows, at, lane, sgs, sg, nsg);
                up_rows(first, rows, at, lane, sgs, sg, nsg);
            } else {
                entry_rows2(first, rows, at, lane, sgs, sg, nsg);
            }
        }
        default: {
            entry_rows3(first, rows, at, lane, sgs, sg, nsg);
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
    multi_rows(wg.x + wg.y * nwg.x, lane, sgs, sg, nsg);
}

@group(0) @binding(10) var<storage, read> route_bias: array<f32>;
@group(0) @binding(11) var<storage, read_write> route_idx: array<u32>;
@group(0) @binding(12) var<storage, read_write> route_wts: array<f32>;
@group(0) @binding(13) var<storage, read_write> route_done: array<atomic<u32>>;

const RP_WG: u32 = 256u;
// The logits as entry 0 stored them (other workgroups' stores: read after the done counter).
fn router_logit(i: u32) -> f32 {
    return my0[i];
}
fn router_bias(i: u32) -> f32 {
    return route_bias[i];
}
fn router_emit(k: u32, e: u32, w: f32) {
    route_idx[k] = e;
    route_wts[k] = w;
}
#include "lib/router_pick.wgsl"

var<workgroup> route_last: u32;

@compute @workgroup_size(WGM)
fn gemv_bf16_sg_multi_route(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(subgroup_size) sgs: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(num_subgroups) nsg: u32,
    @builtin(local_invocation_index) lid: u32,
) {
    let block = wg.x + wg.y * nwg.x;
    multi_rows(block, lane, sgs, sg, nsg);
    if (block >= mp.start.y) {
        return;
    }
    // Storage barriers are device-scope acquire/release: the last workgroup to count itself
    // in sees every other router workgroup's logits. Nothing in this dispatch loads them
    // before that (a read-write binding's loads may hit an SM's L1, which would keep lines
    // loaded earlier: the twentieth session's absorb-in-pass went wrong on the H200 that way).
    storageBarrier();
    if (lid == 0u) {
        route_last = select(0u, 1u, atomicAdd(&route_done[0], 1u) + 1u == mp.start.y);
    }
    if (workgroupUniformLoad(&route_last) == 0u) {
        return;
    }
    storageBarrier();
    if (lid == 0u) {
        atomicStore(&route_done[0], 0u);
    }
    router_pick(lid, RouterPick(mp.rows.x, mp.top_k, mp.n_group, mp.topk_group, mp.renormalize, mp.scaling));
}
