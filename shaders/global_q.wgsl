// A global layer's decode step after its first projection pass, in one dispatch (it was two
// dependent ones: `global_prep`, then the query projections): one token,
//   workgroup 0: the latent cache row (lib/global_rows.wgsl);
//   workgroup 1: the index-key cache row (k_n = 0: no indexer, nothing to do);
//   the others: q = W_a RMSNorm(c_q; g_q) and qI = W_b RMSNorm(c_q; g_q) (q_b and the
//   indexer's wq_b, bf16 [rows, q_n]), each workgroup normalising c_q into workgroup memory
//   itself and running RPW rows of one matrix as gemv_multi.wgsl does.
// Preconditions (host-checked): as global_prep.wgsl; q_n % 8 == 0 and q_n <= 4 * MAX_XQ; c_q
// and g_q hold q_n f32; one token.

struct GlobalQParams {
    q_n: u32,
    kv_width: u32,
    kv_n: u32,
    kv_row: u32,
    k_n: u32,
    k_row: u32,
    eps: f32,
    k_eps: f32,
    rows_a: u32,
    rows_b: u32,
    blocks_a: u32,
    _pad: u32,
}

// The workgroup size (lib/wg_sum.wgsl and lib/global_rows.wgsl stride by it).
const WG: u32 = 512u;

@group(0) @binding(0) var<uniform> p: GlobalQParams;
@group(0) @binding(1) var<storage, read> cq4: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> g_q4: array<vec4<f32>>;
@group(0) @binding(10) var<storage, read> w_a: array<vec4<u32>>;
@group(0) @binding(11) var<storage, read> w_b: array<vec4<u32>>;
@group(0) @binding(12) var<storage, read_write> y_a: array<f32>;
@group(0) @binding(13) var<storage, read_write> y_b: array<f32>;

#include "lib/wg_sum.wgsl"
#include "lib/bf16_bits.wgsl"
#include "lib/global_rows.wgsl"
#include "lib/bf16_unit.wgsl"

override RS: u32 = 2u;
override RPW: u32 = 32u;
const MAX_RS: u32 = 4u;
// c_q as normed vec4 (q_n <= 4 * MAX_XQ).
const MAX_XQ: u32 = 512u;
var<workgroup> xs: array<vec4<f32>, MAX_XQ>;
var<workgroup> sg_sums: array<f32, WG>;

// The rows' include reads the width as `qc.cols`.
struct QCols {
    cols: u32,
}
var<private> qc: QCols;

fn store_a(i: u32, v: f32) {
    y_a[i] = v;
}
fn store_b(i: u32, v: f32) {
    y_b[i] = v;
}
#include "lib/gemv_multi_rows.wgsl" MW=w_a STORE=store_a mx4=xs mp=qc entry_rows=rows_a
#include "lib/gemv_multi_rows.wgsl" MW=w_b STORE=store_b mx4=xs mp=qc entry_rows=rows_b

@compute @workgroup_size(512)
fn global_q_proj(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(subgroup_size) sgs: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(num_subgroups) nsg: u32,
) {
    let b = wg.x + wg.y * nwg.x;
    if (b == 0u) {
        latent_row(lid);
        return;
    }
    if (b == 1u) {
        if (p.k_n > 0u) {
            key_row(lid);
        }
        return;
    }
    // c_q's RMSNorm into workgroup memory: every load issued before any use.
    let nv = p.q_n / 4u;
    var xv: array<vec4<f32>, MAX_XQ / WG>;
    var gv: array<vec4<f32>, MAX_XQ / WG>;
    for (var j = 0u; j < MAX_XQ / WG; j++) {
        let i = min(lid + WG * j, nv - 1u);
        xv[j] = cq4[i];
        gv[j] = g_q4[i];
    }
    var ss = 0.0;
    for (var j = 0u; j < MAX_XQ / WG; j++) {
        ss += select(0.0, dot(xv[j], xv[j]), lid + WG * j < nv);
    }
    // One subgroup sum and one barrier (wg_sum's tree takes nine).
    ss = subgroupAdd(ss);
    if (lane == 0u) {
        sg_sums[sg] = ss;
    }
    workgroupBarrier();
    var total = 0.0;
    for (var s = 0u; s < nsg; s++) {
        total += sg_sums[s];
    }
    let r = inverseSqrt(total / f32(p.q_n) + p.eps);
    for (var j = 0u; j < MAX_XQ / WG; j++) {
        if (lid + WG * j < nv) {
            xs[lid + WG * j] = xv[j] * r * gv[j];
        }
    }
    workgroupBarrier();
    qc = QCols(p.q_n);
    let blk = b - 2u;
    if (blk < p.blocks_a) {
        rows_a(blk * RPW, p.rows_a, 0u, lane, sgs, sg, nsg);
    } else {
        rows_b((blk - p.blocks_a) * RPW, p.rows_b, 0u, lane, sgs, sg, nsg);
    }
}
