// Included by the paged-cache kernels (params `p` with page0 and shift_max).

// Page geometry: page i holds page0 << min(i, shift_max) rows; returns (page, row in page).
fn locate(pos: u32) -> vec2<u32> {
    let doubling_end = p.page0 * ((2u << p.shift_max) - 1u);
    if (pos < doubling_end) {
        let i = firstLeadingBit(pos / p.page0 + 1u);
        return vec2<u32>(i, pos - p.page0 * ((1u << i) - 1u));
    }
    let big = p.page0 << p.shift_max;
    let j = (pos - doubling_end) / big;
    return vec2<u32>(p.shift_max + 1u + j, pos - doubling_end - j * big);
}
