// One token's MoE expert selection (spec 6.2), shared by router_select (router.wgsl) and the
// MoE decode's projection pass (gemv_multi.wgsl's route entry):
//   s = sigmoid(logit); b = s + bias (selection only); optional group limit (group score =
//   sum of the top-2 b in the group, keep topk_group groups, others -inf); the top_k of b in
//   rank order (ties toward the lower expert id); weights s[choice], renormalised when
//   `renormalize` (and top_k > 1), times `scaling`.
// The includer defines RP_WG (the threads that take part: invocations at or past it only
// meet the barriers), router_logit(i), router_bias(i) and router_emit(k, expert, weight).
// Preconditions (host-checked): experts <= MAX_E; experts % n_group == 0; n_group <= RP_WG
// under a group limit; top_k <= min(experts, 64).

struct RouterPick {
    experts: u32,
    top_k: u32,
    n_group: u32,
    topk_group: u32,
    renormalize: u32,
    scaling: f32,
}

const MAX_E: u32 = 1024u;
const NEG_INF: f32 = -3.40282347e38;

var<workgroup> score: array<f32, MAX_E>;  // unbiased sigmoid scores
var<workgroup> key: array<f32, MAX_E>;    // selection keys; taken entries marked in `taken`
var<workgroup> taken: array<u32, MAX_E>;
var<workgroup> best_v: array<f32, RP_WG>;
var<workgroup> best_i: array<u32, RP_WG>;
var<workgroup> gscore: array<f32, RP_WG>;
var<workgroup> chosen: array<u32, 64>;

// Whether entry (va, a) comes before (vb, b) in rank order: larger key, then lower index;
// padding (index >= n) after everything.
fn ranks_before(va: f32, a: u32, vb: f32, b: u32, n: u32) -> bool {
    if ((a >= n) != (b >= n)) {
        return b >= n;
    }
    return va > vb || (va == vb && a < b);
}

fn better(v: f32, i: u32, bv: f32, bi: u32) -> bool {
    return v > bv || (v == bv && i < bi);
}

// Index of the largest entry of `key` not yet taken (ties to the lower index); `first` is
// lid, or past every loop bound for the invocations that do not take part.
fn argmax(lid: u32, first: u32, n: u32, stride: u32, use_group: bool) -> u32 {
    var bv = NEG_INF;
    var bi = 0xffffffffu;
    for (var i = first; i < n; i += RP_WG) {
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
    if (lid < RP_WG) {
        best_v[lid] = bv;
        best_i[lid] = bi;
    }
    workgroupBarrier();
    for (var s = RP_WG / 2u; s > 0u; s = s >> 1u) {
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

// Called by every invocation of the workgroup, in uniform control flow.
fn router_pick(lid: u32, rp: RouterPick) {
    let n = rp.experts;
    let first = select(0xfffffff0u, lid, lid < RP_WG);
    for (var i = first; i < n; i += RP_WG) {
        let s = sigmoid(router_logit(i));
        score[i] = s;
        key[i] = s + router_bias(i);
        taken[i] = 0u;
    }
    workgroupBarrier();
    if (rp.n_group > 1u && rp.topk_group < rp.n_group) {
        // Group limit: score each group by its top-2 keys, keep topk_group groups.
        let per = n / rp.n_group;
        for (var g = first; g < rp.n_group; g += RP_WG) {
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
        for (var k = 0u; k < rp.topk_group; k++) {
            let g = argmax(lid, first, rp.n_group, per, true);
            if (lid == 0u) {
                taken[g * per] = 2u;
            }
            workgroupBarrier();
        }
        for (var i = first; i < n; i += RP_WG) {
            if (taken[(i / per) * per] != 2u) {
                key[i] = NEG_INF;
                taken[i] = 1u;
            }
        }
        workgroupBarrier();
        for (var i = first; i < n; i += RP_WG) {
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
    for (var i = first; i < size; i += RP_WG) {
        if (i >= n || taken[i] != 0u) {
            key[i] = NEG_INF;
        }
        taken[i] = i;
    }
    workgroupBarrier();
    for (var k = 2u; k <= size; k = k << 1u) {
        for (var j = k >> 1u; j > 0u; j = j >> 1u) {
            // One compare-exchange per pair (i, i + j): pair q has i = 2q - (q mod j).
            for (var q = first; q < size / 2u; q += RP_WG) {
                let i = 2u * q - (q & (j - 1u));
                let l = i + j;
                let a = taken[i];
                let b = taken[l];
                let a_first = ranks_before(key[i], a, key[l], b, n);
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
    if (lid < rp.top_k) {
        let e = taken[lid];
        chosen[lid] = e;
        best_v[lid] = score[e];
    }
    workgroupBarrier();
    if (lid < rp.top_k) {
        var sum = 0.0;
        for (var k = 0u; k < rp.top_k; k++) {
            sum += best_v[k];
        }
        let norm = select(1.0, 1.0 / (sum + 1e-20), rp.renormalize != 0u && rp.top_k > 1u);
        router_emit(lid, chosen[lid], best_v[lid] * norm * rp.scaling);
    }
}
