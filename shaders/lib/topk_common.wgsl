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
        var cum = above;
        for (var i = 0u; i < per; i++) {
            if (cum + h[i] >= need) {
                fb = vec4<u32>(BINS - 1u - per * scan_slot(lid) - i, need - cum, h[i], 0u);
                break;
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
