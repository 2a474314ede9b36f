//! The model graph's own small ops (embedding gather, AttnRes with its RMSNorm) against the CPU.

mod support;

use k31_engine::gpu::GpuTensor;
use k31_engine::layout::DType;
use k31_engine::ops::embed;
use support::{gpu, random_vec};

#[test]
fn embedding_gather_across_table_chunks() {
    let Some(g) = gpu() else { return };
    let (vocab, d) = (301, 34);
    let table = random_vec(1, vocab * d);
    let ids: Vec<u32> = vec![0, 300, 17, 17, 150, 299, 1];
    for dtype in [DType::BF16, DType::F32] {
        let (bytes, want_table): (Vec<u8>, Vec<f32>) = match dtype {
            DType::BF16 => {
                let b: Vec<half::bf16> = table.iter().map(|&x| half::bf16::from_f32(x)).collect();
                (bytemuck::cast_slice(&b).to_vec(), b.iter().map(|x| x.to_f32()).collect())
            }
            _ => (bytemuck::cast_slice(&table).to_vec(), table.clone()),
        };
        // Small chunks: ids land in different buffers.
        let t = GpuTensor::upload(&g, "embed", dtype, &[vocab, d], &bytes, Some(4096)).expect("upload");
        assert!(t.chunks.len() > 5);
        let idb = g.storage_from("ids", &ids);
        let out = g.storage("out", (ids.len() * d * 4) as u64);
        let mut enc = g.device.create_command_encoder(&Default::default());
        embed::embed(&g, &mut enc, &t, ids.len(), &idb, &out, None).expect("embed");
        g.queue.submit([enc.finish()]);
        let got: Vec<f32> = g.read(&out, ids.len() * d).expect("read");
        for (i, &id) in ids.iter().enumerate() {
            assert_eq!(&got[i * d..(i + 1) * d], &want_table[id as usize * d..(id as usize + 1) * d], "{dtype:?} token {i}");
        }
    }
}

/// The fused AttnRes + RMSNorm pass (decode and prefill shapes): bank and current partial,
/// with and without the residual sum, awkward widths, against the CPU references.
#[test]
fn attn_res_norm_matches_reference() {
    use k31_engine::ops::attn_res::{self, Query, Sources};
    use k31_engine::reference;
    let Some(g) = gpu() else { return };
    let bf16 = |v: Vec<f32>| -> Vec<f32> { v.iter().map(|&x| half::bf16::from_f32(x).to_f32()).collect() };
    let bytes = |v: &[f32]| -> Vec<u8> { bytemuck::cast_slice(&v.iter().map(|&x| half::bf16::from_f32(x)).collect::<Vec<_>>()).to_vec() };
    let rel = support::golden::rel_err;
    let eps = 1e-5;
    let cases = [
        (1, 7168, 8, true),
        (1, 2500, 15, false),
        (3, 37, 0, true),
        (2, 1, 2, true),
        (5, 1030, 4, false),
        (1, 100, 0, false),
        // attn_res_one's edges: its widest rows (two vec4 per thread), 16 sources, ragged
        // source splits (9 and 7 sources over 1024 threads), a single vec4.
        (2, 8192, 8, true),
        (3, 8188, 6, false),
        (2, 12, 15, true),
        (1, 4, 0, true),
        // The subgroup passes' widest mix on an 8-lane adapter: 8 sources.
        (1, 7168, 7, true),
    ];
    let paths = [attn_res::AttnResPath::TwoPass, attn_res::AttnResPath::TwoPassPortable, attn_res::AttnResPath::OneDispatch];
    for (path, (t, d, n_bank, add)) in paths.into_iter().flat_map(|p| cases.map(|c| (p, c))) {
        if path == attn_res::AttnResPath::OneDispatch && !attn_res::one_fits(&g, d, t * d) {
            continue;
        }
        let seed = (t * 1000 + d + n_bank) as u64;
        let bank: Vec<f32> = random_vec(seed, n_bank.max(1) * t * d);
        let cur = random_vec(seed + 1, t * d);
        let addend = random_vec(seed + 2, t * d);
        let gamma = bf16(random_vec(seed + 3, d).iter().map(|v| 1.0 + 0.1 * v).collect());
        let proj = bf16(random_vec(seed + 4, d));
        let norm_w = bf16(random_vec(seed + 5, d).iter().map(|v| 1.0 + 0.5 * v).collect());
        let (bb, cb, ab) = (g.storage_from("bank", &bank), g.storage_from("cur", &cur), g.storage_from("addend", &addend));
        let (gb, pb, nb) = (g.storage_from("gamma", &bytes(&gamma)), g.storage_from("proj", &bytes(&proj)), g.storage_from("norm", &bytes(&norm_w)));
        let part = g.storage("part", (t * d * 4) as u64);
        let out = g.storage("out", (t * d * 4) as u64);
        let alpha = g.storage("alpha", (attn_res::alpha_len(t, d, n_bank + 1) * 4) as u64);
        let sources = Sources { bank: &bb, n_bank, bank_stride: t * d, cur: &cb, add: add.then_some((&ab, &part)) };
        let mut enc = g.device.create_command_encoder(&Default::default());
        attn_res::attn_res_norm_via(&g, &mut enc, path, t, d, eps, sources, Query { gamma: &gb, proj: &pb }, &nb, &out, &alpha, None).expect("attn_res_norm");
        g.queue.submit([enc.finish()]);
        let got: Vec<f32> = g.read(&out, t * d).expect("read");
        let got_alpha: Vec<f32> = g.read(&alpha, t * (n_bank + 1)).expect("read");
        let got_part: Vec<f32> = g.read(&part, t * d).expect("read");
        for tok in 0..t {
            let c: Vec<f32> = (0..d).map(|i| cur[tok * d + i] + if add { addend[tok * d + i] } else { 0.0 }).collect();
            let mut srcs: Vec<&[f32]> = (0..n_bank).map(|j| &bank[(j * t + tok) * d..(j * t + tok + 1) * d]).collect();
            srcs.push(&c);
            let (h, want_alpha) = reference::attn_res::attn_res(&srcs, &gamma, &proj, eps);
            let want = reference::norm::rms_norm(&h, 1, d, &norm_w, eps);
            let case = format!("{path:?} t={t} d={d} n_bank={n_bank} add={add} token {tok}");
            let e = rel(&got[tok * d..(tok + 1) * d], &want);
            assert!(e < 1e-5, "{case}: out {e}");
            let ea = rel(&got_alpha[tok * (n_bank + 1)..(tok + 1) * (n_bank + 1)], &want_alpha);
            assert!(ea < 1e-5, "{case}: alpha {ea}");
            if add {
                assert_eq!(&got_part[tok * d..(tok + 1) * d], &c[..], "{case}: the residual sum");
            }
        }
    }
}

/// The MLP gate activations over magnitudes from 2^-14 to 2^6 (SiTU's tanh near zero cancels
/// if computed as (1 - e^-2x) / (1 + e^-2x): ~1e-3 there), against the f64 reference, element
/// by element (1e-5: f32 exp of arguments near 50 is a few ulp off by itself).
#[test]
fn glu_matches_reference_at_every_magnitude() {
    use k31_engine::config::Activation;
    use k31_engine::ops::norm;
    let Some(g) = gpu() else { return };
    let n = 4099;
    let (gr, ur) = (random_vec(7, n), random_vec(8, n));
    let scale = |i: usize| 2f32.powi((i % 21) as i32 - 14);
    let gate: Vec<f32> = (0..n).map(|i| gr[i] * scale(i)).collect();
    let up: Vec<f32> = (0..n).map(|i| ur[i] * scale(i / 21)).collect();
    let (gb, ub, out) = (g.storage_from("gate", &gate), g.storage_from("up", &up), g.storage("out", (n * 4) as u64));
    for act in [Activation::Situ { beta: 4.0, linear_beta: Some(8.0) }, Activation::Situ { beta: 1.5, linear_beta: None }, Activation::Silu] {
        let mut enc = g.device.create_command_encoder(&Default::default());
        norm::glu(&g, &mut enc, act, n, &gb, &ub, &out, None).expect("glu");
        g.queue.submit([enc.finish()]);
        let got: Vec<f32> = g.read(&out, n).expect("read");
        for i in 0..n {
            let want = k31_engine::reference::moe::glu(act, gate[i] as f64, up[i] as f64);
            let err = (got[i] as f64 - want).abs() / want.abs().max(1e-30);
            assert!(err < 1e-5, "{act:?} element {i}: gate {} up {}: got {} want {want} (rel {err:.1e})", gate[i], up[i], got[i]);
        }
    }
}
