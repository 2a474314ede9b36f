// The coop indexers' key staging (dsa_index_coop.wgsl, dsa_index_coop_mq.wgsl): bf16 key rows
// into the f16 tile kt (scaled by KEY_SCALE into f16's exact range with EXACT, positions beyond
// it flagged in bad) and the f32 score of a flagged position. The including file declares p, kt,
// bad, ws, KS4, ROWS, KEY_SCALE, EXACT, IH, ID, KV4 and includes lib/index_keys.wgsl,
// lib/index_query.wgsl and lib/page_locate.wgsl.

fn bf_lo(x: u32) -> f32 {
    return bitcast<f32>(x << 16u);
}

fn bf_hi(x: u32) -> f32 {
    return bitcast<f32>(x & 0xffff0000u);
}

// 16-byte chunk lid % 16 of key row r (zero past n_pos).
fn key_row(r: u32, lid: u32) -> vec4<u32> {
    if (r >= p.n_pos) {
        return vec4<u32>(0u);
    }
    let a = locate(r);
    return key_vec(a.x, a.y * 16u + lid % 16u);
}

// Load j of this thread as f16 into its tile row (scaled into the exact range with EXACT).
fn stage_keys(v: vec4<u32>, j: u32, lid: u32) {
    let row = lid / 16u + j * ROWS;
    let at = row * KS4 + (lid % 16u) * 2u;
    let f0 = vec4<f32>(bf_lo(v.x), bf_hi(v.x), bf_lo(v.y), bf_hi(v.y));
    let f1 = vec4<f32>(bf_lo(v.z), bf_hi(v.z), bf_lo(v.w), bf_hi(v.w));
    var ks = 1.0;
    if (EXACT) {
        ks = KEY_SCALE;
        let m4 = max(abs(f0), abs(f1));
        if (!(max(max(m4.x, m4.y), max(m4.z, m4.w)) * KEY_SCALE <= 65504.0)) {
            bad[row] = 1u;
        }
    }
    kt[at] = vec4<f16>(f0 * ks);
    kt[at + 1u] = vec4<f16>(f1 * ks);
}

// f32 score of query t at one position straight from the bf16 key (the out-of-range fallback),
// with the head weights ws[wbase ..].
fn exact_score(wbase: u32, t: u32, pos: u32) -> f32 {
    let at = locate(pos);
    var s = 0.0;
    for (var h = 0u; h < IH; h++) {
        var d = 0.0;
        for (var c = 0u; c < ID / 8u; c++) {
            let kw = key_vec(at.x, at.y * (ID / 8u) + c);
            let ka = vec4<f32>(bf_lo(kw.x), bf_hi(kw.x), bf_lo(kw.y), bf_hi(kw.y));
            let kb = vec4<f32>(bf_lo(kw.z), bf_hi(kw.z), bf_lo(kw.w), bf_hi(kw.w));
            let qi = t * (IH * KV4) + h * KV4 + 2u * c;
            d += dot(query4(qi), ka) + dot(query4(qi + 1u), kb);
        }
        s += ws[wbase + h] * max(d, 0.0);
    }
    return s;
}
