// Block AttnRes's two decode passes on subgroups (attn_res.wgsl's attn_res_sums and attn_res_mix
// otherwise; the same layout and formulas, attn_res.wgsl's header): the sums' workgroup totals by
// subgroupAdd and one barrier instead of a tree of eight; the mix's softmax and mean square by
// the first subgroup alone, lane j holding source j (subgroups of at least n lanes,
// host-checked), with subgroup reductions instead of five barriers and serial loops.

#include "lib/attn_res_common.wgsl"

// Per-subgroup totals of the sums pass (at most WG / 8 subgroups).
var<workgroup> sg_part: array<vec2<f32>, 32>;

@compute @workgroup_size(256)
fn attn_res_sums_sg(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(num_subgroups) nsg: u32,
) {
    let slot = sums_slot(wg);
    if (slot.w == 0u) {
        return;
    }
    let s = sums_share(slot.x, slot.y, slot.z, lid);
    let g = subgroupAdd(s.x);
    let dq = subgroupAdd(s.y);
    if (lane == 0u) {
        sg_part[sg] = vec2<f32>(g, dq);
    }
    workgroupBarrier();
    if (lid == 0u) {
        var total = vec2<f32>(0.0);
        for (var k = 0u; k < nsg; k++) {
            total += sg_part[k];
        }
        store_sums(slot.x, slot.y, slot.z, total.x, total.y);
    }
}

// The softmax weights into `weights` (alpha[t, :] too when `write_alpha`) from the partial
// totals at red[tot..], by subgroup 0 (lane j: source j); returns the mix's inverse RMS (1
// without `norm`). Called from uniform control flow (one barrier).
fn mix_weights_sg(t: u32, lane: u32, sg: u32, tot: u32, write_alpha: bool) -> f32 {
    let n = p.n_bank + 1u;
    if (sg == 0u) {
        let in_use = lane < n;
        let j = min(lane, n - 1u);
        let gram = tot + n + j * (j + 1u) / 2u;
        let diag = red[gram + j];
        let score = select(-3.40282347e38, red[tot + j] * inverseSqrt(diag / f32(p.d) + p.eps), in_use);
        let e = select(0.0, exp(score - subgroupMax(score)), in_use);
        let w = e / subgroupAdd(e);
        // The mix's mean square from the Gram matrix (attn_res.wgsl's mix_weights).
        var row = 0.0;
        for (var k = 0u; k < n; k++) {
            let wk = subgroupShuffle(w, k);
            if (k < j) {
                row += wk * red[gram + k];
            }
        }
        let hh = subgroupAdd(select(0.0, w * (2.0 * row + w * diag), in_use));
        if (in_use) {
            weights[lane] = w;
            if (write_alpha) {
                alpha[t * n + lane] = w;
            }
        }
        if (lane == 0u) {
            weights[MAX_SOURCES] = inverseSqrt(max(hh, 0.0) / f32(p.d) + p.eps);
        }
    }
    workgroupBarrier();
    return select(1.0, weights[MAX_SOURCES], p.norm != 0u);
}

@compute @workgroup_size(256)
fn attn_res_mix_sg(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(subgroup_id) sg: u32,
) {
    let t = wg.y;
    if (t >= p.tokens) {
        return;
    }
    let i = min(wg.x * WG + lid, p.d - 1u);
    let f = prefetch(t, i);
    let tot = partial_totals(t, lid, WG);
    let inv = mix_weights_sg(t, lane, sg, tot, wg.x == 0u);
    let o = mix_column(f, t, i, inv);
    if (wg.x * WG + lid < p.d) {
        out[t * p.d + i] = o;
    }
}
