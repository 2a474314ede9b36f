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

// Records the invocation's subgroup builtins in the private sg_* (entry points call it first).
fn set_subgroup(sid: u32, ssz: u32, sgi: u32, nsg: u32) {
    sg_lane = sid;
    sg_size = ssz;
    sg_id = sgi;
    sg_num = nsg;
    sg_vi = sgi * ssz + sid;
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
    set_subgroup(sid, ssz, sgi, nsg);
    let row = row_of(wg, nwg);
    if (row >= p.n_rows) {
        return;
    }
    let valid = valid_len(row);
    let base = wg.x * CHUNK;
    let keys = gather_keys(row, base, valid, lid);
    if (valid <= p.k) {
        select_all_valid(row, base, valid, lid, wg.x == 0u, keys);
        return;
    }
    // Every workgroup finds b1 (the bin of the k-th key) and need1 (keys still taken from it)
    // in the digit-1 histogram (its loads in flight with the scores): no last-workgroup step in
    // topk_hist.
    let off = row * HSTRIDE;
    let r1 = find_bin_global(off, p.k, lid);
    let b1 = r1.x;
    let off2 = off + BINS;
    let masks = classify_digit1(keys, base, valid, lid, b1, off2);
    // Slots within the workgroup (both counts <= CHUNK: selected in the low 16 bits,
    // candidates above), then the workgroup's two reservations, from threads of different
    // subgroups, in flight together.
    let sc = slots(countOneBits(masks.x) | (countOneBits(masks.y) << 16u), 0u);
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
    write_classified(row, ctl[3] + (sc & 0xffffu), row * p.row_len + ctl[4] + (sc >> 16u), keys, masks, base, lid);
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
    var c = load_cands(cbase, 0u, ncand, lid);
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
        let m = classify_digit2(c, i0, ncand, lid, b2, small);
        let s = slots(countOneBits(m.x) | (countOneBits(m.y) << 16u), 1u);
        write_walk(row, outo + (s & 0xffffu), s >> 16u, c, m);
        i0 += WG * RI;
        if (i0 >= ncand) {
            break;
        }
        c = load_cands(cbase, i0, ncand, lid);
    }
    // The barrier publishes the boundary set. need1 - need2 keys were selected above b2.
    workgroupBarrier();
    finish_boundary(row, lid, nb, ncand, small, r2.y, p.k - r2.y, b1, b2);
}

// topk_small: a row of at most WG * SMALL_N positions in ONE workgroup and one dispatch (decode at
// short contexts, where topk_hist + topk_gather's dependent global round trips cost more than
// the select itself). Exact radix select of the k largest composites (key, ~position) in
// 8-bit digits over workgroup histograms, from the top (key bits 31..0, then ~position bits
// 15..0), stopping as soon as the bin holding the k-th composite is taken whole (at the latest
// on the last digit, where composites are unique). Same outputs as topk_gather (sel / sel_score
// in no particular order, or the list topk_rank orders). Grid (1, rows); row_len <= WG * SMALL_N.
const SMALL_ITEMS: u32 = 8u; // WG * SMALL_ITEMS positions at most (the host's TOPK_SMALL_MAX)
// Items per thread this pipeline loads (<= SMALL_ITEMS): 4 for rows up to 4096 (8 cost rows of
// 2K positions ~2 us on the H200), 8 beyond; row_len <= WG * SMALL_N.
override SMALL_N: u32 = 8u;

fn small_digit(dg: u32, key: u32, pos: u32) -> u32 {
    if (dg < 4u) {
        return (key >> (24u - 8u * dg)) & 0xffu;
    }
    return (~pos >> (8u * (5u - dg))) & 0xffu;
}

@compute @workgroup_size(WG)
fn topk_small(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32,
              @builtin(subgroup_invocation_id) sid: u32, @builtin(subgroup_size) ssz: u32, @builtin(subgroup_id) sgi: u32,
              @builtin(num_subgroups) nsg: u32) {
    set_subgroup(sid, ssz, sgi, nsg);
    let row = row_of(wg, nwg);
    if (row >= p.n_rows) {
        return;
    }
    let valid = valid_len(row);
    if (valid <= p.k) {
        // valid <= k <= 2048: the first ITEMS keys per thread hold the row.
        select_all_valid(row, 0u, valid, lid, true, gather_keys(row, 0u, valid, lid));
        return;
    }
    if (lid == 0u) {
        atomicStore(&wcnt[0], 0u);
    }
    // Per thread, bit i: item i (position i * WG + lid) still in the k-th composite's bin
    // (live) or taken (chosen).
    var keys: array<u32, SMALL_ITEMS>;
    var live = 0u;
    var chosen = 0u;
    for (var i = 0u; i < SMALL_N; i++) {
        keys[i] = score_key(row, min(i * WG + lid, valid - 1u));
        if (i * WG + lid < valid) {
            live |= 1u << i;
        }
    }
    var need = p.k;
    for (var dg = 0u; dg < 6u; dg++) {
        for (var b = lid; b < 256u; b += WG) {
            atomicStore(&lh8[b], 0u);
        }
        workgroupBarrier();
        for (var i = 0u; i < SMALL_N; i++) {
            if ((live & (1u << i)) != 0u) {
                atomicAdd(&lh8[small_digit(dg, keys[i], i * WG + lid)], 1u);
            }
        }
        workgroupBarrier();
        // (bin, composites still needed from it, composites in it), workgroup-uniform.
        let r = find_bin_local(need, lid);
        for (var i = 0u; i < SMALL_N; i++) {
            if ((live & (1u << i)) != 0u) {
                let d = small_digit(dg, keys[i], i * WG + lid);
                if (d > r.x) {
                    chosen |= 1u << i;
                }
                if (d != r.x) {
                    live &= ~(1u << i);
                }
            }
        }
        need = r.y;
        if (r.y == r.z) {
            chosen |= live;
            break;
        }
    }
    var o = slots(countOneBits(chosen), 0u);
    for (var i = 0u; i < SMALL_N; i++) {
        if ((chosen & (1u << i)) != 0u) {
            put(row, o, keys[i], i * WG + lid);
            o += 1u;
        }
    }
}

#include "lib/topk_rank.wgsl"
