// MoE router selection without group limiting (K3.1's case), with subgroup operations: the
// same results as router.wgsl (top_k of b = sigmoid(logits) + bias in rank order, ties toward
// the lower expert id; weights from the unbiased scores) without its 55-stage bitonic sort
// (~4.9 us per token on an H200). A separate file because a module that uses subgroup
// operations needs the SUBGROUP feature; group-limited routing keeps router.wgsl.
//   1. Each subgroup takes its own top_k: top_k rounds of a subgroup max (ties: the lowest id
//      by a subgroup min), each lane keeping up to EPT entries (expert lid + 256 j).
//   2. Every candidate's rank among all subgroups' candidates is its output slot.
// Preconditions (host-checked): experts <= MAX_E; top_k <= 64; (256 / smallest subgroup size)
// x top_k <= MAX_CAND; no active group limit.

#include "lib/router_io.wgsl"

const WG: u32 = 256u;
const EPT: u32 = MAX_E / WG;
const NONE: u32 = 0xffffffffu;
const MAX_CAND: u32 = 2048u; // subgroups x top_k (host-checked with the smallest subgroup size)

var<workgroup> cand_key: array<f32, MAX_CAND>;
var<workgroup> cand_id: array<u32, MAX_CAND>;

fn better(v: f32, i: u32, bv: f32, bi: u32) -> bool {
    return v > bv || (v == bv && i < bi);
}

@compute @workgroup_size(256)
fn router_select_sg(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(num_subgroups) nsg: u32,
) {
    let t = wg.x + wg.y * nwg.x;
    if (t >= p.tokens) {
        glu_workgroup(t - p.tokens, lid);
        return;
    }
    let n = p.experts;
    var keys: array<f32, EPT>;
    var live: array<bool, EPT>;
    for (var j = 0u; j < EPT; j++) {
        let i = lid + WG * j;
        let s = sigmoid(logits[t * n + min(i, n - 1u)]);
        live[j] = i < n;
        keys[j] = s + bias[min(i, n - 1u)];
        if (i < n) {
            score[i] = s;
        }
    }
    // 1. This subgroup's top_k.
    for (var r = 0u; r < p.top_k; r++) {
        var bv = 0.0;
        var bi = NONE;
        for (var j = 0u; j < EPT; j++) {
            let i = lid + WG * j;
            if (live[j] && (bi == NONE || better(keys[j], i, bv, bi))) {
                bv = keys[j];
                bi = i;
            }
        }
        let has = bi != NONE;
        let m = subgroupMax(select(bitcast<f32>(0xff800000u), bv, has));
        let win = subgroupMin(select(NONE, bi, has && bv == m));
        for (var j = 0u; j < EPT; j++) {
            if (lid + WG * j == win) {
                live[j] = false;
            }
        }
        if (lane == 0u) {
            cand_key[sg * p.top_k + r] = m;
            cand_id[sg * p.top_k + r] = win; // NONE when the subgroup ran out of entries
        }
    }
    workgroupBarrier();
    // 2. Ranks among all candidates.
    let n_cand = nsg * p.top_k;
    for (var c = lid; c < n_cand; c += WG) {
        let ci = cand_id[c];
        if (ci != NONE) {
            let cv = cand_key[c];
            var rank = 0u;
            for (var o = 0u; o < n_cand; o++) {
                let oi = cand_id[o];
                rank += select(0u, 1u, oi != NONE && better(cand_key[o], oi, cv, ci));
            }
            if (rank < p.top_k) {
                chosen[rank] = ci;
            }
        }
    }
    workgroupBarrier();
    write_routing(t, lid);
}
