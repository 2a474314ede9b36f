// Embedding gather out[t, :] = table[ids[t], :] for the ids that fall in one row chunk of the
// table (chunk rows first_row .. first_row + rows); other ids are left to their chunk's pass.
// Preconditions (host-checked): ids < vocab; out holds [tokens, d] f32; bf16 rows are packed
// two per u32 (element 2i in the low half) and d is even; f32 tables use `table_f32`.

struct EmbedParams {
    tokens: u32,
    d: u32,
    first_row: u32,
    rows: u32,
}

@group(0) @binding(0) var<uniform> p: EmbedParams;
@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(2) var<storage, read> table: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<storage, read> table_f32: array<f32>;

// One workgroup per token; threads stride over the row.
@compute @workgroup_size(256)
fn embed_bf16(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wg.x + wg.y * nwg.x;
    if (t >= p.tokens) {
        return;
    }
    let id = ids[t];
    if (id < p.first_row || id >= p.first_row + p.rows) {
        return;
    }
    let base = (id - p.first_row) * (p.d / 2u);
    for (var j = lid; j < p.d / 2u; j += 256u) {
        let word = table[base + j];
        out[t * p.d + 2u * j] = bitcast<f32>(word << 16u);
        out[t * p.d + 2u * j + 1u] = bitcast<f32>(word & 0xffff0000u);
    }
}

@compute @workgroup_size(256)
fn embed_f32(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wg.x + wg.y * nwg.x;
    if (t >= p.tokens) {
        return;
    }
    let id = ids[t];
    if (id < p.first_row || id >= p.first_row + p.rows) {
        return;
    }
    let base = (id - p.first_row) * p.d;
    for (var j = lid; j < p.d; j += 256u) {
        out[t * p.d + j] = table_f32[base + j];
    }
}
