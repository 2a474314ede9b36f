// Causal top-k of score rows (spec 5.3), the subgroup form of topk.wgsl (same rule, same
// scratch layout, same bindings; the host runs this one where the adapter has subgroups).
// Per row r the positions of the k largest scores among the valid prefix [0, valid) with
// valid = min(pos0 + r + 1, row_len), ordered by score descending then position ascending; all
// valid positions when valid <= k.
//
// Exact radix select over the 64-bit composite (okey(score), ~position): larger composite =
// higher rank, so the rule "score desc, then position asc" is plain descending order and the
// selection is the `k` largest composites. Two dispatches (three for the ordered form):
//   topk_hist     every workgroup (CHUNK positions) builds a workgroup histogram of the top 12
//                 key bits and adds it into the row's global histogram. Nothing else: no done
//                 counter, no last-workgroup step.
//   topk_gather   every workgroup finds from that histogram the bin b1 of the k-th key and
//                 need1 (keys still taken from b1); keys above b1 go straight to the selection,
//                 keys in b1 (the candidates) are listed as (position, key) and histogrammed on
//                 key bits 8..19 in global atomics. The LAST workgroup to finish (a done
//                 counter) refines alone: bin b2 of that histogram (need2 keys still needed),
//                 one walk over the candidate list (keys above b2 selected, keys in b2 - the
//                 boundary set, a handful unless scores tie - copied to workgroup memory; slots
//                 from subgroup sums and one workgroup atomic per subgroup, no barrier), then
//                 the need2 largest composites of the boundary set: ranked directly when it has
//                 at most NB_RANK keys, else radix-selected in workgroup memory (8-bit digits:
//                 key bits 0..7, then ~position byte by byte, stopping as soon as a bin is taken
//                 whole). Rows with valid <= k select every valid position (no atomics at all).
//   topk_rank     (ordered form only) the selection list (exactly min(k, valid) entries,
//                 unordered) is ranked by counting: rank(e) = #{ j : comp_j > comp_e };
//                 writes sel / sel_score in that order, -1 / -inf padded.
// Dependent global round trips (~1.5 us each on the H200) and workgroup barriers (the
// portable 6-barrier scan ~1 us, this file's 2-barrier subgroup scan ~0.6 us) are what cost
// (docs/perf.md), so the critical path has few of each: scores and the histogram load
// together, the refine's candidates and histogram load together, no state reads.
// No workgroup ever waits for another (no spin locks), so it is correct on any adapter
// whatever the scheduling. A boundary set larger than BCAP (massive ties) is radix-selected
// straight from the global candidate list (slower, same result). Needs full subgroups (bins
// are assigned in subgroup order, sg_vi) of at least 4 lanes.
// Scratch (host): hist [n_rows, HSTRIDE], state [n_rows, 16], cand [n_rows, row_len, 2],
// list [n_rows, 2k]; hist and state zero before the first call, and the kernels leave them
// zero (the histograms cleared by the last workgroup of topk_gather, the done counter by the
// workgroup that saw it full). Workgroup memory starts zeroed (WebGPU). 1 <= k <= 2048.

#include "lib/topk_common.wgsl"

// Slots handed to subgroups: [0] topk_gather's classification, [1] the refine's walk
// (selected in the low 16 bits, the others above).
var<workgroup> wcnt: array<atomic<u32>, 2>;

// Invocation lid's place in wg_scan's order: (subgroup id, lane).
fn scan_slot(lid: u32) -> u32 {
    return sg_vi;
}

// Exclusive prefix sum of v over the workgroup in the order (subgroup id, lane) = sg_vi:
// (exclusive prefix, total). Uniform control flow, full subgroups. Subgroup scans, one total
// per subgroup in workgroup memory, two barriers.
var<private> sg_lane: u32;
var<private> sg_size: u32;
var<private> sg_id: u32;
var<private> sg_num: u32;
var<private> sg_vi: u32;
var<workgroup> sgtot: array<u32, 256>; // one per subgroup (subgroups of 4 or more)

fn wg_scan(lid: u32, v: u32) -> vec2<u32> {
    let incl = subgroupInclusiveAdd(v);
    if (sg_lane == sg_size - 1u) {
        sgtot[sg_id] = incl;
    }
    workgroupBarrier();
    var before = 0u;
    var total = 0u;
    for (var j = sg_lane; j < sg_num; j += sg_size) {
        let t = sgtot[j];
        total += t;
        before += select(0u, t, j < sg_id);
    }
    before = subgroupAdd(before);
    total = subgroupAdd(total);
    workgroupBarrier();
    return vec2<u32>(before + incl - v, total);
}

// Counts this workgroup in at the row's done counter: (arrivals before this one, a, b) with
// a and b this workgroup's, all workgroup-uniform; the last of `total` to arrive then sees
// every other workgroup's global writes (storage barriers are device-scope acquire/release)
// and resets the counter.
fn arrive(at: u32, total: u32, lid: u32, a: u32, b: u32) -> vec3<u32> {
    storageBarrier();
    if (lid == 0u) {
        fb = vec4<u32>(atomicAdd(&state[at], 1u), a, b, 0u);
    }
    let r = workgroupUniformLoad(&fb).xyz;
    if (r.x + 1u == total) {
        storageBarrier();
        if (lid == 0u) {
            atomicStore(&state[at], 0u);
        }
    }
    return r;
}

// Subgroup-aggregated slots: v (two 16-bit counts) summed over the workgroup through one
// workgroup atomic per subgroup; this invocation's exclusive offset (any order will do).
fn slots(v: u32, ctr: u32) -> u32 {
    let ex = subgroupExclusiveAdd(v);
    let tot = subgroupAdd(v);
    var b = 0u;
    if (sg_lane == 0u) {
        b = atomicAdd(&wcnt[ctr], tot);
    }
    return subgroupBroadcastFirst(b) + ex;
}


@compute @workgroup_size(WG)
fn topk_gather(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32,
               @builtin(subgroup_invocation_id) sid: u32, @builtin(subgroup_size) ssz: u32, @builtin(subgroup_id) sgi: u32,
               @builtin(num_subgroups) nsg: u32) {
    sg_lane = sid;
    sg_size = ssz;
    sg_id = sgi;
    sg_num = nsg;
    sg_vi = sgi * ssz + sid;
    let row = row_of(wg, nwg);
    if (row >= p.n_rows) {
        return;
    }
    let valid = valid_len(row);
    let base = wg.x * CHUNK;
    var keys: array<u32, ITEMS>;
    for (var i = 0u; i < ITEMS; i++) {
        let idx = base + i * WG + lid;
        keys[i] = score_key(row, min(idx, valid - 1u));
    }
    if (valid <= p.k) {
        // Every valid position is selected, in position order.
        for (var i = 0u; i < ITEMS; i++) {
            let idx = base + i * WG + lid;
            if (idx < valid) {
                put(row, idx, keys[i], idx);
            }
        }
        if (!ORDERED && wg.x == 0u) {
            for (var i = valid + lid; i < p.k; i += WG) {
                sel[row * p.k + i] = -1;
                sel_score[row * p.k + i] = bitcast<f32>(0xff800000u);
            }
        }
        return;
    }
    // Every workgroup finds b1 (the bin of the k-th key) and need1 (keys still taken from it)
    // in the digit-1 histogram (its loads in flight with the scores): no last-workgroup step in
    // topk_hist.
    let off = row * HSTRIDE;
    let r1 = find_bin_global(off, p.k, lid);
    let b1 = r1.x;
    var smask = 0u;
    var cmask = 0u;
    let off2 = off + BINS;
    for (var i = 0u; i < ITEMS; i++) {
        if (base + i * WG + lid < valid) {
            let d = keys[i] >> 20u;
            if (d > b1) {
                smask |= 1u << i;
            } else if (d == b1) {
                cmask |= 1u << i;
                atomicAdd(&hist[off2 + ((keys[i] >> 8u) & 0xfffu)], 1u);
            }
        }
    }
    // Slots within the workgroup (both counts <= CHUNK: selected in the low 16 bits,
    // candidates above), then the workgroup's two reservations, from threads of different
    // subgroups, in flight together.
    let sc = slots(countOneBits(smask) | (countOneBits(cmask) << 16u), 0u);
    workgroupBarrier();
    if (lid == 0u) {
        let ts = atomicLoad(&wcnt[0]) & 0xffffu;
        ctl[3] = 0u;
        if (ts > 0u) {
            ctl[3] = atomicAdd(&state[row * ST + S_COUNT], ts);
        }
    }
    if (lid == 32u) {
        let tc = atomicLoad(&wcnt[0]) >> 16u;
        ctl[4] = 0u;
        if (tc > 0u) {
            ctl[4] = atomicAdd(&state[row * ST + S_CCOUNT], tc);
        }
    }
    workgroupBarrier();
    var o = ctl[3] + (sc & 0xffffu);
    var oc = row * p.row_len + ctl[4] + (sc >> 16u);
    for (var i = 0u; i < ITEMS; i++) {
        let idx = base + i * WG + lid;
        if ((smask & (1u << i)) != 0u) {
            put(row, o, keys[i], idx);
            o += 1u;
        }
        if ((cmask & (1u << i)) != 0u) {
            cand[oc] = vec2<u32>(idx, keys[i]);
            oc += 1u;
        }
    }
    // The candidate count is bin b1's count; k - need1 keys are selected above b1.
    let u = arrive(row * ST + S_DONE2, nwg.x, lid, r1.z, r1.y);
    if (u.x + 1u != nwg.x) {
        return;
    }
    // The refine, in the last workgroup alone. No state is read: the first RI candidates per
    // thread load together with the digit-2 histogram, one round trip.
    let ncand = u.y;
    let need1 = u.z;
    let cbase = row * p.row_len;
    var ck: array<u32, RI>;
    var cp: array<u32, RI>;
    for (var q = 0u; q < RI; q++) {
        let j = q * WG + lid;
        if (j < ncand) {
            let c = cand[cbase + j];
            cp[q] = c.x;
            ck[q] = c.y;
        }
    }
    let r2 = find_bin_global(off2, need1, lid);
    // Every workgroup has read the digit-1 histogram, every thread here the digit-2 one.
    clear_global(off, HSTRIDE, lid);
    let b2 = r2.x;
    let nb = min(r2.z, ncand);
    let small = nb <= BCAP;
    // One walk over the candidates: keys above b2 are selected, the boundary set (keys in b2)
    // is copied to workgroup memory when it fits. RI candidates per thread per step, slots
    // from subgroup sums (no barrier).
    let outo = p.k - need1;
    var i0 = 0u;
    loop {
        var tm = 0u;
        var km = 0u;
        for (var q = 0u; q < RI; q++) {
            if (i0 + q * WG + lid < ncand) {
                let d = (ck[q] >> 8u) & 0xfffu;
                if (d > b2) {
                    tm |= 1u << q;
                } else if (d == b2 && small) {
                    km |= 1u << q;
                }
            }
        }
        let s = slots(countOneBits(tm) | (countOneBits(km) << 16u), 1u);
        var o = outo + (s & 0xffffu);
        var ob = s >> 16u;
        for (var q = 0u; q < RI; q++) {
            if ((tm & (1u << q)) != 0u) {
                put(row, o, ck[q], cp[q]);
                o += 1u;
            }
            if ((km & (1u << q)) != 0u && ob < BCAP) {
                bkey[ob] = ck[q];
                bpos[ob] = cp[q];
                ob += 1u;
            }
        }
        i0 += WG * RI;
        if (i0 >= ncand) {
            break;
        }
        for (var q = 0u; q < RI; q++) {
            let j = i0 + q * WG + lid;
            if (j < ncand) {
                let c = cand[cbase + j];
                cp[q] = c.x;
                ck[q] = c.y;
            }
        }
    }
    // The barrier publishes the boundary set. need1 - need2 keys were selected above b2.
    workgroupBarrier();
    var outo2 = p.k - r2.y;
    let nbu = nb;
    if (nbu <= NB_RANK) {
        // Small boundary set (the usual case): rank each element among the set by composite
        // (unique: positions differ); the need2 highest-ranked go to slots outo + rank.
        if (lid < nbu) {
            let ke = bkey[lid];
            let pe = bpos[lid];
            var r = 0u;
            for (var j = 0u; j < nbu; j++) {
                let kj = bkey[j];
                r += select(0u, 1u, kj > ke || (kj == ke && bpos[j] < pe));
            }
            if (r < r2.y) {
                put(row, outo2 + r, ke, pe);
            }
        }
        return;
    }
    // Radix select of the need2 largest composites of the boundary set: threshold (tk, tl),
    // its top f bits known.
    let n = select(ncand, nbu, nbu <= BCAP);
    var need = r2.y;
    var tk = ((b1 << 12u) | b2) << 8u;
    var tl = 0u;
    var f = 24u;
    var whole = need == nbu;
    while (!whole && f < 64u) {
        if (lid < 256u) {
            atomicStore(&lh8[lid], 0u);
        }
        workgroupBarrier();
        for (var j = lid; j < n; j += WG) {
            let e = boundary(row, j, nbu <= BCAP);
            let lo = ~e.y;
            if (prefix_ok(e.x, lo, f, tk, tl)) {
                atomicAdd(&lh8[digit_of(e.x, lo, f)], 1u);
            }
        }
        workgroupBarrier();
        let r = find_bin_local(need, lid);
        if (f == 24u) {
            tk |= r.x;
        } else {
            tl |= r.x << (56u - f);
        }
        f += 8u;
        need = r.y;
        // A bin taken whole ends it (at the latest the last byte: one element per bin).
        whole = r.y == r.z;
    }
    // Select the boundary elements at or above the threshold: exactly need2 of them.
    let pre = tk >> 8u;
    for (var j0 = 0u; j0 < n; j0 += WG) {
        let j = j0 + lid;
        var take = 0u;
        var e = vec2<u32>(0u, 0u);
        if (j < n) {
            e = boundary(row, j, nbu <= BCAP);
            let lo = ~e.y;
            take = select(0u, 1u, (e.x >> 8u) == pre && (e.x > tk || (e.x == tk && lo >= tl)));
        }
        let s = wg_scan(lid, take);
        if (take != 0u) {
            put(row, outo2 + s.x, e.x, e.y);
        }
        outo2 += s.y;
    }
}

#include "lib/topk_rank.wgsl"
