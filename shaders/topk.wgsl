// Causal top-k of score rows (spec 5.3): per row r the positions of the k largest scores among
// the valid prefix [0, valid) with valid = min(pos0 + r + 1, row_len), ordered by score
// descending then position ascending; all valid positions when valid <= k.
//
// Exact radix select on the order-preserving u32 key of each score, digits 12 | 12 | 8 bits,
// every pass spread over many workgroups (CHUNK positions each), four dispatches in one pass:
//   topk_hist     histogram of digit 1 (workgroup atomics, then the global row histogram);
//                 the LAST workgroup of the row to finish (a done counter) finds bin b1 that
//                 holds the k-th key and how many keys it still needs from it.
//   topk_hist2    keys above b1 go to the row's selection list; keys in b1: histogram of digit
//                 2; last workgroup finds b2. Rows with valid <= k list every valid position.
//   topk_hist3    keys in b1 and above b2 go to the list; keys with prefix (b1, b2) (the
//                 boundary set, a handful unless scores tie) are histogrammed on digit 3 and
//                 listed per workgroup in position order; the last workgroup finds b3, so the
//                 k-th key K* is exact, and walks the boundary lists in position order: keys
//                 above K* and the first `need` ties at K* (smallest positions) go to the list.
//   topk_rank     the list (exactly min(k, valid) entries, unordered) is ranked by counting:
//                 rank(e) = #{ j : key_j > key_e or (key_j == key_e and pos_j < pos_e) };
//                 writes sel / sel_score in that order, -1 / -inf padded.
// Every pass re-reads the row (L2-resident after the first); the "last workgroup" steps avoid
// separate tiny dispatches; no workgroup ever waits for another (no spin locks), so it is
// correct on any adapter whatever the scheduling.
// Scratch (host): hist [n_rows, HSTRIDE], state [n_rows, 16], wgd [n_rows, nwg * (CHUNK + 1)]
// with nwg = ceil(row_len / CHUNK) (boundary counts, then boundary lists), list [n_rows, 2k]; hist and state zero before the first call,
// and the kernels leave them zero (each row histogram is cleared by the pass after its use,
// each done counter by the workgroup that saw it full). 1 <= k <= 2048.

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

// ORDERED = false (the `_set` kernels): the passes write sel / sel_score directly, in no
// particular order, and topk_rank is not run (sparse attention does not need the order).
override ORDERED: bool = true;
const WG: u32 = 256u;
const ITEMS: u32 = 8u;
const CHUNK: u32 = 2048u; // WG * ITEMS positions per workgroup
const BINS: u32 = 4096u;
const BINS3: u32 = 256u;
const HSTRIDE: u32 = 8448u; // per row: digit-1 bins [0, 4096), digit-2 [4096, 8192), digit-3 [8192, 8448)
const KMAX: u32 = 2048u;
const RANK_E: u32 = 32u; // entries ranked per workgroup in topk_rank
const RANK_SEGS: u32 = 8u; // WG / RANK_E threads per entry, each counting over a segment

// state words per row
const ST: u32 = 16u;
const S_DONE1: u32 = 0u;
const S_DONE2: u32 = 1u;
const S_DONE3: u32 = 2u;
const S_COUNT: u32 = 3u;
const S_B1: u32 = 4u;
const S_NEED1: u32 = 5u;
const S_B2: u32 = 6u;
const S_NEED2: u32 = 7u;

@group(0) @binding(0) var<uniform> p: TopkParams;
@group(0) @binding(1) var<storage, read> scores: array<f32>;
@group(0) @binding(2) var<storage, read_write> hist: array<atomic<u32>>;
@group(0) @binding(3) var<storage, read_write> state: array<atomic<u32>>;
@group(0) @binding(4) var<storage, read_write> wgd: array<atomic<u32>>;
@group(0) @binding(5) var<storage, read_write> list: array<u32>;
@group(0) @binding(6) var<storage, read_write> sel: array<i32>;
@group(0) @binding(7) var<storage, read_write> sel_score: array<f32>;

var<workgroup> lh: array<atomic<u32>, BINS>;
var<workgroup> scan: array<u32, 512>; // two buffers of WG
var<workgroup> ctl: array<u32, 8>;

// Exclusive prefix sum of v over the workgroup: (exclusive prefix, total). Uniform control flow.
// Radix-4 Hillis-Steele between two buffers: 4 rounds of one barrier each (WG = 4^4).
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

fn zero_local(n: u32, lid: u32) {
    for (var b = lid; b < n; b += WG) {
        atomicStore(&lh[b], 0u);
    }
}

// Adds the workgroup histogram lh[0..n) into hist[off..off+n).
fn flush(off: u32, n: u32, lid: u32) {
    for (var b = lid; b < n; b += WG) {
        let v = atomicLoad(&lh[b]);
        if (v > 0u) {
            atomicAdd(&hist[off + b], v);
        }
    }
}

fn clear_global(off: u32, n: u32, lid: u32) {
    for (var b = lid; b < n; b += WG) {
        atomicStore(&hist[off + b], 0u);
    }
}

// Counts this workgroup in at the row's done counter; true in the last of `total` to arrive,
// which then sees every other workgroup's global atomics (storage barriers are device-scope
// acquire/release) and resets the counter.
fn arrive(at: u32, total: u32, lid: u32) -> bool {
    storageBarrier();
    if (lid == 0u) {
        ctl[7] = atomicAdd(&state[at], 1u);
    }
    let last = workgroupUniformLoad(&ctl[7]) + 1u == total;
    if (last) {
        storageBarrier();
        if (lid == 0u) {
            atomicStore(&state[at], 0u);
        }
    }
    return last;
}

// The bin of hist[off..off+nb) (highest bin first) holding the need-th largest key, and how
// many keys the selection still takes from it: (bin, need within the bin). nb = 256 or 4096.
fn find_bin(off: u32, nb: u32, need: u32, lid: u32) -> vec2<u32> {
    let per = nb / WG;
    var s = 0u;
    for (var i = 0u; i < per; i++) {
        s += atomicLoad(&hist[off + nb - 1u - per * lid - i]);
    }
    let sc = wg_scan(lid, s);
    let above = sc.x;
    if (above < need && above + s >= need) {
        var cum = above;
        for (var i = 0u; i < per; i++) {
            let b = nb - 1u - per * lid - i;
            let h = atomicLoad(&hist[off + b]);
            if (cum + h >= need) {
                ctl[0] = b;
                ctl[1] = need - cum;
                break;
            }
            cum += h;
        }
    }
    workgroupBarrier();
    let r = vec2<u32>(ctl[0], ctl[1]);
    workgroupBarrier();
    return r;
}

// Appends this thread's marked items (bit i of mask: key keys[i] at position pos0 + i * step)
// to the row's selection list: one scan, one reservation per workgroup.
fn emit(row: u32, mask: u32, keys: array<u32, ITEMS>, pos0: u32, step: u32, lid: u32) {
    let sc = wg_scan(lid, countOneBits(mask));
    emit_at(row, mask, keys, pos0, step, lid, sc.x, sc.y);
}

// emit with this thread's exclusive prefix and the workgroup total already known (one scan
// shared with other counts).
fn emit_at(row: u32, mask: u32, keys: array<u32, ITEMS>, pos0: u32, step: u32, lid: u32, prefix: u32, total: u32) {
    if (lid == 0u && total > 0u) {
        ctl[6] = atomicAdd(&state[row * ST + S_COUNT], total);
    }
    workgroupBarrier();
    var o = ctl[6] + prefix;
    let lbase = row * p.k * 2u;
    for (var i = 0u; i < ITEMS; i++) {
        if ((mask & (1u << i)) != 0u) {
            if (o < p.k) {
                if (ORDERED) {
                    list[lbase + 2u * o] = keys[i];
                    list[lbase + 2u * o + 1u] = pos0 + i * step;
                } else {
                    sel[row * p.k + o] = i32(pos0 + i * step);
                    sel_score[row * p.k + o] = score_of(keys[i]);
                }
            }
            o += 1u;
        }
    }
    workgroupBarrier();
}

@compute @workgroup_size(256)
fn topk_hist(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = row_of(wg, nwg);
    if (row >= p.n_rows) {
        return;
    }
    if (wg.x == 0u && lid == 0u) {
        atomicStore(&state[row * ST + S_COUNT], 0u);
    }
    let valid = valid_len(row);
    if (valid <= p.k) {
        return;
    }
    let base = wg.x * CHUNK;
    zero_local(BINS, lid);
    workgroupBarrier();
    for (var i = 0u; i < ITEMS; i++) {
        let idx = base + i * WG + lid;
        if (idx < valid) {
            atomicAdd(&lh[score_key(row, idx) >> 20u], 1u);
        }
    }
    workgroupBarrier();
    let off = row * HSTRIDE;
    flush(off, BINS, lid);
    if (arrive(row * ST + S_DONE1, nwg.x, lid)) {
        let r = find_bin(off, BINS, p.k, lid);
        if (lid == 0u) {
            atomicStore(&state[row * ST + S_B1], r.x);
            atomicStore(&state[row * ST + S_NEED1], r.y);
        }
    }
}

@compute @workgroup_size(256)
fn topk_hist2(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = row_of(wg, nwg);
    if (row >= p.n_rows) {
        return;
    }
    let valid = valid_len(row);
    let base = wg.x * CHUNK;
    // Scores first: their loads overlap the state read below.
    var keys: array<u32, ITEMS>;
    for (var i = 0u; i < ITEMS; i++) {
        let idx = base + i * WG + lid;
        keys[i] = select(0u, score_key(row, min(idx, valid - 1u)), idx < valid);
    }
    if (valid <= p.k) {
        // Every valid position is selected.
        var all = 0u;
        for (var i = 0u; i < ITEMS; i++) {
            if (base + i * WG + lid < valid) {
                all |= 1u << i;
            }
        }
        emit(row, all, keys, base + lid, WG, lid);
        if (!ORDERED && wg.x == 0u) {
            for (var i = valid + lid; i < p.k; i += WG) {
                sel[row * p.k + i] = -1;
                sel_score[row * p.k + i] = bitcast<f32>(0xff800000u);
            }
        }
        return;
    }
    zero_local(BINS, lid);
    workgroupBarrier();
    let b1 = atomicLoad(&state[row * ST + S_B1]);
    var mask = 0u;
    for (var i = 0u; i < ITEMS; i++) {
        if (base + i * WG + lid < valid) {
            let key = keys[i];
            let d = key >> 20u;
            if (d > b1) {
                mask |= 1u << i;
            } else if (d == b1) {
                atomicAdd(&lh[(key >> 8u) & 0xfffu], 1u);
            }
        }
    }
    emit(row, mask, keys, base + lid, WG, lid);
    let off = row * HSTRIDE;
    flush(off + BINS, BINS, lid);
    if (arrive(row * ST + S_DONE2, nwg.x, lid)) {
        let need1 = atomicLoad(&state[row * ST + S_NEED1]);
        let r = find_bin(off + BINS, BINS, need1, lid);
        if (lid == 0u) {
            atomicStore(&state[row * ST + S_B2], r.x);
            atomicStore(&state[row * ST + S_NEED2], r.y);
        }
        clear_global(off, BINS, lid);
    }
}

var<workgroup> nzw: array<u32, WG>; // workgroups (of a block of 256) with boundary keys
var<workgroup> nzo: array<u32, WG>; // their first index in the block's flattened boundary list

// topk_hist3: keys in b1 above b2 are selected; keys with prefix (b1, b2) (the boundary set,
// usually a handful) are histogrammed on digit 3 and listed per workgroup in position order.
// The last workgroup finds K* and then walks the boundary lists in position order: keys above
// K* are selected, and the first `need` ties at K*.
@compute @workgroup_size(256)
fn topk_hist3(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = row_of(wg, nwg);
    if (row >= p.n_rows) {
        return;
    }
    let valid = valid_len(row);
    if (valid <= p.k) {
        return;
    }
    // Thread-major positions, so a scan over threads lists the boundary keys in position order.
    let base = wg.x * CHUNK;
    let pos0 = base + lid * ITEMS;
    var keys: array<u32, ITEMS>;
    for (var i = 0u; i < ITEMS; i++) {
        let idx = pos0 + i;
        keys[i] = select(0u, score_key(row, min(idx, valid - 1u)), idx < valid);
    }
    zero_local(BINS3, lid);
    workgroupBarrier();
    let b1 = atomicLoad(&state[row * ST + S_B1]);
    let b2 = atomicLoad(&state[row * ST + S_B2]);
    var mask = 0u;
    var bmask = 0u;
    for (var i = 0u; i < ITEMS; i++) {
        if (pos0 + i < valid) {
            let key = keys[i];
            if ((key >> 20u) == b1) {
                let d = (key >> 8u) & 0xfffu;
                if (d > b2) {
                    mask |= 1u << i;
                } else if (d == b2) {
                    bmask |= 1u << i;
                    atomicAdd(&lh[key & 0xffu], 1u);
                }
            }
        }
    }
    // One scan for both counts (each <= CHUNK): selected in the low 16 bits, boundary above.
    let sc = wg_scan(lid, countOneBits(mask) | (countOneBits(bmask) << 16u));
    emit_at(row, mask, keys, pos0, 1u, lid, sc.x & 0xffffu, sc.y & 0xffffu);
    let wbase = row * nwg.x * (CHUNK + 1u);
    var o = wbase + nwg.x + wg.x * CHUNK + (sc.x >> 16u);
    for (var i = 0u; i < ITEMS; i++) {
        if ((bmask & (1u << i)) != 0u) {
            atomicStore(&wgd[o], pos0 + i);
            o += 1u;
        }
    }
    if (lid == 0u) {
        atomicStore(&wgd[wbase + wg.x], sc.y >> 16u);
    }
    let off = row * HSTRIDE + 2u * BINS;
    // BINS3 == WG: one bin per thread.
    let h = atomicLoad(&lh[lid]);
    if (h > 0u) {
        atomicAdd(&hist[off + lid], h);
    }
    if (!arrive(row * ST + S_DONE3, nwg.x, lid)) {
        return;
    }
    let need2 = atomicLoad(&state[row * ST + S_NEED2]);
    let r = find_bin(off, BINS3, need2, lid);
    let kstar = (b1 << 20u) | (b2 << 8u) | r.x;
    let need3 = r.y;
    clear_global(row * HSTRIDE + BINS, BINS + BINS3, lid);
    // The walk stops once it has seen every boundary key above K* and the ties it takes (so
    // a mass of tied scores costs about need3 keys, not the whole tie).
    let need_above = need2 - need3;
    var above = 0u; // boundary keys above K* seen so far
    var ties = 0u; // ties at K* seen so far
    if (lid == 0u) {
        ctl[5] = 0u;
    }
    for (var blk = 0u; blk < nwg.x; blk += WG) {
        if (workgroupUniformLoad(&ctl[5]) != 0u) {
            break;
        }
        // Compact the workgroups of this block that listed boundary keys.
        let w = blk + lid;
        var c = 0u;
        if (w < nwg.x) {
            c = atomicLoad(&wgd[wbase + w]);
        }
        // One scan: listing flags (<= 256) in the low 12 bits, counts (<= 256 * CHUNK) above.
        let fe = wg_scan(lid, select(0u, 1u, c > 0u) | (c << 12u));
        if (c > 0u) {
            nzw[fe.x & 0xfffu] = w;
            nzo[fe.x & 0xfffu] = fe.x >> 12u;
        }
        if (lid == 0u) {
            ctl[3] = fe.y & 0xfffu;
            ctl[4] = fe.y >> 12u;
        }
        let nz = workgroupUniformLoad(&ctl[3]);
        let total = workgroupUniformLoad(&ctl[4]);
        for (var g0 = 0u; g0 < total; g0 += WG) {
            if (workgroupUniformLoad(&ctl[5]) != 0u) {
                break;
            }
            let g = g0 + lid;
            var kk: array<u32, ITEMS>;
            var pos = 0u;
            var key = 0u;
            var tie = 0u;
            var take = 0u;
            if (g < total) {
                // Last listed workgroup whose first index is <= g.
                var lo_i = 0u;
                var hi_i = nz - 1u;
                while (lo_i < hi_i) {
                    let mid = (lo_i + hi_i + 1u) / 2u;
                    if (nzo[mid] <= g) {
                        lo_i = mid;
                    } else {
                        hi_i = mid - 1u;
                    }
                }
                pos = atomicLoad(&wgd[wbase + nwg.x + nzw[lo_i] * CHUNK + g - nzo[lo_i]]);
                key = score_key(row, pos);
                take = select(0u, 1u, key > kstar);
                tie = select(0u, 1u, key == kstar);
            }
            // One scan: keys above K* in the low 16 bits, ties above. The first `rem` ties (in
            // position order) are taken, so the tie part of a prefix is min(ties before, rem).
            let ts = wg_scan(lid, take | (tie << 16u));
            let rem = select(0u, need3 - ties, ties < need3);
            let tie_before = ts.x >> 16u;
            if (tie == 1u && tie_before < rem) {
                take = 1u;
            }
            kk[0] = key;
            let prefix = (ts.x & 0xffffu) + min(tie_before, rem);
            let total = (ts.y & 0xffffu) + min(ts.y >> 16u, rem);
            emit_at(row, take, kk, pos, 1u, lid, prefix, total);
            ties += ts.y >> 16u;
            above += ts.y & 0xffffu;
            if (lid == 0u) {
                ctl[5] = select(0u, 1u, above >= need_above && ties >= need3);
            }
        }
    }
}

var<workgroup> rkey: array<u32, KMAX>;
var<workgroup> rpos: array<u32, KMAX>;

@compute @workgroup_size(256)
fn topk_rank(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = row_of(wg, nwg);
    if (row >= p.n_rows) {
        return;
    }
    let n = min(atomicLoad(&state[row * ST + S_COUNT]), min(p.k, KMAX));
    let lbase = row * p.k * 2u;
    for (var j = lid; j < n; j += WG) {
        rkey[j] = list[lbase + 2u * j];
        rpos[j] = list[lbase + 2u * j + 1u];
    }
    workgroupBarrier();
    let slot = lid % RANK_E;
    let e = wg.x * RANK_E + slot;
    let seg = lid / RANK_E;
    let per = (n + RANK_SEGS - 1u) / RANK_SEGS;
    let j1 = min(seg * per + per, n);
    var cnt = 0u;
    if (e < n) {
        let ke = rkey[e];
        let pe = rpos[e];
        for (var j = seg * per; j < j1; j++) {
            let kj = rkey[j];
            cnt += select(0u, 1u, kj > ke || (kj == ke && rpos[j] < pe));
        }
    }
    scan[lid] = cnt;
    workgroupBarrier();
    if (lid < RANK_E && e < p.k) {
        let o = row * p.k;
        if (e < n) {
            var r = 0u;
            for (var s = 0u; s < RANK_SEGS; s++) {
                r += scan[s * RANK_E + lid];
            }
            let pos = rpos[e];
            sel[o + r] = i32(pos);
            sel_score[o + r] = scores[row * p.row_stride + pos];
        } else {
            sel[o + e] = -1;
            sel_score[o + e] = bitcast<f32>(0xff800000u);
        }
    }
}
