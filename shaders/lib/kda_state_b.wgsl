// kda_chunk_state_b: the state pass with S in registers and every staged operand read as a
// broadcast. kda_chunk.wgsl includes it with BC (value columns per workgroup) and BR (rows per
// staged slice) renamed to numbers: BC = 32, BR = 8.
//   One workgroup of 2 BC threads per (head, BC value columns), sequential over chunks; thread
//   (half = lid / BC, lane = lid % BC) keeps S[64 half .. 64 half + 63, column lane] as 16
//   channel quads for the whole pass (K <= 128).
//   Per chunk 2 x 64 / BR stages of BR rows, each one workgroup barrier (slices double-buffered;
//   the next stage's global loads are issued before the current stage's math):
//   - w stages: each thread forms its half's share of w S_n for the slice's rows from w's
//     channel quads (the same for all lanes of a half: broadcast reads) and its own S. The
//     partials of the rows the other half finalizes go to bs_x, the others stay in registers;
//     a stage later (past the next barrier) each half finalizes its BR / 2 rows of the slice,
//     U = u - own - other, into u and bs_x. No S_n tile in workgroup memory.
//   - kg stages: S = diag(e^Gamma_last) S_n + kg^T U, kg quads broadcast, U from bs_x.
// Workgroup memory: 2 slices [BR rows, 32 channel quads] + U [64, BC] = 16 KiB.
// On the H200 (T = 8192 x 96 heads x 128, 384 workgroups) 4.29 ms against 4.41 for the 41 KB
// kda_chunk_state; only the first 132 workgroups (one per SM): 3.43 ms, so each workgroup's
// serial chain, not the SMs' throughput, sets the time. Slower, all exact: BC = 16 (8 KiB) 5.13
// ms; BR = 4 (12 KiB) 7.28; BR = 16 (24 KiB) 7.40; loads two stages ahead 4.93; a loader warp
// staging w, kg and u two stages ahead (96 threads) 7.33, alone per SM 4.13. Each of those
// keeps more registers live; spills (S and the decay are 128 per thread already) would explain
// it, not established without a profiler.
var<workgroup> bs_t: array<vec4<f32>, 64u * BR>;   // 2 slices [BR rows, 32 channel quads]
var<workgroup> bs_x: array<f32, 64u * BC>;          // [C rows, BC columns]: partials, then U

// Global loads of stage g of chunk n (g < 64 / BR: w rows, else kg rows), BR x 32 quads over
// 2 BC threads; zeros past the last row, past K and past the last chunk.
fn bs_fetch(n: u32, g: u32, h: u32, lid: u32) -> array<vec4<f32>, BR * 16u / BC> {
    var out: array<vec4<f32>, BR * 16u / BC>;
    if (n >= p.nchunks) {
        return out;
    }
    let hk = p.heads * p.dk;
    let t0 = n * C;
    let nv = rows_in(n);
    let ns = C / BR;
    let r0 = (g % ns) * BR;
    for (var i = 0u; i < BR * 16u / BC; i++) {
        let e = lid + i * 2u * BC;
        let r = r0 + e / 32u;
        let ch = 4u * (e % 32u);
        if (r < nv && ch < p.dk) {
            let at = (t0 + r) * hk + h * p.dk + ch;
            if (g < ns) {
                out[i] = vec4<f32>(w[at], w[at + 1u], w[at + 2u], w[at + 3u]);
            } else {
                out[i] = vec4<f32>(kg[at], kg[at + 1u], kg[at + 2u], kg[at + 3u]);
            }
        }
    }
    return out;
}

@compute @workgroup_size(2u * BC)
fn kda_chunk_state_b(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let tiles = (p.dk + BC - 1u) / BC;
    let id = wg.x + wg.y * nwg.x;
    if (id >= p.heads * tiles) {
        return;
    }
    let h = id / tiles;
    let lane = lid % BC;
    let half = lid / BC;
    let col = (id % tiles) * BC + lane;
    let live = col < p.dk;        // idle columns keep S = 0 and U = 0
    let hk = p.heads * p.dk;
    let kv = p.dk * p.dk;
    let c0 = 64u * half;          // this thread's channels c0 .. c0 + 63 (zero past K)
    let ns = C / BR;              // slices per phase
    let np = BR / 2u;             // rows of a slice each half finalizes
    let mine = np * half;         // where they start in the slice
    var s: array<vec4<f32>, 16>;
    if (live) {
        for (var q = 0u; q < 16u; q++) {
            let ch = c0 + 4u * q;
            if (ch < p.dk) {
                let at = h * kv + ch * p.dk + col;
                s[q] = vec4<f32>(state[at], state[at + p.dk], state[at + 2u * p.dk], state[at + 3u * p.dk]);
            }
        }
    }
    var pf = bs_fetch(0u, 0u, h, lid);
    for (var n = 0u; n < p.nchunks; n++) {
        let t0 = n * C;
        let nv = rows_in(n);
        let glast = (t0 + nv - 1u) * hk + h * p.dk;
        // S_n for kda_chunk_out.
        if (live) {
            let hb = (n * p.heads + h) * kv + col;
            for (var q = 0u; q < 16u; q++) {
                let ch = c0 + 4u * q;
                if (ch < p.dk) {
                    let at = hb + ch * p.dk;
                    hs[at] = s[q].x;
                    hs[at + p.dk] = s[q].y;
                    hs[at + 2u * p.dk] = s[q].z;
                    hs[at + 3u * p.dk] = s[q].w;
                }
            }
        }
        var own: array<f32, BR / 2u>;
        var uin: array<f32, BR / 2u>;
        var dec: array<vec4<f32>, 16>;
        for (var g = 0u; g < 2u * ns; g++) {
            let sb = (g % 2u) * 32u * BR;
            for (var i = 0u; i < BR * 16u / BC; i++) {
                bs_t[sb + lid + i * 2u * BC] = pf[i];
            }
            workgroupBarrier();
            if (g + 1u < 2u * ns) {
                pf = bs_fetch(n, g + 1u, h, lid);
            } else {
                pf = bs_fetch(n + 1u, 0u, h, lid);
            }
            if (g + 1u == ns) {
                // Gamma_last of this half's channels, a stage before the decay.
                for (var q = 0u; q < 16u; q++) {
                    let ch = c0 + 4u * q;
                    if (ch < p.dk) {
                        let ga = glast + ch;
                        dec[q] = vec4<f32>(gam[ga], gam[ga + 1u], gam[ga + 2u], gam[ga + 3u]);
                    }
                }
            }
            if (g >= 1u && g <= ns) {
                // This half's rows of slice g - 1: U = u - own - other (0 past the end and in
                // idle columns: w rows and u are 0 there).
                for (var j = 0u; j < BR / 2u; j++) {
                    let r = (g - 1u) * BR + mine + j;
                    let uu = uin[j] - own[j] - bs_x[r * BC + lane];
                    if (r < nv && live) {
                        u[(t0 + r) * hk + h * p.dk + col] = uu;
                    }
                    bs_x[r * BC + lane] = uu;
                }
            }
            if (g < ns) {
                let r0 = g * BR;
                var part: array<f32, BR>;
                for (var rr = 0u; rr < BR; rr++) {
                    // Four chains per row; the quads are the same for every lane of a half.
                    let wb = sb + rr * 32u + 16u * half;
                    var a = vec4<f32>(0.0);
                    for (var q = 0u; q < 16u; q++) {
                        a += bs_t[wb + q] * s[q];
                    }
                    part[rr] = (a.x + a.y) + (a.z + a.w);
                }
                for (var j = 0u; j < BR / 2u; j++) {
                    own[j] = select(part[j], part[BR / 2u + j], half == 1u);
                    bs_x[(r0 + np - mine + j) * BC + lane] = select(part[BR / 2u + j], part[j], half == 1u);
                    let r = r0 + mine + j;
                    uin[j] = 0.0;
                    if (r < nv && live) {
                        uin[j] = u[(t0 + r) * hk + h * p.dk + col];
                    }
                }
            } else {
                if (g == ns) {
                    for (var q = 0u; q < 16u; q++) {
                        s[q] *= exp(dec[q]);
                    }
                }
                let r0 = (g - ns) * BR;
                for (var rr = 0u; rr < BR; rr++) {
                    let x = bs_x[(r0 + rr) * BC + lane];
                    let kb = sb + rr * 32u + 16u * half;
                    for (var q = 0u; q < 16u; q++) {
                        s[q] += bs_t[kb + q] * x;
                    }
                }
            }
        }
    }
    if (live) {
        for (var q = 0u; q < 16u; q++) {
            let ch = c0 + 4u * q;
            if (ch < p.dk) {
                let at = h * kv + ch * p.dk + col;
                state[at] = s[q].x;
                state[at + p.dk] = s[q].y;
                state[at + 2u * p.dk] = s[q].z;
                state[at + 3u * p.dk] = s[q].w;
            }
        }
    }
}
