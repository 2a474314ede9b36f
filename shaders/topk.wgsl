// Causal top-k of score rows (spec 5.3): per row r the positions of the k largest scores among
// the valid prefix [0, valid) with valid = min(pos0 + r + 1, row_len), ordered by score
// descending then position ascending; all valid positions when valid <= k.
//
// A radix select in three dispatches (one compute pass):
//   topk_hist   many workgroups per row: histogram of the top 12 bits of the order-preserving
//               score key, added into hist[row] (4096 bins)
//   topk_filter many workgroups per row: find the boundary bin b*; positions above it are
//               selected (def list), positions in it are candidates (cand list)
//   topk_final  one workgroup per row: radix select among the candidates on the remaining 20
//               score bits then on ~position (so ties keep the smaller position), gather, bitonic
//               sort, write sel/sel_score; clears hist and state for the next call.
// Preconditions (host): 1 <= k <= 2048; scores [n_rows, row_stride]; hist [n_rows, 4096] and
// state [n_rows, 4] zero before the first call; def [n_rows, k]; cand [n_rows, row_len];
// sel and sel_score [n_rows, k].

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

const WG: u32 = 256u;
const ITEMS: u32 = 16u;
const CHUNK: u32 = 4096u; // WG * ITEMS elements per workgroup
const BINS: u32 = 4096u;
const KMAX: u32 = 2048u;
override FWG: u32 = 256u;

@group(0) @binding(0) var<uniform> p: TopkParams;
@group(0) @binding(1) var<storage, read> scores: array<f32>;
@group(0) @binding(2) var<storage, read_write> hist: array<atomic<u32>>;
@group(0) @binding(3) var<storage, read_write> state: array<atomic<u32>>;
@group(0) @binding(4) var<storage, read_write> def_list: array<u32>;
@group(0) @binding(5) var<storage, read_write> cand: array<u32>;
@group(0) @binding(6) var<storage, read_write> sel: array<i32>;
@group(0) @binding(7) var<storage, read_write> sel_score: array<f32>;

var<workgroup> lh: array<atomic<u32>, BINS>;
var<workgroup> sums: array<u32, WG>;
var<workgroup> ctl: array<u32, 8>;
var<workgroup> scan: array<u32, 1024>;

// Exclusive prefix sum of v over the n threads of the workgroup (no same-address atomics:
// those serialise). Returns (exclusive prefix, total). Call from uniform control flow.
fn wg_scan(lid: u32, v: u32, n: u32) -> vec2<u32> {
    scan[lid] = v;
    workgroupBarrier();
    for (var off = 1u; off < n; off <<= 1u) {
        var x = scan[lid];
        if (lid >= off) {
            x += scan[lid - off];
        }
        workgroupBarrier();
        scan[lid] = x;
        workgroupBarrier();
    }
    let incl = scan[lid];
    let total = scan[n - 1u];
    workgroupBarrier();
    return vec2<u32>(incl - v, total);
}

// Order-preserving map of f32 to u32 (larger score -> larger key).
fn okey(f: f32) -> u32 {
    let u = bitcast<u32>(f);
    return select(u | 0x80000000u, ~u, (u & 0x80000000u) != 0u);
}

fn valid_len(row: u32) -> u32 {
    return min(p.pos0 + row + 1u, p.row_len);
}

fn row_of(wg: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wg.y + wg.z * nwg.y;
}

@compute @workgroup_size(256)
fn topk_hist(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = row_of(wg, nwg);
    let valid = valid_len(row);
    let base = wg.x * CHUNK;
    if (row >= p.n_rows || valid <= p.k || base >= valid) {
        return;
    }
    for (var b = lid; b < BINS; b += WG) {
        atomicStore(&lh[b], 0u);
    }
    workgroupBarrier();
    for (var i = 0u; i < ITEMS; i++) {
        let idx = base + i * WG + lid;
        if (idx < valid) {
            atomicAdd(&lh[okey(scores[row * p.row_stride + idx]) >> 20u], 1u);
        }
    }
    workgroupBarrier();
    for (var b = lid; b < BINS; b += WG) {
        let v = atomicLoad(&lh[b]);
        if (v > 0u) {
            atomicAdd(&hist[row * BINS + b], v);
        }
    }
}

@compute @workgroup_size(256)
fn topk_filter(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = row_of(wg, nwg);
    let valid = valid_len(row);
    let base = wg.x * CHUNK;
    if (row >= p.n_rows || base >= valid) {
        return;
    }
    // Boundary bin, scanning from the top: chunk c holds bins 4095-16c-15 ..= 4095-16c.
    var bstar = 0u;
    var need = 0u;
    let all = valid <= p.k;
    if (!all) {
        var s = 0u;
        for (var i = 0u; i < 16u; i++) {
            s += atomicLoad(&hist[row * BINS + BINS - 1u - 16u * lid - i]);
        }
        sums[lid] = s;
        workgroupBarrier();
        for (var off = 1u; off < WG; off <<= 1u) {
            var v = sums[lid];
            if (lid >= off) {
                v += sums[lid - off];
            }
            workgroupBarrier();
            sums[lid] = v;
            workgroupBarrier();
        }
        let above = select(0u, sums[lid - 1u], lid > 0u);
        if (above < p.k && sums[lid] >= p.k) {
            var cum = above;
            for (var i = 0u; i < 16u; i++) {
                let b = BINS - 1u - 16u * lid - i;
                let h = atomicLoad(&hist[row * BINS + b]);
                if (cum + h >= p.k) {
                    ctl[0] = b;
                    ctl[1] = p.k - cum;
                    break;
                }
                cum += h;
            }
        }
        workgroupBarrier();
        bstar = ctl[0];
        need = ctl[1];
    }
    if (wg.x == 0u && lid == 0u) {
        atomicStore(&state[row * 4u + 2u], bstar);
        atomicStore(&state[row * 4u + 3u], need);
    }
    // Kinds: 0 = selected, 1 = candidate; offsets from one scan of packed counts, then one
    // global reservation per workgroup and list.
    var kinds: array<u32, ITEMS>;
    var counts = 0u;
    for (var i = 0u; i < ITEMS; i++) {
        let idx = base + i * WG + lid;
        kinds[i] = 2u;
        if (idx < valid) {
            let b = okey(scores[row * p.row_stride + idx]) >> 20u;
            if (all || b > bstar) {
                kinds[i] = 0u;
                counts += 1u;
            } else if (b == bstar) {
                kinds[i] = 1u;
                counts += 1u << 16u;
            }
        }
    }
    let sc = wg_scan(lid, counts, WG);
    if (lid < 2u) {
        let n = (sc.y >> (16u * lid)) & 0xffffu;
        var at = 0u;
        if (n > 0u) {
            at = atomicAdd(&state[row * 4u + lid], n);
        }
        ctl[2u + lid] = at;
    }
    workgroupBarrier();
    var o0 = ctl[2] + (sc.x & 0xffffu);
    var o1 = ctl[3] + (sc.x >> 16u);
    for (var i = 0u; i < ITEMS; i++) {
        let idx = base + i * WG + lid;
        if (kinds[i] == 0u) {
            def_list[row * p.k + o0] = idx;
            o0 += 1u;
        } else if (kinds[i] == 1u) {
            cand[row * p.row_len + o1] = idx;
            o1 += 1u;
        }
    }
}

var<workgroup> skey: array<u32, KMAX>;
var<workgroup> spos: array<u32, KMAX>;
var<workgroup> h8: array<atomic<u32>, 256>;
var<workgroup> fctl: array<u32, 8>; // need, mask_hi, val_hi, mask_lo, val_lo, done, n

// Candidate composite key: low 20 score bits, then ~position (smaller position ranks higher).
fn cand_key(row: u32, pos: u32) -> vec2<u32> {
    return vec2<u32>(okey(scores[row * p.row_stride + pos]) & 0xfffffu, ~pos);
}

// Radix digit pass i: (word 0 = score bits / 1 = position bits, shift, width).
fn pass_of(i: u32) -> vec3<u32> {
    switch i {
        case 0u: { return vec3<u32>(0u, 12u, 8u); }
        case 1u: { return vec3<u32>(0u, 4u, 8u); }
        case 2u: { return vec3<u32>(0u, 0u, 4u); }
        case 3u: { return vec3<u32>(1u, 24u, 8u); }
        case 4u: { return vec3<u32>(1u, 16u, 8u); }
        case 5u: { return vec3<u32>(1u, 8u, 8u); }
        default: { return vec3<u32>(1u, 0u, 8u); }
    }
}

fn precedes(ka: u32, pa: u32, kb: u32, pb: u32) -> bool {
    return ka > kb || (ka == kb && pa < pb);
}

@compute @workgroup_size(FWG)
fn topk_final(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wg.x + wg.y * nwg.x;
    if (row >= p.n_rows) {
        return;
    }
    let valid = valid_len(row);
    let n_def = atomicLoad(&state[row * 4u]);
    let n_cand = atomicLoad(&state[row * 4u + 1u]);
    if (lid == 0u) {
        fctl[0] = atomicLoad(&state[row * 4u + 3u]);
        fctl[1] = 0u;
        fctl[2] = 0u;
        fctl[3] = 0u;
        fctl[4] = 0u;
        fctl[5] = select(0u, 1u, n_cand == 0u || fctl[0] == 0u);
    }
    for (var pi = 0u; pi < 7u; pi++) {
        let done = workgroupUniformLoad(&fctl[5]);
        if (done != 0u) {
            break;
        }
        let ps = pass_of(pi);
        for (var b = lid; b < 256u; b += FWG) {
            atomicStore(&h8[b], 0u);
        }
        workgroupBarrier();
        let mh = fctl[1];
        let vh = fctl[2];
        let ml = fctl[3];
        let vl = fctl[4];
        for (var i = lid; i < n_cand; i += FWG) {
            let key = cand_key(row, cand[row * p.row_len + i]);
            if ((key.x & mh) == vh && (key.y & ml) == vl) {
                let word = select(key.x, key.y, ps.x == 1u);
                let d = (word >> ps.y) & ((1u << ps.z) - 1u);
                atomicAdd(&h8[d], 1u);
            }
        }
        workgroupBarrier();
        if (lid == 0u) {
            var need = fctl[0];
            var d = (1u << ps.z) - 1u;
            loop {
                let h = atomicLoad(&h8[d]);
                if (h >= need || d == 0u) {
                    let m = ((1u << ps.z) - 1u) << ps.y;
                    if (ps.x == 0u) {
                        fctl[1] = mh | m;
                        fctl[2] = vh | (d << ps.y);
                    } else {
                        fctl[3] = ml | m;
                        fctl[4] = vl | (d << ps.y);
                    }
                    fctl[5] = select(0u, 1u, h == need);
                    fctl[0] = need;
                    break;
                }
                need -= h;
                d -= 1u;
            }
        }
        workgroupBarrier();
    }
    workgroupBarrier();
    // Gather: definite positions, then candidates at or above the final prefix (compacted by scans).
    let mh = fctl[1];
    let vh = fctl[2];
    let ml = fctl[3];
    let vl = fctl[4];
    let take_cands = fctl[0] > 0u;
    for (var i = lid; i < min(n_def, KMAX); i += FWG) {
        let pos = def_list[row * p.k + i];
        skey[i] = okey(scores[row * p.row_stride + pos]);
        spos[i] = pos;
    }
    if (lid == 0u) {
        fctl[7] = select(0u, n_cand, take_cands);
        fctl[6] = n_def;
    }
    let nc = workgroupUniformLoad(&fctl[7]);
    var filled = n_def;
    for (var b = 0u; b < nc; b += FWG) {
        let i = b + lid;
        var pos = 0u;
        var hit = 0u;
        if (i < nc) {
            pos = cand[row * p.row_len + i];
            let key = cand_key(row, pos);
            let a = vec2<u32>(key.x & mh, key.y & ml);
            if (a.x > vh || (a.x == vh && a.y >= vl)) {
                hit = 1u;
            }
        }
        let sc = wg_scan(lid, hit, FWG);
        let slot = filled + sc.x;
        if (hit == 1u && slot < KMAX) {
            skey[slot] = okey(scores[row * p.row_stride + pos]);
            spos[slot] = pos;
        }
        filled += sc.y;
    }
    if (lid == 0u) {
        fctl[6] = filled;
    }
    workgroupBarrier();
    let n = min(workgroupUniformLoad(&fctl[6]), min(p.k, KMAX));
    var size = 1u;
    while (size < n) {
        size <<= 1u;
    }
    for (var i = n + lid; i < size; i += FWG) {
        skey[i] = 0u;
        spos[i] = 0xffffffffu;
    }
    workgroupBarrier();
    // Bitonic sort into (score desc, position asc).
    for (var k2 = 2u; k2 <= size; k2 <<= 1u) {
        for (var j = k2 >> 1u; j > 0u; j >>= 1u) {
            for (var i = lid; i < size; i += FWG) {
                let l = i ^ j;
                if (l > i) {
                    let up = (i & k2) == 0u;
                    let a_first = precedes(skey[i], spos[i], skey[l], spos[l]);
                    if (a_first != up) {
                        let tk = skey[i];
                        skey[i] = skey[l];
                        skey[l] = tk;
                        let tp = spos[i];
                        spos[i] = spos[l];
                        spos[l] = tp;
                    }
                }
            }
            workgroupBarrier();
        }
    }
    for (var i = lid; i < p.k; i += FWG) {
        let o = row * p.k + i;
        if (i < n) {
            sel[o] = i32(spos[i]);
            sel_score[o] = scores[row * p.row_stride + spos[i]];
        } else {
            sel[o] = -1;
            sel_score[o] = bitcast<f32>(0xff800000u);
        }
    }
    // Leave the scratch zeroed for the next call.
    for (var b = lid; b < BINS; b += FWG) {
        atomicStore(&hist[row * BINS + b], 0u);
    }
    if (lid < 4u) {
        atomicStore(&state[row * 4u + lid], 0u);
    }
}
