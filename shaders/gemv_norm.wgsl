// bf16 GEMV of an RMS-normed input: y (+)= W (x * rsqrt(mean(x^2) + eps) * gamma), gamma bf16,
// plus an optional second product W_b x_b over the same rows (cols_b > 0; x_b in global memory)
// and an optional addend vector (has_addend: a product computed elsewhere, summed in here).
// Decode's LatentMoE runs its latent RMSNorm, up-projection and shared-expert down-projection
// (both add into the residual) as this one dispatch: the separate norm cost a dependent
// dispatch plus a ~7 us body per layer on an H200, and two short GEMVs two ramps and tails. Every
// workgroup normalises x itself into workgroup memory (cols <= 4 * MAX_XV and cols % 8 == 0,
// host-checked; 14 KB of reads per workgroup at the K3.1 latent width), then runs the rows of
// gemv_multi (RS rows per subgroup pass, RPW rows per workgroup) on it.
// Grid: ceil(rows / RPW) workgroups (folded 2-D past 65535).

struct NormGemvParams {
    rows: u32,
    cols: u32,
    row_offset: u32,
    accumulate: u32,
    eps: f32,
    cols_b: u32,
    has_addend: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: NormGemvParams;
@group(0) @binding(1) var<storage, read> x4: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> w4: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read> gamma: array<vec2<u32>>;
@group(0) @binding(5) var<storage, read> w4b: array<vec4<u32>>;
@group(0) @binding(6) var<storage, read> x4b: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read> addend: array<f32>;

#include "lib/store_y.wgsl"
#include "lib/bf16_unit.wgsl"

override RS: u32 = 2u;
override RPW: u32 = 16u;
const MAX_RS: u32 = 4u;
const MAX_XV: u32 = 1024u;
// Workgroup size (>= 256).
override WGN: u32 = 256u;
const XPT: u32 = MAX_XV / 256u; // x vec4 per thread in the prologue, at most

var<workgroup> xs: array<vec4<f32>, MAX_XV>;
var<workgroup> sg_sums: array<f32, 256>;

// The second product's width, as the rows' include reads it (`pb.cols`).
struct SecondCols {
    cols: u32,
}
var<private> pb: SecondCols;

// Adds the second product to the row the first one stored (the same lane stored it: both
// passes walk the rows in the same order).
fn add_y(i: u32, v: f32) {
    y[i] += v;
}

// The first product's store, with the addend where there is one. (A branch, not `select`:
// without an addend its binding is a placeholder shorter than the rows.)
fn store_first(i: u32, v: f32) {
    var a = 0.0;
    if (p.has_addend != 0u) {
        a = addend[i];
    }
    store_y(i, v + a);
}

#include "lib/gemv_multi_rows.wgsl" MW=w4 STORE=store_first mx4=xs mp=p entry_rows=normed_rows
#include "lib/gemv_multi_rows.wgsl" MW=w4b STORE=add_y mx4=x4b mp=pb entry_rows=second_rows

@compute @workgroup_size(WGN)
fn gemv_bf16_sg_normed(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(subgroup_size) sgs: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(num_subgroups) nsg: u32,
    @builtin(local_invocation_index) lid: u32,
) {
    // Every load of x and gamma issued before any use: a strided loop waited on each in turn
    // (the first version of this kernel spent ~6 us per call on that latency).
    let nv = p.cols / 4u;
    var xv: array<vec4<f32>, XPT>;
    var gw: array<vec2<u32>, XPT>;
    let steps = (MAX_XV + WGN - 1u) / WGN;
    for (var j = 0u; j < steps; j++) {
        let i = min(lid + WGN * j, nv - 1u);
        xv[j] = x4[i];
        gw[j] = gamma[i];
    }
    var ss = 0.0;
    for (var j = 0u; j < steps; j++) {
        ss += select(0.0, dot(xv[j], xv[j]), lid + WGN * j < nv);
    }
    ss = subgroupAdd(ss);
    if (lane == 0u) {
        sg_sums[sg] = ss;
    }
    workgroupBarrier();
    var total = 0.0;
    for (var s = 0u; s < nsg; s++) {
        total += sg_sums[s];
    }
    let inv = inverseSqrt(total / f32(p.cols) + p.eps);
    for (var j = 0u; j < steps; j++) {
        let g = gw[j];
        let gv = vec4<f32>(bitcast<f32>(g.x << 16u), bitcast<f32>(g.x & 0xffff0000u), bitcast<f32>(g.y << 16u), bitcast<f32>(g.y & 0xffff0000u));
        if (lid + WGN * j < nv) {
            xs[lid + WGN * j] = xv[j] * inv * gv;
        }
    }
    workgroupBarrier();
    let first = (wg.x + wg.y * nwg.x) * RPW;
    normed_rows(first, p.rows, p.row_offset, lane, sgs, sg, nsg);
    if (p.cols_b > 0u) {
        pb = SecondCols(p.cols_b);
        second_rows(first, p.rows, p.row_offset, lane, sgs, sg, nsg);
    }
}
