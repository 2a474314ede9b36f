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
//                 need1 (keys still taken from b1); its keys at or above b1 are written as
//                 (position, key) into its own region of the candidate list (region w starts
//                 at w * CHUNK: no global slot reservation) and their count into the row's
//                 region counts; keys in b1 (the candidates) are also histogrammed on key bits
//                 8..19 in global atomics. The LAST workgroup to finish (a done counter)
//                 refines alone: bin b2 of that histogram (need2 keys still needed), one walk
//                 over the regions (keys above b1 or above b2 in b1 selected, keys in b2 - the
//                 boundary set, a handful unless scores tie - copied to workgroup memory; slots
//                 from subgroup sums and one workgroup atomic per subgroup, no barrier). The
//                 walk's first step loads the first S = WG * RI / regions entries of every
//                 region speculatively, with the counts and the digit-2 histogram (one round
//                 trip); regions holding more (skewed rows, ties) are walked again through a
//                 prefix of the counts. Then
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
// straight from the global candidate regions (slower, same result). Needs full subgroups (bins
// are assigned in subgroup order, sg_vi) of at least 4 lanes, and at most RMAX regions (rows of
// up to 4M positions; the host runs topk.wgsl beyond).
// Scratch (host): hist [rows, HSTRIDE] then, from p.cnt_off, the region counts [n_rows,
// regions] (written every call; after the histograms of every row the scratch has, so rows
// past n_rows keep zero histograms), state [n_rows, 16], cand [n_rows, row_len, 2],
// list [n_rows, 2k]; hist and state zero before the first call, and the kernels leave them
// zero (the histograms cleared by the last workgroup of topk_gather, the done counter by the
// workgroup that saw it full). Workgroup memory starts zeroed (WebGPU). 1 <= k <= 2048.

struct TopkParams {
    n_rows: u32,
    row_stride: u32,
    k: u32,
    pos0: u32,
    row_len: u32,
    cnt_off: u32, // where the region counts start in hist (after the scratch's every row's histograms)
    _p1: u32,
    _p2: u32,
}

// ORDERED = false (the `_set` kernels): topk_gather writes sel / sel_score directly, in no
// particular order, and topk_rank is not run (sparse attention does not need the order).
override ORDERED: bool = true;
const WG: u32 = 1024u;
const ITEMS: u32 = 4u;
const CHUNK: u32 = 4096u; // WG * ITEMS positions per workgroup (the host's TOPK_CHUNK)
const BINS: u32 = 4096u;
const PER: u32 = BINS / WG; // global histogram bins per thread in find_bin_global
const HSTRIDE: u32 = 8192u; // per row: digit-1 bins [0, 4096), digit-2 bins [4096, 8192)
const BCAP: u32 = 2048u; // boundary keys held in workgroup memory
const RI: u32 = 8u; // candidates per thread per step of the refine's walk
const NB_RANK: u32 = 64u; // boundary sets up to this size are ranked directly (no radix rounds)
const KMAX: u32 = 2048u;
const RWG: u32 = 256u; // topk_rank workgroup
const RANK_E: u32 = 8u; // entries ranked per topk_rank workgroup (at most the host's TOPK_RANK_E)
const RANK_SEGS: u32 = 32u; // RWG / RANK_E threads per entry, each counting over a segment
const RMAX: u32 = 1024u; // regions (workgroups) per row: WG, one count per thread of the refine

// state words per row
const ST: u32 = 16u;
const S_DONE2: u32 = 1u;
const S_CCOUNT: u32 = 3u; // entries listed (compact list; the refine resets it)

@group(0) @binding(0) var<uniform> p: TopkParams;
@group(0) @binding(1) var<storage, read> scores: array<f32>;
@group(0) @binding(2) var<storage, read_write> hist: array<atomic<u32>>;
@group(0) @binding(3) var<storage, read_write> state: array<atomic<u32>>;
@group(0) @binding(4) var<storage, read_write> cand: array<vec2<u32>>; // (position, key)
@group(0) @binding(5) var<storage, read_write> list: array<vec2<u32>>; // (key, position)
@group(0) @binding(6) var<storage, read_write> sel: array<i32>;
@group(0) @binding(7) var<storage, read_write> sel_score: array<f32>;
// The same buffer as `hist`, read and cleared with plain loads and stores: the digit-1 bins come
// from the previous dispatch, the digit-2 bins are read after the done counter (storage
// barriers order them). Atomic loads measured ~0.5 us each on the H200, one after another.
@group(0) @binding(8) var<storage, read_write> histp: array<u32>;

var<workgroup> lh: array<atomic<u32>, BINS>; // topk_hist
var<workgroup> lh8: array<atomic<u32>, 256>; // topk_gather's refine
var<workgroup> ctl: array<u32, 16>;
var<workgroup> fb: vec4<u32>; // find results, broadcast with one uniform load
// Slots handed to subgroups: [0] topk_gather's classification, [1] the refine's walk
// (selected in the low 16 bits, the others above).
var<workgroup> wcnt: array<atomic<u32>, 2>;
var<workgroup> bkey: array<u32, BCAP>;
var<workgroup> bpos: array<u32, BCAP>;
var<workgroup> ovf: atomic<u32>; // the refine: some region holds more than its speculative slice
var<workgroup> rpre: array<u32, RMAX>; // the refine: exclusive prefix of the region counts
var<workgroup> rn: array<u32, RMAX>; // the refine: the region counts
var<workgroup> lbase: u32; // topk_gather: the workgroup's first slot in the compact list

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

// Order-preserving map of f32 to u32 (larger score -> larger key; the order of f64 total_cmp).
fn okey(f: f32) -> u32 {
    let u = bitcast<u32>(f);
    return select(u | 0x80000000u, ~u, (u & 0x80000000u) != 0u);
}

// Inverse of okey.
fn score_of(key: u32) -> f32 {
    return bitcast<f32>(select(~key, key & 0x7fffffffu, (key & 0x80000000u) != 0u));
}

fn valid_len(row: u32) -> u32 {
    return min(p.pos0 + row + 1u, p.row_len);
}

fn row_of(wg: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wg.y + wg.z * nwg.y;
}

fn score_key(row: u32, idx: u32) -> u32 {
    return okey(scores[row * p.row_stride + idx]);
}

// Selection slot o of the row: (key, position) in the list (ordered form) or sel / sel_score.
fn put(row: u32, o: u32, key: u32, pos: u32) {
    if (o < p.k) {
        if (ORDERED) {
            list[row * p.k + o] = vec2<u32>(key, pos);
        } else {
            sel[row * p.k + o] = i32(pos);
            sel_score[row * p.k + o] = score_of(key);
        }
    }
}

fn clear_global(off: u32, n: u32, lid: u32) {
    for (var b = lid; b < n; b += WG) {
        histp[off + b] = 0u;
    }
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

// The bin of the global histogram hist[off..off+4096) (highest bin first) holding the need-th
// largest key: (bin, need within the bin, keys in the bin, ovf as set before the call),
// workgroup-uniform. Bins in subgroup order (sg_vi): one round trip, a subgroup scan, four
// barriers.
fn find_bin_global(off: u32, need: u32, lid: u32) -> vec4<u32> {
    return find_bin_of(hist_load(off), need, lid);
}

// This thread's PER bins of find_bin_global, highest first.
fn hist_load(off: u32) -> array<u32, PER> {
    var h: array<u32, PER>;
    for (var i = 0u; i < PER; i++) {
        h[i] = histp[off + BINS - 1u - PER * sg_vi - i];
    }
    return h;
}

// find_bin_global on the bins loaded by hist_load.
fn find_bin_of(h: array<u32, PER>, need: u32, lid: u32) -> vec4<u32> {
    let per = PER;
    var s = 0u;
    for (var i = 0u; i < per; i++) {
        s += h[i];
    }
    let sc = wg_scan(lid, s);
    let above = sc.x;
    if (above < need && above + s >= need) {
        var cum = above;
        for (var i = 0u; i < per; i++) {
            if (cum + h[i] >= need) {
                fb = vec4<u32>(BINS - 1u - per * sg_vi - i, need - cum, h[i], atomicLoad(&ovf));
                break;
            }
            cum += h[i];
        }
    }
    return workgroupUniformLoad(&fb);
}

// The same over the 256 workgroup bins lh8 (one bin per thread of the first 256).
fn find_bin_local(need: u32, lid: u32) -> vec3<u32> {
    var s = 0u;
    if (sg_vi < 256u) {
        s = atomicLoad(&lh8[255u - sg_vi]);
    }
    let sc = wg_scan(lid, s);
    if (sc.x < need && sc.x + s >= need) {
        fb = vec4<u32>(255u - sg_vi, need - sc.x, s, 0u);
    }
    return workgroupUniformLoad(&fb).xyz;
}

@compute @workgroup_size(WG)
fn topk_hist(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = row_of(wg, nwg);
    if (row >= p.n_rows) {
        return;
    }
    let valid = valid_len(row);
    if (valid <= p.k) {
        return;
    }
    let base = wg.x * CHUNK;
    // Scores first: their loads overlap the clearing.
    var keys: array<u32, ITEMS>;
    for (var i = 0u; i < ITEMS; i++) {
        let idx = base + i * WG + lid;
        keys[i] = score_key(row, min(idx, valid - 1u));
    }
    for (var b = lid; b < BINS; b += WG) {
        atomicStore(&lh[b], 0u);
    }
    workgroupBarrier();
    for (var i = 0u; i < ITEMS; i++) {
        if (base + i * WG + lid < valid) {
            atomicAdd(&lh[keys[i] >> 20u], 1u);
        }
    }
    workgroupBarrier();
    let off = row * HSTRIDE;
    for (var b = lid; b < BINS; b += WG) {
        let v = atomicLoad(&lh[b]);
        if (v > 0u) {
            atomicAdd(&hist[off + b], v);
        }
    }
}

// Fixed-bits tests of the boundary refine. The composite is (key, lo = ~position); the top
// `f` bits (24 <= f <= 56) of the threshold (tk, tl) are known.
fn prefix_ok(key: u32, lo: u32, f: u32, tk: u32, tl: u32) -> bool {
    if (f == 24u) {
        return (key >> 8u) == (tk >> 8u);
    }
    if (f == 32u) {
        return key == tk;
    }
    return key == tk && (lo >> (64u - f)) == (tl >> (64u - f));
}

// The 8-bit digit below the top `f` bits.
fn digit_of(key: u32, lo: u32, f: u32) -> u32 {
    if (f == 24u) {
        return key & 0xffu;
    }
    return (lo >> (56u - f)) & 0xffu;
}

// The region holding entry e of the regions' concatenation (rpre: exclusive prefix of the
// counts): the largest w with rpre[w] <= e.
fn region_of(e: u32, nreg: u32) -> u32 {
    var lo = 0u;
    var hi = nreg;
    while (hi - lo > 1u) {
        let mid = (lo + hi) / 2u;
        if (rpre[mid] <= e) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    return lo;
}

// Entry e (< the total count) of the regions' concatenation: (position, key).
fn entry_at(row: u32, e: u32, nreg: u32) -> vec2<u32> {
    let w = region_of(e, nreg);
    return cand[row * p.row_len + w * CHUNK + e - rpre[w]];
}

// Boundary element j: (key, position) from workgroup memory, or from the candidate regions.
fn boundary(row: u32, j: u32, small: bool, compact: bool, nreg: u32) -> vec2<u32> {
    if (small) {
        return vec2<u32>(bkey[j], bpos[j]);
    }
    if (compact) {
        return cand[row * p.row_len + j].yx;
    }
    return entry_at(row, j, nreg).yx;
}

// One step of the refine's walk over up to RI entries per thread (vm: which are loaded): keys
// above b1, or in b1 above b2, go to the selection (slots from 0: k - need2 of them in all);
// keys in b1 and b2 to the boundary set in workgroup memory when it fits (small).
fn walk_step(row: u32, ck: array<u32, RI>, cp: array<u32, RI>, vm: u32, b1: u32, b2: u32, small: bool) {
    var tm = 0u;
    var km = 0u;
    for (var q = 0u; q < RI; q++) {
        if ((vm & (1u << q)) != 0u) {
            let d1 = ck[q] >> 20u;
            let d2 = (ck[q] >> 8u) & 0xfffu;
            if (d1 > b1 || (d1 == b1 && d2 > b2)) {
                tm |= 1u << q;
            } else if (d1 == b1 && d2 == b2 && small) {
                km |= 1u << q;
            }
        }
    }
    let s = slots(countOneBits(tm) | (countOneBits(km) << 16u), 1u);
    var o = s & 0xffffu;
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
    let nreg = nwg.x;
    let coff = p.cnt_off + row * nreg; // the row's region counts
    let cbase = row * p.row_len;
    // Every workgroup knows how many keys are at or above b1 in all (k - need1 above, bin b1's
    // count in it). Up to one walk step of them: each workgroup writes its own into its region
    // (no global reservation). More (long rows): into one compact list, slots reserved.
    let total = p.k - r1.y + r1.z;
    let compact = total > WG * RI;
    var emask = 0u;
    let off2 = off + BINS;
    for (var i = 0u; i < ITEMS; i++) {
        if (base + i * WG + lid < valid) {
            let d = keys[i] >> 20u;
            if (d >= b1) {
                emask |= 1u << i;
            }
            if (d == b1) {
                atomicAdd(&hist[off2 + ((keys[i] >> 8u) & 0xfffu)], 1u);
            }
        }
    }
    var oc = slots(countOneBits(emask), 0u);
    if (compact) {
        workgroupBarrier();
        if (lid == 0u) {
            lbase = atomicAdd(&state[row * ST + S_CCOUNT], atomicLoad(&wcnt[0]));
        }
        oc += cbase + workgroupUniformLoad(&lbase);
    } else {
        oc += cbase + base;
    }
    for (var i = 0u; i < ITEMS; i++) {
        if ((emask & (1u << i)) != 0u) {
            cand[oc] = vec2<u32>(base + i * WG + lid, keys[i]);
            oc += 1u;
        }
    }
    if (!compact) {
        workgroupBarrier();
        if (lid == 0u) {
            histp[coff + wg.x] = atomicLoad(&wcnt[0]);
        }
    }
    let u = arrive(row * ST + S_DONE2, nwg.x, lid, 0u, 0u);
    if (u.x + 1u != nwg.x) {
        return;
    }
    // The refine, in the last workgroup alone. b1, need1 and the candidate count (bin b1's) are
    // this workgroup's own r1. One round trip: the digit-2 histogram and the first walk step's
    // entries (regions: every region's count and its first sl entries, speculatively, the
    // entries past a region's count dropped), in flight together.
    let need1 = r1.y;
    let ncand = r1.z;
    // Regions: tpr threads per region (nreg <= WG), RI entries each, at most 1.5x the mean
    // and 32 more (the slice sl); no division per entry.
    let mean = total / nreg;
    let tpr = WG / nreg;
    let w0 = lid / tpr;
    let t0 = lid - w0 * tpr;
    let sl = min(min(CHUNK, tpr * RI), mean + mean / 2u + 32u);
    var ck: array<u32, RI>;
    var cp: array<u32, RI>;
    var vm = 0u;
    var nown = 0u;
    if (!compact && lid < nreg) {
        nown = histp[coff + lid];
    }
    let h2 = hist_load(off2);
    for (var q = 0u; q < RI; q++) {
        if (compact) {
            let f = q * WG + lid;
            if (f < total) {
                let c = cand[cbase + f];
                cp[q] = c.x;
                ck[q] = c.y;
                vm |= 1u << q;
            }
        } else {
            let j = q * tpr + t0;
            if (w0 < nreg && j < sl) {
                let c = cand[cbase + min(w0 * CHUNK + j, p.row_len - 1u)];
                cp[q] = c.x;
                ck[q] = c.y;
            }
        }
    }
    // Every load is in flight: now the counts to workgroup memory (find_bin_of's barriers
    // publish them).
    if (!compact && lid < nreg) {
        rn[lid] = nown;
        if (nown > sl) {
            atomicOr(&ovf, 1u);
        }
    }
    let r2 = find_bin_of(h2, need1, lid);
    // Every workgroup has read the digit-1 histogram, every thread here the digit-2 one.
    clear_global(off, HSTRIDE, lid);
    if (compact && lid == 0u) {
        atomicStore(&state[row * ST + S_CCOUNT], 0u);
    }
    let b2 = r2.x;
    let nb = min(r2.z, ncand);
    let small = nb <= BCAP;
    if (!compact && w0 < nreg) {
        let n = rn[w0];
        for (var q = 0u; q < RI; q++) {
            let j = q * tpr + t0;
            if (j < min(n, sl)) {
                vm |= 1u << q;
            }
        }
    }
    walk_step(row, ck, cp, vm, b1, b2, small);
    if (compact) {
        for (var e0 = WG * RI; e0 < total; e0 += WG * RI) {
            vm = 0u;
            for (var q = 0u; q < RI; q++) {
                let e = e0 + q * WG + lid;
                if (e < total) {
                    let c = cand[cbase + e];
                    cp[q] = c.x;
                    ck[q] = c.y;
                    vm |= 1u << q;
                }
            }
            walk_step(row, ck, cp, vm, b1, b2, small);
        }
    }
    // Regions past their slice, or a boundary set radix-selected from the regions: the
    // regions' concatenation through the prefix of their counts.
    if (!compact && (r2.w != 0u || !small)) {
        let sc2 = wg_scan(lid, nown);
        if (lid < nreg) {
            rpre[lid] = sc2.x;
        }
        workgroupBarrier();
    }
    if (!compact && r2.w != 0u) {
        for (var e0 = 0u; e0 < total; e0 += WG * RI) {
            vm = 0u;
            for (var q = 0u; q < RI; q++) {
                let e = e0 + q * WG + lid;
                if (e < total) {
                    let w = region_of(e, nreg);
                    if (e - rpre[w] >= sl) {
                        let c = cand[cbase + w * CHUNK + e - rpre[w]];
                        cp[q] = c.x;
                        ck[q] = c.y;
                        vm |= 1u << q;
                    }
                }
            }
            walk_step(row, ck, cp, vm, b1, b2, small);
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
    let n = select(total, nbu, nbu <= BCAP);
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
            let e = boundary(row, j, nbu <= BCAP, compact, nreg);
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
            e = boundary(row, j, nbu <= BCAP, compact, nreg);
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

var<workgroup> rkey: array<u32, KMAX>;
var<workgroup> rpos: array<u32, KMAX>;
var<workgroup> rcnt: array<u32, RWG>;

@compute @workgroup_size(256)
fn topk_rank(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = row_of(wg, nwg);
    if (row >= p.n_rows) {
        return;
    }
    let n = min(valid_len(row), min(p.k, KMAX)); // the list holds exactly min(k, valid) entries
    let lbase = row * p.k;
    // KMAX / RWG loads per thread, all in flight before the first store (a loop bounded by n
    // issued them one round trip at a time).
    var ent: array<vec2<u32>, KMAX / RWG>;
    for (var i = 0u; i < KMAX / RWG; i++) {
        let j = i * RWG + lid;
        if (j < n) {
            ent[i] = list[lbase + j];
        }
    }
    for (var i = 0u; i < KMAX / RWG; i++) {
        let j = i * RWG + lid;
        if (j < n) {
            rkey[j] = ent[i].x;
            rpos[j] = ent[i].y;
        }
    }
    workgroupBarrier();
    let slot = lid % RANK_E;
    let e = wg.x * RANK_E + slot;
    let seg = lid / RANK_E;
    var cnt = 0u;
    if (e < n) {
        let ke = rkey[e];
        let pe = rpos[e];
        // Segments interleaved (thread seg reads j = seg, seg + RANK_SEGS, ...): the segments
        // of a 32-wide subgroup read neighbouring words, no bank conflicts.
        for (var j = seg; j < n; j += RANK_SEGS) {
            let kj = rkey[j];
            cnt += select(0u, 1u, kj > ke || (kj == ke && rpos[j] < pe));
        }
    }
    rcnt[lid] = cnt;
    workgroupBarrier();
    if (lid < RANK_E && e < p.k) {
        let o = row * p.k;
        if (e < n) {
            var r = 0u;
            for (var s = 0u; s < RANK_SEGS; s++) {
                r += rcnt[s * RANK_E + lid];
            }
            sel[o + r] = i32(rpos[e]);
            sel_score[o + r] = score_of(rkey[e]);
        } else {
            sel[o + e] = -1;
            sel_score[o + e] = bitcast<f32>(0xff800000u);
        }
    }
}

// Bench probe: an empty dispatch (the launch and drain floor).
@compute @workgroup_size(64)
fn topk_noop(@builtin(local_invocation_index) lid: u32) {
    if (lid == 1000u) {
        atomicStore(&state[0], p.k);
    }
}
