// What topk.wgsl (portable) and topk_sg.wgsl (subgroups) share: parameters, scratch
// bindings, workgroup arrays, key helpers, the digit-1 histogram pass, the boundary refine's
// tests and the bin finds (through each form's wg_scan and scan_slot; see topk.wgsl's header
// for the algorithm).

struct TopkParams {
    n_rows: u32,
    row_stride: u32,
    k: u32,
    pos0: u32,
    row_len: u32,
    _p0: u32,
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

// state words per row
const ST: u32 = 16u;
const S_DONE2: u32 = 1u;
const S_COUNT: u32 = 2u; // selected so far (topk_gather)
const S_CCOUNT: u32 = 3u; // candidates listed

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
var<workgroup> bkey: array<u32, BCAP>;
var<workgroup> bpos: array<u32, BCAP>;

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

@compute @workgroup_size(WG)
fn topk_hist(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = row_of(wg, nwg);
    if (row >= p.n_rows) {
        return;
    }
    let valid = valid_len(row);
    if (wg.x == 0u && lid == 0u) {
        atomicStore(&state[row * ST + S_COUNT], select(0u, valid, valid <= p.k));
        atomicStore(&state[row * ST + S_CCOUNT], 0u);
    }
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

// Boundary element j: (key, position) from workgroup memory, or from the candidate list.
fn boundary(row: u32, j: u32, small: bool) -> vec2<u32> {
    if (small) {
        return vec2<u32>(bkey[j], bpos[j]);
    }
    return cand[row * p.row_len + j].yx;
}

// The bin of the global histogram hist[off..off+4096) (highest bin first) holding the need-th
// largest key: (bin, need within the bin, keys in the bin), workgroup-uniform. Bins are taken in
// wg_scan's order (scan_slot, which each form defines): one round trip and one scan.
fn find_bin_global(off: u32, need: u32, lid: u32) -> vec3<u32> {
    let per = PER;
    var h: array<u32, PER>;
    var s = 0u;
    for (var i = 0u; i < per; i++) {
        h[i] = histp[off + BINS - 1u - per * scan_slot(lid) - i];
        s += h[i];
    }
    let sc = wg_scan(lid, s);
    let above = sc.x;
    if (above < need && above + s >= need) {
        // No early exit: a loop that breaks kept h in local memory (NVIDIA, tools/nvidia_sass.py).
        var cum = above;
        var found = false;
        for (var i = 0u; i < per; i++) {
            if (!found && cum + h[i] >= need) {
                fb = vec4<u32>(BINS - 1u - per * scan_slot(lid) - i, need - cum, h[i], 0u);
                found = true;
            }
            cum += h[i];
        }
    }
    return workgroupUniformLoad(&fb).xyz;
}

// The same over the 256 workgroup bins lh8 (one bin per thread of the first 256).
fn find_bin_local(need: u32, lid: u32) -> vec3<u32> {
    var s = 0u;
    if (scan_slot(lid) < 256u) {
        s = atomicLoad(&lh8[255u - scan_slot(lid)]);
    }
    let sc = wg_scan(lid, s);
    if (sc.x < need && sc.x + s >= need) {
        fb = vec4<u32>(255u - scan_slot(lid), need - sc.x, s, 0u);
    }
    return workgroupUniformLoad(&fb).xyz;
}

// ---- topk_gather's steps, the same in both forms (their slot assignment differs: each form's
// wg_scan or slots, and its own reservations and done counter).

// This workgroup's ITEMS keys per thread (positions past `valid` read the last valid one).
fn gather_keys(row: u32, base: u32, valid: u32, lid: u32) -> array<u32, ITEMS> {
    var keys: array<u32, ITEMS>;
    for (var i = 0u; i < ITEMS; i++) {
        keys[i] = score_key(row, min(base + i * WG + lid, valid - 1u));
    }
    return keys;
}

// A row with valid <= k: every valid position is selected, in position order (the set form
// pads the rest of the row with -1 / -inf from its first workgroup).
fn select_all_valid(row: u32, base: u32, valid: u32, lid: u32, first: bool, keys: array<u32, ITEMS>) {
    for (var i = 0u; i < ITEMS; i++) {
        let idx = base + i * WG + lid;
        if (idx < valid) {
            put(row, idx, keys[i], idx);
        }
    }
    if (!ORDERED && first) {
        for (var i = valid + lid; i < p.k; i += WG) {
            sel[row * p.k + i] = -1;
            sel_score[row * p.k + i] = bitcast<f32>(0xff800000u);
        }
    }
}

// Masks of the thread's keys above bin b1 (selected) and in it (candidates, counted into the
// digit-2 histogram at off2): (selected, candidates).
fn classify_digit1(keys: array<u32, ITEMS>, base: u32, valid: u32, lid: u32, b1: u32, off2: u32) -> vec2<u32> {
    var smask = 0u;
    var cmask = 0u;
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
    return vec2<u32>(smask, cmask);
}

// Writes the thread's selected keys from slot o on and its candidates from list entry oc on.
fn write_classified(row: u32, o0: u32, oc0: u32, keys: array<u32, ITEMS>, masks: vec2<u32>, base: u32, lid: u32) {
    var o = o0;
    var oc = oc0;
    for (var i = 0u; i < ITEMS; i++) {
        let idx = base + i * WG + lid;
        if ((masks.x & (1u << i)) != 0u) {
            put(row, o, keys[i], idx);
            o += 1u;
        }
        if ((masks.y & (1u << i)) != 0u) {
            cand[oc] = vec2<u32>(idx, keys[i]);
            oc += 1u;
        }
    }
}

// RI candidates per thread of the refine's walk: keys and positions.
struct Cands {
    k: array<u32, RI>,
    p: array<u32, RI>,
}

// The thread's candidates of the walk step starting at list entry i0 (all RI loads together).
fn load_cands(cbase: u32, i0: u32, ncand: u32, lid: u32) -> Cands {
    var c: Cands;
    for (var q = 0u; q < RI; q++) {
        let j = i0 + q * WG + lid;
        if (j < ncand) {
            let e = cand[cbase + j];
            c.p[q] = e.x;
            c.k[q] = e.y;
        }
    }
    return c;
}

// Masks of the step's candidates above bin b2 (selected) and in it (the boundary set, kept
// only when it fits workgroup memory): (selected, boundary).
fn classify_digit2(c: Cands, i0: u32, ncand: u32, lid: u32, b2: u32, small: bool) -> vec2<u32> {
    var tm = 0u;
    var km = 0u;
    for (var q = 0u; q < RI; q++) {
        if (i0 + q * WG + lid < ncand) {
            let d = (c.k[q] >> 8u) & 0xfffu;
            if (d > b2) {
                tm |= 1u << q;
            } else if (d == b2 && small) {
                km |= 1u << q;
            }
        }
    }
    return vec2<u32>(tm, km);
}

// Writes the step's selected candidates from slot o on and its boundary keys from bkey / bpos
// entry ob on (those past BCAP dropped).
fn write_walk(row: u32, o0: u32, ob0: u32, c: Cands, masks: vec2<u32>) {
    var o = o0;
    var ob = ob0;
    for (var q = 0u; q < RI; q++) {
        if ((masks.x & (1u << q)) != 0u) {
            put(row, o, c.k[q], c.p[q]);
            o += 1u;
        }
        if ((masks.y & (1u << q)) != 0u && ob < BCAP) {
            bkey[ob] = c.k[q];
            bpos[ob] = c.p[q];
            ob += 1u;
        }
    }
}

// The need2 largest composites of the boundary set (nb keys in bin b2 under b1; in bkey / bpos
// when small, else read from the n = ncand candidates) to slots out0 on: ranked directly when
// the set has at most NB_RANK keys, else radix-selected in workgroup memory. Uniform control
// flow, after the barrier that publishes the boundary set.
fn finish_boundary(row: u32, lid: u32, nb: u32, ncand: u32, small: bool, need2: u32, out0: u32, b1: u32, b2: u32) {
    if (nb <= NB_RANK) {
        // Small boundary set (the usual case): rank each element among the set by composite
        // (unique: positions differ); the need2 highest-ranked go to slots out0 + rank.
        if (lid < nb) {
            let ke = bkey[lid];
            let pe = bpos[lid];
            var r = 0u;
            for (var j = 0u; j < nb; j++) {
                let kj = bkey[j];
                r += select(0u, 1u, kj > ke || (kj == ke && bpos[j] < pe));
            }
            if (r < need2) {
                put(row, out0 + r, ke, pe);
            }
        }
        return;
    }
    // Radix select: threshold (tk, tl), its top f bits known.
    let n = select(ncand, nb, small);
    var need = need2;
    var tk = ((b1 << 12u) | b2) << 8u;
    var tl = 0u;
    var f = 24u;
    var whole = need == nb;
    while (!whole && f < 64u) {
        if (lid < 256u) {
            atomicStore(&lh8[lid], 0u);
        }
        workgroupBarrier();
        for (var j = lid; j < n; j += WG) {
            let e = boundary(row, j, small);
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
    var out = out0;
    for (var j0 = 0u; j0 < n; j0 += WG) {
        let j = j0 + lid;
        var take = 0u;
        var e = vec2<u32>(0u, 0u);
        if (j < n) {
            e = boundary(row, j, small);
            let lo = ~e.y;
            take = select(0u, 1u, (e.x >> 8u) == pre && (e.x > tk || (e.x == tk && lo >= tl)));
        }
        let s = wg_scan(lid, take);
        if (take != 0u) {
            put(row, out + s.x, e.x, e.y);
        }
        out += s.y;
    }
}
