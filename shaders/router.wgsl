// MoE router selection (spec 6.2), one workgroup per token, decided on the GPU:
//   s = sigmoid(logits); b = s + bias (selection only); optional group limit (group score =
//   sum of the top-2 b in the group, keep topk_group groups, others -inf); idx = top_k of b
//   in rank order (ties toward the lower expert id); wts = s[idx], renormalised when
//   `renormalize` (and top_k > 1), times `scaling`.
// Workgroups past the tokens compute glu_out = glu_act(gate, up) for glu_n elements (the
// shared experts' gated activation, which reads the same projection pass as the router: one
// dependent dispatch less per MoE layer); glu_n = 0 binds placeholders.
// Preconditions (host-checked): experts <= MAX_E; experts % n_group == 0; top_k <= experts.
// logits: [tokens, experts] f32; bias: [experts] f32; idx: [tokens, top_k] u32; wts: same f32.

struct RouterParams {
    tokens: u32,
    experts: u32,
    top_k: u32,
    n_group: u32,
    topk_group: u32,
    renormalize: u32,
    scaling: f32,
    glu_n: u32,
    act: u32,
    beta: f32,
    linear_beta: f32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: RouterParams;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read> bias: array<f32>;
@group(0) @binding(3) var<storage, read_write> idx: array<u32>;
@group(0) @binding(4) var<storage, read_write> wts: array<f32>;
@group(0) @binding(5) var<storage, read> glu_gate: array<f32>;
@group(0) @binding(6) var<storage, read> glu_up: array<f32>;
@group(0) @binding(7) var<storage, read_write> glu_out: array<f32>;

#include "lib/activation.wgsl"

const WG: u32 = 256u;
const MAX_E: u32 = 1024u;
const NEG_INF: f32 = -3.40282347e38;

var<workgroup> score: array<f32, MAX_E>;  // unbiased sigmoid scores
var<workgroup> key: array<f32, MAX_E>;    // selection keys; taken entries marked in `taken`
var<workgroup> taken: array<u32, MAX_E>;
var<workgroup> best_v: array<f32, WG>;
var<workgroup> best_i: array<u32, WG>;
var<workgroup> gscore: array<f32, WG>;
var<workgroup> chosen: array<u32, 64>;

// Whether entry (va, a) comes before (vb, b) in rank order: larger key, then lower index;
// padding (index >= experts) after everything.
fn ranks_before(va: f32, a: u32, vb: f32, b: u32) -> bool {
    if ((a >= p.experts) != (b >= p.experts)) {
        return b >= p.experts;
    }
    return va > vb || (va == vb && a < b);
}

fn better(v: f32, i: u32, bv: f32, bi: u32) -> bool {
    return v > bv || (v == bv && i < bi);
}

// Index of the largest entry of `key` not yet taken (ties to the lower index).
fn argmax(lid: u32, n: u32, stride: u32, use_group: bool) -> u32 {
    var bv = NEG_INF;
    var bi = 0xffffffffu;
    for (var i = lid; i < n; i += WG) {
        var v: f32;
        var ok: bool;
        if (use_group) {
            v = gscore[i];
            ok = taken[i * stride] != 2u;
        } else {
            v = key[i];
            ok = taken[i] == 0u;
        }
        if (ok && (bi == 0xffffffffu || better(v, i, bv, bi))) {
            bv = v;
            bi = i;
        }
    }
    best_v[lid] = bv;
    best_i[lid] = bi;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if (lid < s) {
            let oi = best_i[lid + s];
            if (oi != 0xffffffffu && (best_i[lid] == 0xffffffffu || better(best_v[lid + s], oi, best_v[lid], best_i[lid]))) {
                best_v[lid] = best_v[lid + s];
                best_i[lid] = oi;
            }
        }
        workgroupBarrier();
    }
    let r = best_i[0];
    workgroupBarrier();
    return r;
}

@compute @workgroup_size(256)
fn router_select(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wg.x + wg.y * nwg.x;
    if (t >= p.tokens) {
        let i = (t - p.tokens) * WG + lid;
        if (i < p.glu_n) {
            glu_out[i] = glu_act(glu_gate[i], glu_up[i], p.act, p.beta, p.linear_beta);
        }
        return;
    }
    let n = p.experts;
    for (var i = lid; i < n; i += WG) {
        let s = sigmoid(logits[t * n + i]);
        score[i] = s;
        key[i] = s + bias[i];
        taken[i] = 0u;
    }
    workgroupBarrier();
    if (p.n_group > 1u && p.topk_group < p.n_group) {
        // Group limit: score each group by its top-2 keys, keep topk_group groups.
        let per = n / p.n_group;
        for (var g = lid; g < p.n_group; g += WG) {
            var m1 = NEG_INF;
            var m2 = NEG_INF;
            for (var i = g * per; i < (g + 1u) * per; i++) {
                let v = key[i];
                if (v > m1) {
                    m2 = m1;
                    m1 = v;
                } else if (v > m2) {
                    m2 = v;
                }
            }
            gscore[g] = select(m1 + m2, m1, per == 1u);
        }
        workgroupBarrier();
        // Mark kept groups' first entry with 2 (chosen), then drop the others.
        for (var k = 0u; k < p.topk_group; k++) {
            let g = argmax(lid, p.n_group, per, true);
            if (lid == 0u) {
                taken[g * per] = 2u;
            }
            workgroupBarrier();
        }
        for (var i = lid; i < n; i += WG) {
            if (taken[(i / per) * per] != 2u) {
                key[i] = NEG_INF;
                taken[i] = 1u;
            }
        }
        workgroupBarrier();
        for (var i = lid; i < n; i += WG) {
            if (taken[i] == 2u) {
                taken[i] = 0u;
            }
        }
        workgroupBarrier();
    }
    // Rank order by one bitonic sort of (key desc, index asc) over the next power of two
    // (16 rounds of a workgroup argmax took ~31 us per token on the H200). Taken entries
    // (dropped groups) and the padding sort last.
    var size = 1u;
    while (size < n) {
        size = size << 1u;
    }
    // `taken` is done with once folded into the keys: it holds the sort's index order.
    for (var i = lid; i < size; i += WG) {
        if (i >= n || taken[i] != 0u) {
            key[i] = NEG_INF;
        }
        taken[i] = i;
    }
    workgroupBarrier();
    for (var k = 2u; k <= size; k = k << 1u) {
        for (var j = k >> 1u; j > 0u; j = j >> 1u) {
            // One compare-exchange per pair (i, i + j): pair q has i = 2q - (q mod j).
            for (var q = lid; q < size / 2u; q += WG) {
                let i = 2u * q - (q & (j - 1u));
                let l = i + j;
                let a = taken[i];
                let b = taken[l];
                let a_first = ranks_before(key[i], a, key[l], b);
                // Blocks with (i & k) == 0 end best-first, the others worst-first.
                if (a_first != ((i & k) == 0u)) {
                    let kv = key[i];
                    key[i] = key[l];
                    key[l] = kv;
                    taken[i] = b;
                    taken[l] = a;
                }
            }
            workgroupBarrier();
        }
    }
    // Thread k < top_k writes choice k; each sums the chosen scores in the same order.
    if (lid < p.top_k) {
        let e = taken[lid];
        chosen[lid] = e;
        best_v[lid] = score[e];
    }
    workgroupBarrier();
    if (lid < p.top_k) {
        var sum = 0.0;
        for (var k = 0u; k < p.top_k; k++) {
            sum += best_v[k];
        }
        let norm = select(1.0, 1.0 / (sum + 1e-20), p.renormalize != 0u && p.top_k > 1u);
        idx[t * p.top_k + lid] = chosen[lid];
        wts[t * p.top_k + lid] = best_v[lid] * norm * p.scaling;
    }
}
