// The portable form (no subgroups); topk_sg.wgsl is the same algorithm with subgroup scans and
// barrier-free slots, run wherever the adapter has subgroups (same scratch and bindings).
// Causal top-k of score rows (spec 5.3): per row r the positions of the k largest scores among
// the valid prefix [0, valid) with valid = min(pos0 + r + 1, row_len), ordered by score
// descending then position ascending; all valid positions when valid <= k.
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
//                 boundary set, a handful unless scores tie - copied to workgroup memory), then
//                 the need2 largest composites of the boundary set: ranked directly when it has
//                 at most NB_RANK keys, else radix-selected in workgroup memory (8-bit digits:
//                 key bits 0..7, then ~position byte by byte, stopping as soon as a bin is taken
//                 whole). Rows with valid <= k select every valid position (no atomics at all).
//   topk_rank     (ordered form only) the selection list (exactly min(k, valid) entries,
//                 unordered) is ranked by counting: rank(e) = #{ j : comp_j > comp_e };
//                 writes sel / sel_score in that order, -1 / -inf padded.
// Every dependent global round trip costs ~1.5-2 us on the H200 (docs/perf.md), so the chain is
// kept short: scores and the histogram load together, the refine's state and histogram loads
// together, candidates carry their keys (no gather), the rank needs no state read.
// No workgroup ever waits for another (no spin locks), so it is correct on any adapter
// whatever the scheduling. A boundary set larger than BCAP (massive ties) is radix-selected
// straight from the global candidate list (slower, same result).
// Scratch (host): hist [n_rows, HSTRIDE], state [n_rows, 16], cand [n_rows, row_len, 2],
// list [n_rows, 2k]; hist and state zero before the first call, and the kernels leave them
// zero (the histograms cleared by the last workgroup of topk_gather, the done counter by the
// workgroup that saw it full). 1 <= k <= 2048.

#include "lib/topk_common.wgsl"

var<workgroup> scan: array<u32, 2u * WG>; // two buffers of WG

// Invocation lid's place in wg_scan's order.
fn scan_slot(lid: u32) -> u32 {
    return lid;
}

// Exclusive prefix sum of v over the workgroup: (exclusive prefix, total). Uniform control flow.
// Radix-4 Hillis-Steele between two buffers: 5 rounds of one barrier each (WG = 1024).
fn wg_scan(lid: u32, v: u32) -> vec2<u32> {
    scan[lid] = v;
    workgroupBarrier();
    var src = 0u;
    for (var off = 1u; off < WG; off *= 4u) {
        var x = scan[src + lid];
        if (lid >= off) {
            x += scan[src + lid - off];
        }
        if (lid >= 2u * off) {
            x += scan[src + lid - 2u * off];
        }
        if (lid >= 3u * off) {
            x += scan[src + lid - 3u * off];
        }
        src = WG - src;
        scan[src + lid] = x;
        workgroupBarrier();
    }
    let incl = scan[src + lid];
    let total = scan[src + WG - 1u];
    workgroupBarrier();
    return vec2<u32>(incl - v, total);
}

// Counts this workgroup in at the row's done counter; true in the last of `total` to arrive,
// which then sees every other workgroup's global writes (storage barriers are device-scope
// acquire/release) and resets the counter.
fn arrive(at: u32, total: u32, lid: u32) -> bool {
    storageBarrier();
    if (lid == 0u) {
        ctl[15] = atomicAdd(&state[at], 1u);
    }
    let last = workgroupUniformLoad(&ctl[15]) + 1u == total;
    if (last) {
        storageBarrier();
        if (lid == 0u) {
            atomicStore(&state[at], 0u);
        }
    }
    return last;
}


@compute @workgroup_size(WG)
fn topk_gather(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
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
    // in the digit-1 histogram: no last-workgroup step in topk_hist.
    let r1 = find_bin_global(row * HSTRIDE, p.k, lid);
    let b1 = r1.x;
    let need1 = r1.y;
    let off2 = row * HSTRIDE + BINS;
    let masks = classify_digit1(keys, base, valid, lid, b1, off2);
    // One scan for both counts (each <= CHUNK): selected in the low 16 bits, candidates above.
    // The two slot reservations come from threads of different subgroups, in flight together.
    let sc = wg_scan(lid, countOneBits(masks.x) | (countOneBits(masks.y) << 16u));
    let ts = sc.y & 0xffffu;
    let tc = sc.y >> 16u;
    if (lid == 0u) {
        ctl[3] = 0u;
        if (ts > 0u) {
            ctl[3] = atomicAdd(&state[row * ST + S_COUNT], ts);
        }
    }
    if (lid == 32u) {
        ctl[4] = 0u;
        if (tc > 0u) {
            ctl[4] = atomicAdd(&state[row * ST + S_CCOUNT], tc);
        }
    }
    workgroupBarrier();
    write_classified(row, ctl[3] + (sc.x & 0xffffu), row * p.row_len + ctl[4] + (sc.x >> 16u), keys, masks, base, lid);
    if (!arrive(row * ST + S_DONE2, nwg.x, lid)) {
        return;
    }
    // The refine, in the last workgroup alone. The candidate count is bin b1's count and the
    // keys selected so far number k - need1, so no state is read: the first RI candidates per
    // thread load together with the digit-2 histogram, one round trip.
    let ncand = r1.z;
    var outo = p.k - need1;
    let cbase = row * p.row_len;
    var c = load_cands(cbase, 0u, ncand, lid);
    let r2 = find_bin_global(off2, need1, lid);
    // Every workgroup has read the digit-1 histogram.
    clear_global(row * HSTRIDE, BINS, lid);
    clear_global(off2, BINS, lid);
    let b2 = r2.x;
    let nb = min(r2.z, ncand);
    let small = nb <= BCAP;
    // One walk over the candidates: keys above b2 are selected, the boundary set (keys in b2)
    // is copied to workgroup memory when it fits. RI candidates per thread per step.
    var bn = 0u;
    var i0 = 0u;
    loop {
        let m = classify_digit2(c, i0, ncand, lid, b2, small);
        let s = wg_scan(lid, countOneBits(m.x) | (countOneBits(m.y) << 16u));
        write_walk(row, outo + (s.x & 0xffffu), bn + (s.x >> 16u), c, m);
        outo += s.y & 0xffffu;
        bn += s.y >> 16u;
        i0 += WG * RI;
        if (i0 >= ncand) {
            break;
        }
        c = load_cands(cbase, i0, ncand, lid);
    }
    workgroupBarrier();
    finish_boundary(row, lid, nb, ncand, small, r2.y, outo, b1, b2);
}

#include "lib/topk_rank.wgsl"
