//! MoE, router, MXFP4, RMSNorm, AttnRes and GEMV kernels against their CPU references
//! and the goldens tests/golden/ops/{moe,attn_res,mxfp4}.safetensors (run on lavapipe).

mod support;

use k31_engine::config::{Activation, ExpertFormat, RouterConfig};
use k31_engine::experts::{ExpertStore, ExpertWeights, SlotLayout};
use k31_engine::gpu::{Gpu, GpuTensor};
use k31_engine::layout::DType;
use k31_engine::ops::{attn_res, gemv, linear, moe, norm, router};
use k31_engine::reference;
use support::golden;
use k31_engine::wgpu;

const SITU: Activation = Activation::Situ { beta: 4.0, linear_beta: Some(25.0) };

fn bf16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|&x| half::bf16::from_f32(x).to_le_bytes()).collect()
}
fn bf16_round(v: &[f32]) -> Vec<f32> {
    v.iter().map(|&x| half::bf16::from_f32(x).to_f32()).collect()
}
fn bf16_tensor(gpu: &Gpu, name: &str, rows: usize, cols: usize, v: &[f32]) -> GpuTensor {
    GpuTensor::upload(gpu, name, DType::BF16, &[rows, cols], &bf16_bytes(v), None).expect("upload")
}
fn run(gpu: &Gpu, f: impl FnOnce(&mut wgpu::CommandEncoder)) {
    let mut enc = gpu.device.create_command_encoder(&Default::default());
    f(&mut enc);
    gpu.queue.submit([enc.finish()]);
}
fn rel_l2(got: &[f32], want: &[f32]) -> f64 {
    support::nmse(got, want).sqrt()
}
fn random_bytes(seed: u64, n: usize, lo: u8, hi: u8) -> Vec<u8> {
    let span = hi as u32 - lo as u32 + 1;
    support::random_vec(seed, n).iter().map(|&v| lo + (((v + 1.0) * 0.5 * span as f32) as u32).min(span - 1) as u8).collect()
}

#[test]
fn mxfp4_decode_is_bit_exact() {
    let Some(gpu) = support::gpu() else { return };
    let f = "ops/mxfp4.safetensors";
    let all = golden::load_tensors(f);
    for (case, rows, cols, reps) in [("table", 16, 32, 2), ("random", 64, 128, 1)] {
        let (_, _, packed) = golden::load_raw(f, &format!("{case}.packed"));
        let (_, _, scale) = golden::load_raw(f, &format!("{case}.scale"));
        let want = &golden::get(&all, &format!("{case}.dequant")).1;
        // Slots need widths that are multiples of 32: repeat the rows.
        let (packed, scale, want): (Vec<u8>, Vec<u8>, Vec<f32>) =
            (packed.repeat(reps), scale.repeat(reps), want.repeat(reps));
        let (n_mid, n_in) = (rows * reps, cols);
        let layout = SlotLayout::new(ExpertFormat::Mxfp4, n_in, n_mid).unwrap();
        let mut store = ExpertStore::new(&gpu, layout, 1, 2, 2).unwrap();
        let w2p = vec![0u8; n_in * n_mid / 2];
        let w2s = vec![127u8; n_in * n_mid / 32];
        let w = ExpertWeights::Mxfp4 { w1: (&packed, &scale), w3: (&packed, &scale), w2: (&w2p, &w2s) };
        store.fill(&gpu, 0, 1, &w).unwrap();
        let out = gpu.storage("dequant", (n_mid * n_in * 4) as u64);
        run(&gpu, |enc| moe::mxfp4_dequant(&gpu, enc, &store, 0, 1, &out).unwrap());
        let got: Vec<u32> = gpu.read(&out, n_mid * n_in).unwrap();
        let cpu = reference::numerics::dequant_mxfp4(&packed, &scale, n_mid, n_in);
        for i in 0..got.len() {
            assert_eq!(got[i], want[i].to_bits(), "{case}: element {i}: {} vs golden {}", f32::from_bits(got[i]), want[i]);
            assert_eq!(got[i], cpu[i].to_bits(), "{case}: element {i} vs CPU reference");
        }
    }
}

fn router_cfg(groups: usize, topk_group: usize, scaling: f32) -> RouterConfig {
    RouterConfig { num_expert_group: groups, topk_group, renormalize: true, routed_scaling_factor: scaling }
}

/// Routes on the GPU; with `glu_n` > 0 the same dispatch also computes a SiTU GLU of that many
/// random values, checked here against the reference.
#[allow(clippy::too_many_arguments)]
fn gpu_route(gpu: &Gpu, cfg: &RouterConfig, t: usize, e: usize, k: usize, logits: &[f32], bias: &[f32], glu_n: usize) -> (Vec<u32>, Vec<f32>) {
    let lb = gpu.storage_from("logits", logits);
    let bb = gpu.storage_from("bias", bias);
    let idx = gpu.storage("idx", (t * k * 4) as u64);
    let wts = gpu.storage("wts", (t * k * 4) as u64);
    let g: Vec<f32> = support::random_vec(41, glu_n.max(1)).iter().map(|v| v * 30.0).collect();
    let u: Vec<f32> = support::random_vec(42, glu_n.max(1)).iter().map(|v| v * 60.0).collect();
    let (gb, ub, ab) = (gpu.storage_from("g", &g), gpu.storage_from("u", &u), gpu.storage("a", (glu_n.max(1) * 4) as u64));
    let glu = (glu_n > 0).then_some(router::GluJob { act: SITU, n: glu_n, gate: &gb, up: &ub, out: &ab });
    run(gpu, |enc| router::router_select(gpu, enc, cfg, t, e, k, &lb, &bb, &idx, &wts, glu, None).unwrap());
    if glu_n > 0 {
        let got: Vec<f32> = gpu.read(&ab, glu_n).unwrap();
        let want: Vec<f32> = g.iter().zip(&u).map(|(&a, &b)| reference::moe::glu(SITU, a as f64, b as f64) as f32).collect();
        assert!(rel_l2(&got, &want) < 1e-6, "GLU of {glu_n} in the router dispatch");
    }
    (gpu.read(&idx, t * k).unwrap(), gpu.read(&wts, t * k).unwrap())
}

#[test]
fn router_matches_reference_with_and_without_groups() {
    let Some(gpu) = support::gpu() else { return };
    for (t, e, k, groups, tg, scaling, glu_n) in [
        (1, 16, 4, 1, 1, 1.0, 0),
        (17, 33, 5, 1, 1, 2.446, 1),
        (5, 64, 8, 8, 3, 1.0, 0),
        (3, 127, 1, 1, 1, 1.0, 257),
        (2, 896, 16, 1, 1, 2.5, 2 * 6144 + 3),
        (2, 1000, 64, 8, 4, 1.0, 0),
        (3, 1000, 64, 1, 1, 1.0, 0),
        (4, 896, 16, 1, 1, 2.5, 0),
    ] {
        let cfg = router_cfg(groups, tg, scaling);
        let mut logits = support::random_vec(t as u64, t * e).iter().map(|v| v * 4.0).collect::<Vec<_>>();
        // Exact ties: the lower index must win.
        logits[1] = logits[0];
        let bias: Vec<f32> = support::random_vec(99, e).iter().map(|v| v * 0.05).collect();
        if t == 4 {
            // Every key equal: the lowest ids, in id order.
            logits.iter_mut().for_each(|v| *v = 0.5);
        }
        let bias: Vec<f32> = if t == 4 { vec![0.0; e] } else { bias };
        let (idx, wts) = gpu_route(&gpu, &cfg, t, e, k, &logits, &bias, glu_n);
        for r in 0..t {
            let (ri, rw) = reference::moe::route(&cfg, &logits[r * e..(r + 1) * e], &bias, k);
            assert_eq!(&idx[r * k..(r + 1) * k], &ri[..], "token {r} of ({t}, {e}, {k}, groups {groups})");
            assert!(rel_l2(&wts[r * k..(r + 1) * k], &rw) < 1e-6, "weights of token {r}");
        }
    }
}

#[test]
fn router_rejects_more_groups_than_its_group_scores() {
    let Some(gpu) = support::gpu() else { return };
    let (e, k) = (1024, 4);
    let lb = gpu.storage("logits", (e * 4) as u64);
    let bb = gpu.storage("bias", (e * 4) as u64);
    let idx = gpu.storage("idx", (k * 4) as u64);
    let wts = gpu.storage("wts", (k * 4) as u64);
    let mut enc = gpu.device.create_command_encoder(&Default::default());
    let err = router::router_select(&gpu, &mut enc, &router_cfg(512, 8, 1.0), 1, e, k, &lb, &bb, &idx, &wts, None, None)
        .expect_err("512 groups under a group limit");
    assert!(err.to_string().contains("512 expert groups"), "{err}");
}

/// The golden LatentMoE layer (d 256, 16 experts top-4, latent 128, intermediate 64).
struct GoldenMoe {
    t: usize,
    x: Vec<f32>,
    f: HashMap,
}
type HashMap = std::collections::HashMap<String, golden::Tensor>;

fn golden_store(gpu: &Gpu, n_experts: usize) -> ExpertStore {
    let f = "ops/moe.safetensors";
    let layout = SlotLayout::new(ExpertFormat::Mxfp4, 128, 64).unwrap();
    let mut store = ExpertStore::new(gpu, layout, 2, n_experts, n_experts).unwrap();
    for e in (0..n_experts).rev() {
        let plane = |m: &str, p: &str| golden::load_raw(f, &format!("w.experts.{e}.{m}.weight_{p}")).2;
        let (w1p, w1s, w3p, w3s, w2p, w2s) = (plane("w1", "packed"), plane("w1", "scale"), plane("w3", "packed"), plane("w3", "scale"), plane("w2", "packed"), plane("w2", "scale"));
        // Layer 1 of the store; layer 0 stays empty so table_base matters.
        store.fill(gpu, 1, e, &ExpertWeights::Mxfp4 { w1: (&w1p, &w1s), w3: (&w3p, &w3s), w2: (&w2p, &w2s) }).unwrap();
    }
    store
}

fn golden_moe() -> GoldenMoe {
    let f = golden::load_tensors("ops/moe.safetensors");
    let x = golden::get(&f, "x").1.clone();
    GoldenMoe { t: 17, x, f }
}

#[test]
fn latent_moe_matches_golden_decode_and_grouped() {
    let Some(gpu) = support::gpu() else { return };
    let g = golden_moe();
    let (t, d, e, k, lm) = (g.t, 256, 16, 4, 128);
    let w = |n: &str| golden::get(&g.f, &format!("w.{n}")).1.clone();
    let gate = bf16_tensor(&gpu, "gate", e, d, &w("gate.weight"));
    let down = bf16_tensor(&gpu, "down", lm, d, &w("routed_expert_down_proj.weight"));
    let up = bf16_tensor(&gpu, "up", d, lm, &w("routed_expert_up_proj.weight"));
    let sg = bf16_tensor(&gpu, "sg", 128, d, &w("shared_experts.gate_proj.weight"));
    let su = bf16_tensor(&gpu, "su", 128, d, &w("shared_experts.up_proj.weight"));
    let sd = bf16_tensor(&gpu, "sd", d, 128, &w("shared_experts.down_proj.weight"));
    let norm_w = gpu.storage_from("norm", &bf16_bytes(&w("routed_expert_norm.weight")));
    let bias = gpu.storage_from("bias", &w("gate.e_score_correction_bias"));
    let store = golden_store(&gpu, e);
    let x = gpu.storage_from("x", &g.x);
    let buf = |n: usize| gpu.storage("buf", (n * 4) as u64);
    let (logits, z, idx, wts, h, lat) = (buf(t * e), buf(t * lm), buf(t * k), buf(t * k), buf(t * k * 64), buf(t * lm));
    let (lat2, latn, r, s1, s2, s3, y) = (buf(t * lm), buf(t * lm), buf(t * d), buf(t * 128), buf(t * 128), buf(t * 128), buf(t * d));
    let cfg = router_cfg(1, 1, 1.0);
    let call = moe::ExpertCall { layer: 1, tokens: t, top_k: k, act: SITU, accumulate: false };
    let scratch = moe::GroupedScratch::new(&gpu, &store, t, k);
    run(&gpu, |enc| {
        linear::linear(&gpu, enc, &gate, t, &x, &logits, None).unwrap();
        router::router_select(&gpu, enc, &cfg, t, e, k, &logits, &bias, &idx, &wts, None, None).unwrap();
        linear::linear(&gpu, enc, &down, t, &x, &z, None).unwrap();
        moe::experts_decode(&gpu, enc, &store, &call, None, &z, &idx, &wts, &h, &lat, None).unwrap();
        moe::experts_grouped(&gpu, enc, &store, &call, &z, &idx, &wts, &scratch, &lat2, None).unwrap();
        norm::rms_norm(&gpu, enc, t, lm, 1e-5, &lat, &norm_w, &latn, None).unwrap();
        linear::linear(&gpu, enc, &up, t, &latn, &r, None).unwrap();
        linear::linear(&gpu, enc, &sg, t, &x, &s1, None).unwrap();
        linear::linear(&gpu, enc, &su, t, &x, &s2, None).unwrap();
        norm::glu(&gpu, enc, SITU, t * 128, &s1, &s2, &s3, None).unwrap();
        linear::linear(&gpu, enc, &sd, t, &s3, &y, None).unwrap();
    });
    let got_idx: Vec<u32> = gpu.read(&idx, t * k).unwrap();
    let got_w: Vec<f32> = gpu.read(&wts, t * k).unwrap();
    let ints = golden::load_int_tensors("ops/moe.safetensors");
    let gidx = &ints["router.idx"].1;
    let gw = &golden::get(&g.f, "router.weights").1;
    for r in 0..t {
        let mut a: Vec<i64> = got_idx[r * k..(r + 1) * k].iter().map(|&v| v as i64).collect();
        let mut b = gidx[r * k..(r + 1) * k].to_vec();
        a.sort();
        b.sort();
        assert_eq!(a, b, "router set of token {r}");
    }
    assert!(golden::rel_err(&got_w, gw) < 1e-5, "router weights");
    let want_lat = &golden::get(&g.f, "latent").1;
    let l1: Vec<f32> = gpu.read(&lat, t * lm).unwrap();
    let l2: Vec<f32> = gpu.read(&lat2, t * lm).unwrap();
    eprintln!("latent rel err: decode {:.2e}, grouped {:.2e}", rel_l2(&l1, want_lat), rel_l2(&l2, want_lat));
    assert!(rel_l2(&l1, want_lat) < 1e-4, "decode latent {}", rel_l2(&l1, want_lat));
    assert!(rel_l2(&l2, want_lat) < 1e-4, "grouped latent {}", rel_l2(&l2, want_lat));
    let rv: Vec<f32> = gpu.read(&r, t * d).unwrap();
    let yv: Vec<f32> = gpu.read(&y, t * d).unwrap();
    let out: Vec<f32> = rv.iter().zip(&yv).map(|(a, b)| a + b).collect();
    let want_y = &golden::get(&g.f, "y").1;
    eprintln!("moe output rel err {:.2e}", rel_l2(&out, want_y));
    assert!(rel_l2(&out, want_y) < 1e-4);
}

/// A one-layer store of `e` random experts (MXFP4 with scales 2^-9..2^-1, or bf16) and
/// their dense f32 twins for the CPU reference.
fn random_experts(gpu: &Gpu, format: ExpertFormat, n_in: usize, n_mid: usize, e: usize) -> (ExpertStore, Vec<reference::moe::DenseExpert>) {
    let layout = SlotLayout::new(format, n_in, n_mid).unwrap();
    let mut store = ExpertStore::new(gpu, layout, 1, e, e).unwrap();
    let mut dense = Vec::new();
    for ex in 0..e {
        let seed = 100 + ex as u64;
        match format {
            ExpertFormat::Mxfp4 => {
                let mk = |s: u64, rows: usize, cols: usize| (random_bytes(s, rows * cols / 2, 0, 255), random_bytes(s + 7, rows * cols / 32, 118, 126));
                let (w1, w3, w2) = (mk(seed, n_mid, n_in), mk(seed + 20, n_mid, n_in), mk(seed + 40, n_in, n_mid));
                store.fill(gpu, 0, ex, &ExpertWeights::Mxfp4 { w1: (&w1.0, &w1.1), w3: (&w3.0, &w3.1), w2: (&w2.0, &w2.1) }).unwrap();
                let dq = |p: &(Vec<u8>, Vec<u8>), r, c| reference::numerics::dequant_mxfp4(&p.0, &p.1, r, c);
                dense.push(reference::moe::DenseExpert { w1: dq(&w1, n_mid, n_in), w3: dq(&w3, n_mid, n_in), w2: dq(&w2, n_in, n_mid) });
            }
            ExpertFormat::Bf16 => {
                let mk = |s: u64, n: usize| bf16_round(&support::random_vec(s, n).iter().map(|v| v * 0.3).collect::<Vec<_>>());
                let (w1, w3, w2) = (mk(seed, n_mid * n_in), mk(seed + 20, n_mid * n_in), mk(seed + 40, n_in * n_mid));
                store.fill(gpu, 0, ex, &ExpertWeights::Bf16 { w1: &bf16_bytes(&w1), w3: &bf16_bytes(&w3), w2: &bf16_bytes(&w2) }).unwrap();
                dense.push(reference::moe::DenseExpert { w1, w3, w2 });
            }
        }
    }
    (store, dense)
}

/// Random experts (MXFP4 SiTU and bf16 SiLU) at awkward token counts, decode and grouped
/// paths vs the CPU reference; many tokens on one expert cross the 16-token tiles.
#[test]
fn experts_match_reference_at_awkward_shapes() {
    let Some(gpu) = support::gpu() else { return };
    for (format, act, n_in, n_mid, e, k, t) in [
        (ExpertFormat::Mxfp4, SITU, 64, 96, 5, 2, 1),
        (ExpertFormat::Mxfp4, SITU, 96, 32, 3, 3, 37),
        (ExpertFormat::Bf16, Activation::Silu, 40, 24, 4, 2, 19),
    ] {
        let (store, dense) = random_experts(&gpu, format, n_in, n_mid, e);
        let z = support::random_vec(7, t * n_in);
        // Token r picks experts (r % 2, then rotating ones): expert 0 gets about half the tokens.
        let mut idx = Vec::new();
        for r in 0..t {
            let mut chosen = vec![(r % 2) as u32];
            let mut c = (r % e) as u32;
            while chosen.len() < k {
                if !chosen.contains(&c) {
                    chosen.push(c);
                }
                c = (c + 1) % e as u32;
            }
            idx.extend(chosen);
        }
        let wts: Vec<f32> = support::random_vec(8, t * k).iter().map(|v| v.abs() + 0.1).collect();
        let (zb, ib, wb) = (gpu.storage_from("z", &z), gpu.storage_from("idx", &idx), gpu.storage_from("wts", &wts));
        let h = gpu.storage("h", (t * k * n_mid * 4) as u64);
        let grouped: Vec<moe::GroupedKernels> =
            moe::GROUPED_VARIANTS.iter().copied().filter(|&g| moe::grouped_supported(&gpu, &store.layout, g)).collect();
        let y2s: Vec<_> = grouped.iter().map(|_| gpu.storage("y2", (t * n_in * 4) as u64)).collect();
        let call = moe::ExpertCall { layer: 0, tokens: t, top_k: k, act, accumulate: false };
        let scratch = moe::GroupedScratch::new(&gpu, &store, t, k);
        // Every decode variant the adapter runs (the bf16 store ignores the choice), and the default.
        let variants: Vec<Option<moe::DecodeKernels>> =
            std::iter::once(None).chain(moe::DECODE_VARIANTS.iter().filter(|v| moe::decode_supported(&gpu, &store.layout, v)).map(|v| Some(*v))).collect();
        let ys: Vec<_> = variants.iter().map(|_| gpu.storage("y", (t * n_in * 4) as u64)).collect();
        run(&gpu, |enc| {
            for (v, y) in variants.iter().zip(&ys) {
                moe::experts_decode(&gpu, enc, &store, &call, *v, &zb, &ib, &wb, &h, y, None).unwrap();
            }
            for (g, y2) in grouped.iter().zip(&y2s) {
                moe::experts_grouped_with(&gpu, enc, &store, &call, Some(*g), &zb, &ib, &wb, &scratch, y2, None).unwrap();
            }
        });
        let mut want = Vec::new();
        for r in 0..t {
            want.extend(reference::moe::experts(act, &dense, n_in, n_mid, &idx[r * k..(r + 1) * k], &wts[r * k..(r + 1) * k], &z[r * n_in..(r + 1) * n_in]));
        }
        for (v, y) in variants.iter().zip(&ys) {
            let e = rel_l2(&gpu.read::<f32>(y, t * n_in).unwrap(), &want);
            let name = v.map_or("default", |v| v.name);
            eprintln!("{format:?} t={t}: decode {name}: {e:.2e}");
            assert!(e < 1e-5, "{format:?} t={t}: decode {name}: {e}");
        }
        for (g, y2) in grouped.iter().zip(&y2s) {
            let e2 = rel_l2(&gpu.read::<f32>(y2, t * n_in).unwrap(), &want);
            eprintln!("{format:?} t={t}: grouped {}: {e2:.2e}", g.name());
            assert!(e2 < 1e-5, "{format:?} t={t}: grouped {}: {e2}", g.name());
        }
        // Accumulating into a residual: every decode variant and the grouped path add to y.
        let base = support::random_vec(11, t * n_in);
        let acc_call = moe::ExpertCall { accumulate: true, ..call };
        let acc_ys: Vec<_> = variants.iter().map(|_| gpu.storage_from("y base", &base)).collect();
        let acc_y2s: Vec<_> = grouped.iter().map(|_| gpu.storage_from("y2 base", &base)).collect();
        run(&gpu, |enc| {
            for (v, y) in variants.iter().zip(&acc_ys) {
                moe::experts_decode(&gpu, enc, &store, &acc_call, *v, &zb, &ib, &wb, &h, y, None).unwrap();
            }
            for (g, y2) in grouped.iter().zip(&acc_y2s) {
                moe::experts_grouped_with(&gpu, enc, &store, &acc_call, Some(*g), &zb, &ib, &wb, &scratch, y2, None).unwrap();
            }
        });
        let want_acc: Vec<f32> = want.iter().zip(&base).map(|(a, b)| a + b).collect();
        for (v, y) in variants.iter().zip(&acc_ys) {
            let e = rel_l2(&gpu.read::<f32>(y, t * n_in).unwrap(), &want_acc);
            assert!(e < 1e-5, "{format:?} t={t}: accumulating decode {}: {e}", v.map_or("default", |v| v.name));
        }
        for (g, y2) in grouped.iter().zip(&acc_y2s) {
            let e = rel_l2(&gpu.read::<f32>(y2, t * n_in).unwrap(), &want_acc);
            assert!(e < 1e-5, "{format:?} t={t}: accumulating grouped {}: {e}", g.name());
        }
    }
}

#[test]
fn attn_res_matches_golden() {
    let Some(gpu) = support::gpu() else { return };
    let f = golden::load_tensors("ops/attn_res.safetensors");
    let (t, d) = (5, 256);
    for n in 2..=9 {
        let src = &golden::get(&f, &format!("n{n}.sources")).1; // [t, n, d]
        let gamma = &golden::get(&f, &format!("n{n}.norm_weight")).1;
        let proj = &golden::get(&f, &format!("n{n}.proj_weight")).1;
        // Bank entries j < n-1 as [n-1, t, d]; the last source is the current partial.
        let mut bank = vec![0f32; (n - 1) * t * d];
        let mut cur = vec![0f32; t * d];
        for tok in 0..t {
            for j in 0..n {
                let row = &src[(tok * n + j) * d..(tok * n + j + 1) * d];
                if j < n - 1 {
                    bank[(j * t + tok) * d..(j * t + tok + 1) * d].copy_from_slice(row);
                } else {
                    cur[tok * d..(tok + 1) * d].copy_from_slice(row);
                }
            }
        }
        let (bb, cb) = (gpu.storage_from("bank", &bank), gpu.storage_from("cur", &cur));
        let (gb, pb) = (gpu.storage_from("gamma", &bf16_bytes(gamma)), gpu.storage_from("proj", &bf16_bytes(proj)));
        let out = gpu.storage("out", (t * d * 4) as u64);
        let alpha = gpu.storage("alpha", (attn_res::alpha_len(t, d, n) * 4) as u64);
        run(&gpu, |enc| attn_res::attn_res(&gpu, enc, t, d, n - 1, t * d, 1e-5, &bb, &cb, &gb, &pb, &out, &alpha, None).unwrap());
        let (o, a): (Vec<f32>, Vec<f32>) = (gpu.read(&out, t * d).unwrap(), gpu.read(&alpha, t * n).unwrap());
        let (wo, wa) = (&golden::get(&f, &format!("n{n}.out")).1, &golden::get(&f, &format!("n{n}.alpha")).1);
        assert!(rel_l2(&o, wo) < 1e-5, "n{n} out {}", rel_l2(&o, wo));
        assert!(rel_l2(&a, wa) < 1e-5, "n{n} alpha {}", rel_l2(&a, wa));
        // And the CPU reference agrees with the golden.
        let srcs: Vec<&[f32]> = (0..n).map(|j| &src[j * d..(j + 1) * d]).collect();
        let (ro, _) = reference::attn_res::attn_res(&srcs, gamma, proj, 1e-5);
        assert!(rel_l2(&ro, &wo[..d]) < 1e-6);
    }
}

/// AttnRes at a width of several column chunks and 9 sources (one token, the decode shape)
/// against the CPU reference.
#[test]
fn attn_res_wide_matches_reference() {
    let Some(gpu) = support::gpu() else { return };
    let (d, n) = (2500, 9);
    let src = support::random_vec(31, n * d);
    let gamma = bf16_round(&support::random_vec(32, d).iter().map(|v| 1.0 + 0.1 * v).collect::<Vec<_>>());
    let proj = bf16_round(&support::random_vec(33, d));
    let (bb, cb) = (gpu.storage_from("bank", &src[..(n - 1) * d]), gpu.storage_from("cur", &src[(n - 1) * d..]));
    let (gb, pb) = (gpu.storage_from("gamma", &bf16_bytes(&gamma)), gpu.storage_from("proj", &bf16_bytes(&proj)));
    let out = gpu.storage("out", (d * 4) as u64);
    let alpha = gpu.storage("alpha", (attn_res::alpha_len(1, d, n) * 4) as u64);
    run(&gpu, |enc| attn_res::attn_res(&gpu, enc, 1, d, n - 1, d, 1e-5, &bb, &cb, &gb, &pb, &out, &alpha, None).unwrap());
    let srcs: Vec<&[f32]> = (0..n).map(|j| &src[j * d..(j + 1) * d]).collect();
    let (want, want_alpha) = reference::attn_res::attn_res(&srcs, &gamma, &proj, 1e-5);
    let got: Vec<f32> = gpu.read(&out, d).unwrap();
    assert!(rel_l2(&got, &want) < 1e-5, "out {}", rel_l2(&got, &want));
    let ga: Vec<f32> = gpu.read(&alpha, n).unwrap();
    assert!(rel_l2(&ga, &want_alpha) < 1e-5, "alpha {}", rel_l2(&ga, &want_alpha));
}

#[test]
fn gemv_fast_path_and_linear_match_reference() {
    let Some(gpu) = support::gpu() else { return };
    // Narrow rows too (1, 3, 6 and 8 units: fewer than the lanes of a subgroup), row counts off
    // every block.
    for (rows, cols, t) in [(1, 8, 1), (17, 64, 3), (33, 136, 1), (301, 264, 1), (127, 40, 33), (65, 17, 2), (5, 20, 1), (40, 64, 1), (17, 64, 1), (77, 24, 1), (300, 48, 1), (3, 8, 1)] {
        let w = bf16_round(&support::random_vec(rows as u64, rows * cols));
        let wt = bf16_tensor(&gpu, "w", rows, cols, &w);
        let x = support::random_vec(5, t * cols);
        let xb = gpu.storage_from("x", &x);
        let y = gpu.storage("y", (t * rows * 4) as u64);
        let variants: Vec<Option<k31_engine::gpu::Kernel>> =
            std::iter::once(None).chain(gemv::FAST_VARIANTS.iter().filter(|k| !k.needs_subgroups || gpu.caps.subgroups).map(|k| Some(*k))).collect();
        for v in variants {
            if t == 1 {
                run(&gpu, |enc| gemv::gemv_into(&gpu, enc, &wt, &xb, &y, v, false, None).unwrap());
            } else {
                run(&gpu, |enc| linear::linear(&gpu, enc, &wt, t, &xb, &y, None).unwrap());
            }
            let got: Vec<f32> = gpu.read(&y, t * rows).unwrap();
            let mut want = Vec::new();
            for r in 0..t {
                want.extend(reference::gemv::gemv(&w, rows, cols, &x[r * cols..(r + 1) * cols]));
            }
            assert!(support::nmse(&got, &want) < 1e-10, "[{rows}, {cols}] x {t} {v:?}: nmse {}", support::nmse(&got, &want));
            // Accumulating: y already holds a residual; the product is added to it.
            let base = support::random_vec(9, t * rows);
            let yb = gpu.storage_from("y base", &base);
            if t == 1 {
                run(&gpu, |enc| gemv::gemv_into(&gpu, enc, &wt, &xb, &yb, v, true, None).unwrap());
            } else {
                run(&gpu, |enc| linear::linear_into(&gpu, enc, &wt, t, &xb, &yb, true, None).unwrap());
            }
            let got: Vec<f32> = gpu.read(&yb, t * rows).unwrap();
            let want: Vec<f32> = want.iter().zip(&base).map(|(a, b)| a + b).collect();
            assert!(support::nmse(&got, &want) < 1e-10, "accumulate [{rows}, {cols}] x {t} {v:?}: nmse {}", support::nmse(&got, &want));
        }
    }
}

/// gemv_many over matrices of `shapes` rows sharing a 264-wide x (the 301-row one in chunks of
/// 64 rows, as a tensor past one binding would be) equals one reference GEMV each.
fn gemv_many_vs_reference(gpu: &Gpu, shapes: &[usize]) {
    let cols = 264;
    let x = support::random_vec(5, cols);
    let xb = gpu.storage_from("x", &x);
    let mut ws = Vec::new();
    let mut tensors = Vec::new();
    for (i, &rows) in shapes.iter().enumerate() {
        let w = bf16_round(&support::random_vec(10 + i as u64, rows * cols));
        let chunk = (rows == 301).then_some((64 * cols * 2) as u64);
        tensors.push(GpuTensor::upload(gpu, "w", DType::BF16, &[rows, cols], &bf16_bytes(&w), chunk).expect("upload"));
        ws.push(w);
    }
    let ys: Vec<_> = shapes.iter().map(|&r| gpu.storage("y", (r * 4) as u64)).collect();
    let pairs: Vec<_> = tensors.iter().zip(&ys).collect();
    run(gpu, |enc| gemv::gemv_many(gpu, enc, &pairs, &xb, None).unwrap());
    for (i, &rows) in shapes.iter().enumerate() {
        let got: Vec<f32> = gpu.read(&ys[i], rows).unwrap();
        let want = reference::gemv::gemv(&ws[i], rows, cols, &x);
        assert!(support::nmse(&got, &want) < 1e-10, "matrix {i} [{rows}, {cols}]: nmse {}", support::nmse(&got, &want));
    }
}

/// Several matrices sharing x in one multi-matrix dispatch (more than four entries, one
/// matrix split into row chunks) equal one reference GEMV each.
#[test]
fn gemv_many_matches_reference() {
    let Some(gpu) = support::gpu() else { return };
    gemv_many_vs_reference(&gpu, &[1, 17, 301, 40, 33, 96]);
}

/// Up to two matrices plus a gated pair in one multi-matrix dispatch (`gemv_many_glu`, the
/// MoE decode's router logits, latent down-projection and shared experts' activation): each
/// output against the reference GEMV, the pair's against act(gate x, up x), for both
/// activations, 0-2 plain matrices, odd row counts and a column tail shorter than a lane step;
/// three plain matrices or a mismatched pair are refused.
#[test]
fn gemv_many_glu_matches_reference() {
    let Some(gpu) = support::gpu() else { return };
    let cols = 200;
    let x = support::random_vec(31, cols);
    let xb = gpu.storage_from("x", &x);
    let matrix = |seed: u64, rows: usize| {
        let w = bf16_round(&support::random_vec(seed, rows * cols).iter().map(|v| v * 0.3).collect::<Vec<_>>());
        (bf16_tensor(&gpu, "w", rows, cols, &w), w)
    };
    let (glu_rows, plain_rows) = (29, [37, 13, 5]);
    let (gate, wg) = matrix(40, glu_rows);
    let (up, wu) = matrix(41, glu_rows);
    let plain: Vec<_> = plain_rows.iter().enumerate().map(|(i, &r)| matrix(50 + i as u64, r)).collect();
    let ys: Vec<_> = plain_rows.iter().map(|&r| gpu.storage("y", (r * 4) as u64)).collect();
    let (g, u) = (reference::moe::matvec(&wg, glu_rows, cols, &x), reference::moe::matvec(&wu, glu_rows, cols, &x));
    for act in [SITU, Activation::Silu] {
        for n_plain in 0..=2 {
            let out = gpu.storage("act", (glu_rows * 4) as u64);
            let pair = gemv::GluPair { gate: &gate, up: &up, act, out: &out };
            let pairs: Vec<_> = plain.iter().zip(&ys).take(n_plain).map(|((w, _), y)| (w, y)).collect();
            assert!(gemv::glu_fits(&gpu, &pairs, &pair));
            run(&gpu, |enc| gemv::gemv_many_glu(&gpu, enc, &pairs, &pair, None, &xb, None).unwrap());
            let want: Vec<f32> = g.iter().zip(&u).map(|(&a, &b)| reference::moe::glu(act, a, b) as f32).collect();
            let e = rel_l2(&gpu.read::<f32>(&out, glu_rows).unwrap(), &want);
            assert!(e < 1e-5, "{act:?} beside {n_plain} matrices: gated output rel L2 {e}");
            for (i, ((_, w), y)) in plain.iter().zip(&ys).take(n_plain).enumerate() {
                let got: Vec<f32> = gpu.read(y, plain_rows[i]).unwrap();
                let want = reference::gemv::gemv(w, plain_rows[i], cols, &x);
                assert!(support::nmse(&got, &want) < 1e-10, "{act:?}: matrix {i} beside the pair: nmse {}", support::nmse(&got, &want));
            }
        }
    }
    let out = gpu.storage("act", (glu_rows * 4) as u64);
    let pair = gemv::GluPair { gate: &gate, up: &up, act: SITU, out: &out };
    let three: Vec<_> = plain.iter().zip(&ys).map(|((w, _), y)| (w, y)).collect();
    assert!(!gemv::glu_fits(&gpu, &three, &pair));
    run(&gpu, |enc| assert!(gemv::gemv_many_glu(&gpu, enc, &three, &pair, None, &xb, None).is_err()));
    let (short_up, _) = matrix(42, glu_rows - 1);
    let bad = gemv::GluPair { gate: &gate, up: &short_up, act: SITU, out: &out };
    assert!(!gemv::glu_fits(&gpu, &[], &bad));
}

/// The MoE decode's projection pass selecting the token's experts itself (`gemv_many_glu` with a
/// route: the last of the router's workgroups selects from the logits the others wrote) picks
/// what the router does from the same logits, in rank order with the same weights: expert
/// counts that are not a multiple of a workgroup's 32 rows, a group limit, top-k up to 64, the
/// latent matrix and the gated pair beside it, and the done counter reused call after call.
#[test]
fn gemv_many_glu_routes_like_the_router() {
    let Some(gpu) = support::gpu() else { return };
    if !gpu.caps.subgroups {
        return;
    }
    let cols = 264;
    let matrix = |seed: u64, rows: usize| {
        let w = bf16_round(&support::random_vec(seed, rows * cols).iter().map(|v| v * 0.3).collect::<Vec<_>>());
        (bf16_tensor(&gpu, "w", rows, cols, &w), w)
    };
    let (gate, _) = matrix(40, 29);
    let (up, _) = matrix(41, 29);
    let (latent, _) = matrix(42, 45);
    let (act, z) = (gpu.storage("act", 29 * 4), gpu.storage("z", 45 * 4));
    let pair = gemv::GluPair { gate: &gate, up: &up, act: SITU, out: &act };
    let done = gpu.storage("done", 16);
    for (call, (e, k, groups, tg, scaling)) in [(37, 5, 1, 1, 1.0), (96, 8, 4, 2, 2.5), (896, 16, 1, 1, 1.0), (1000, 64, 8, 4, 1.0), (33, 1, 1, 1, 1.0)].into_iter().enumerate() {
        let cfg = router_cfg(groups, tg, scaling);
        let (router_w, rw) = matrix(100 + e as u64, e);
        let bias: Vec<f32> = support::random_vec(e as u64, e).iter().map(|v| v * 0.05).collect();
        let bb = gpu.storage_from("bias", &bias);
        let logits = gpu.storage("logits", (e * 4) as u64);
        for n_plain in [1, 2] {
            let x = support::random_vec((10 * call + n_plain) as u64, cols);
            let xb = gpu.storage_from("x", &x);
            let idx = gpu.storage_from("idx", &vec![u32::MAX; k]);
            let wts = gpu.storage_from("wts", &vec![f32::NAN; k]);
            let route = gemv::Route { cfg: &cfg, top_k: k, bias: &bb, idx: &idx, wts: &wts, done: &done };
            assert!(gemv::route_fits(&gpu, &router_w, &route));
            let pairs = [(&router_w, &logits), (&latent, &z)];
            run(&gpu, |enc| gemv::gemv_many_glu(&gpu, enc, &pairs[..n_plain], &pair, Some(&route), &xb, None).unwrap());
            let got_logits: Vec<f32> = gpu.read(&logits, e).unwrap();
            let want_logits = reference::gemv::gemv(&rw, e, cols, &x);
            assert!(support::nmse(&got_logits, &want_logits) < 1e-10, "router logits of {e} experts");
            let (ri, rwts) = reference::moe::route(&cfg, &got_logits, &bias, k);
            let (gi, gw): (Vec<u32>, Vec<f32>) = (gpu.read(&idx, k).unwrap(), gpu.read(&wts, k).unwrap());
            let case = format!("{e} experts, top {k}, groups {groups}/{tg}, {n_plain} plain matrices");
            assert_eq!(gi, ri, "{case}: selection");
            assert!(rel_l2(&gw, &rwts) < 1e-6, "{case}: weights {gw:?} vs {rwts:?}");
            // The router's own dispatch on the same logits: the same bits.
            let (oi, ow) = gpu_route(&gpu, &cfg, 1, e, k, &got_logits, &bias, 0);
            assert_eq!((gi, gw.iter().map(|v| v.to_bits()).collect::<Vec<_>>()), (oi, ow.iter().map(|v| v.to_bits()).collect::<Vec<_>>()), "{case}: against router_select");
        }
    }
    // 1025 experts exceed the selection's workgroup arrays: refused, not truncated.
    let (big, _) = matrix(7, 1025);
    let (bb, idx, wts) = (gpu.storage("bias", 1025 * 4), gpu.storage("idx", 64), gpu.storage("wts", 64));
    let cfg = router_cfg(1, 1, 1.0);
    let route = gemv::Route { cfg: &cfg, top_k: 4, bias: &bb, idx: &idx, wts: &wts, done: &done };
    assert!(!gemv::route_fits(&gpu, &big, &route));
    let logits = gpu.storage("logits", 1025 * 4);
    let xb = gpu.storage_from("x", &support::random_vec(3, cols));
    run(&gpu, |enc| assert!(gemv::gemv_many_glu(&gpu, enc, &[(&big, &logits)], &pair, Some(&route), &xb, None).is_err()));
}

/// Adapters that run fewer than 512 invocations per workgroup get kernels that fit: the MXFP4
/// decode's shared-memory pair instead of the subgroup ones, one GEMV per matrix instead of the
/// multi-matrix kernel, no normed GEMV; the results stay the reference's.
#[test]
fn small_workgroup_adapters_take_kernels_that_fit() {
    let Some(_) = support::gpu() else { return };
    let mut gpu = Gpu::open(None).expect("second device");
    std::sync::Arc::get_mut(&mut gpu).expect("one owner").caps.max_invocations = 256;
    let layout = SlotLayout::new(ExpertFormat::Mxfp4, 64, 96).unwrap();
    assert_eq!(moe::decode_default(&gpu, &layout).name, moe::DECODE_SHARED.name);
    for k in moe::DECODE_VARIANTS.iter().filter(|k| moe::decode_supported(&gpu, &layout, k)) {
        assert!(!k.up.needs_subgroups, "{} offered with 256 invocations", k.name);
    }
    let w = bf16_tensor(&gpu, "w", 40, 264, &vec![0.0; 40 * 264]);
    assert!(!gemv::normed_fits(&gpu, &w));
    gemv_many_vs_reference(&gpu, &[33, 70]);
    // Which kernel ran (lavapipe itself runs 512-invocation workgroups, so results alone would
    // not tell; this device is fresh, nothing prewarmed).
    assert!(!gpu.pipelines.is_built(gemv::GEMV_BF16_MULTI.name), "the multi-matrix GEMV ran");
    assert!(gpu.pipelines.is_built(gemv::GEMV_BF16_SG.name), "the per-matrix GEMV did not run");
}

/// The normed-input GEMV (decode's latent RMSNorm + up-projection, and the shared experts'
/// down-projection as an optional second product or a precomputed addend, in one dispatch)
/// equals the reference norm then GEMV(s): ragged rows, a chunked matrix, widths from 8 to the
/// 4096 limit, inputs far from unit scale, writing and accumulating, with and without the
/// addend; wider inputs, a chunked second matrix and a short addend are refused.
#[test]
fn gemv_normed_matches_norm_then_gemv() {
    let Some(gpu) = support::gpu() else { return };
    if !gpu.caps.subgroups {
        return;
    }
    for (rows, cols, cols_b, scale, chunk_rows) in
        [(1usize, 8usize, 0usize, 1.0f32, None), (37, 264, 1000, 300.0, None), (301, 1000, 0, 1e-3, Some(64usize)), (19, 4096, 8, 1.0, None), (70, 96, 6144, 1.0, None)]
    {
        let x: Vec<f32> = support::random_vec(cols as u64, cols).iter().map(|v| v * scale).collect();
        let gamma = bf16_round(&support::random_vec(7, cols));
        let w = bf16_round(&support::random_vec(8, rows * cols));
        let tensor = GpuTensor::upload(&gpu, "w", DType::BF16, &[rows, cols], &bf16_bytes(&w), chunk_rows.map(|r| (r * cols * 2) as u64)).expect("upload");
        let normed = reference::norm::rms_norm(&x, 1, cols, &gamma, 1e-6);
        let mut want = reference::gemv::gemv(&w, rows, cols, &normed);
        let (xb, gb) = (gpu.storage_from("x", &x), gpu.storage_from("gamma", &bf16_bytes(&gamma)));
        let second_w = bf16_round(&support::random_vec(11, rows * cols_b));
        let second_x: Vec<f32> = support::random_vec(12, cols_b.max(1)).iter().map(|v| v * 20.0).collect();
        let second = (cols_b > 0).then(|| {
            let t = GpuTensor::upload(&gpu, "w_b", DType::BF16, &[rows, cols_b], &bf16_bytes(&second_w), None).expect("upload");
            for (o, v) in want.iter_mut().zip(reference::gemv::gemv(&second_w, rows, cols_b, &second_x)) {
                *o += v;
            }
            (t, gpu.storage_from("x_b", &second_x))
        });
        let base = support::random_vec(9, rows);
        let add: Vec<f32> = support::random_vec(13, rows).iter().map(|v| v * 3.0).collect();
        let add_b = gpu.storage_from("addend", &add);
        for (accumulate, with_add) in [(false, false), (true, false), (false, true), (true, true)] {
            let y = gpu.storage_from("y", &base);
            let pair = second.as_ref().map(|(t, b)| (t, b));
            let addend = with_add.then_some(&add_b);
            run(&gpu, |enc| gemv::gemv_normed(&gpu, enc, &tensor, &xb, &gb, 1e-6, pair, addend, &y, accumulate, None).unwrap());
            let got: Vec<f32> = gpu.read(&y, rows).unwrap();
            let want: Vec<f32> = want
                .iter()
                .zip(&base)
                .zip(&add)
                .map(|((&v, &b), &a)| v + if accumulate { b } else { 0.0 } + if with_add { a } else { 0.0 })
                .collect();
            let err = rel_l2(&got, &want);
            assert!(err < 1e-5, "[{rows}, {cols}] + [{rows}, {cols_b}] x{scale} accumulate {accumulate} addend {with_add}: rel L2 {err}");
        }
    }
    let mut enc = gpu.device.create_command_encoder(&Default::default());
    let wide = GpuTensor::upload(&gpu, "w", DType::BF16, &[2, 4104], &vec![0u8; 2 * 4104 * 2], None).expect("upload");
    let (x, g, y) = (gpu.storage("x", 4104 * 4), gpu.storage("g", 4104 * 2), gpu.storage("y", 8));
    let err = gemv::gemv_normed(&gpu, &mut enc, &wide, &x, &g, 1e-6, None, None, &y, false, None).unwrap_err();
    assert!(err.to_string().contains("4096"), "{err}");
    let narrow = GpuTensor::upload(&gpu, "w", DType::BF16, &[2, 8], &[0u8; 32], None).expect("upload");
    let chunked = GpuTensor::upload(&gpu, "w_b", DType::BF16, &[2, 8], &[0u8; 32], Some(16)).expect("upload");
    let err = gemv::gemv_normed(&gpu, &mut enc, &narrow, &x, &g, 1e-6, Some((&chunked, &x)), None, &y, false, None).unwrap_err();
    assert!(err.to_string().contains("one-chunk"), "{err}");
    let short = gpu.storage("addend", 4);
    let err = gemv::gemv_normed(&gpu, &mut enc, &narrow, &x, &g, 1e-6, None, Some(&short), &y, false, None).unwrap_err();
    assert!(err.to_string().contains("addend"), "{err}");
}

#[test]
fn rms_norm_and_glu_match_reference() {
    let Some(gpu) = support::gpu() else { return };
    for (rows, n) in [(1, 7), (3, 128), (17, 300), (2, 2500), (40, 1100)] {
        let x = support::random_vec(1, rows * n);
        let w = bf16_round(&support::random_vec(2, n));
        let (xb, wb, out) = (gpu.storage_from("x", &x), gpu.storage_from("w", &bf16_bytes(&w)), gpu.storage("o", (rows * n * 4) as u64));
        run(&gpu, |enc| norm::rms_norm(&gpu, enc, rows, n, 1e-5, &xb, &wb, &out, None).unwrap());
        let got: Vec<f32> = gpu.read(&out, rows * n).unwrap();
        assert!(rel_l2(&got, &reference::norm::rms_norm(&x, rows, n, &w, 1e-5)) < 1e-6);
        let g: Vec<f32> = x.iter().map(|v| v * 30.0).collect();
        let u: Vec<f32> = support::random_vec(3, rows * n).iter().map(|v| v * 60.0).collect();
        for act in [SITU, Activation::Situ { beta: 4.0, linear_beta: None }, Activation::Silu] {
            let (gb, ub) = (gpu.storage_from("g", &g), gpu.storage_from("u", &u));
            run(&gpu, |enc| norm::glu(&gpu, enc, act, rows * n, &gb, &ub, &out, None).unwrap());
            let got: Vec<f32> = gpu.read(&out, rows * n).unwrap();
            let want: Vec<f32> = g.iter().zip(&u).map(|(&a, &b)| reference::moe::glu(act, a as f64, b as f64) as f32).collect();
            assert!(rel_l2(&got, &want) < 1e-6, "{act:?}");
        }
    }
}

/// The grouped kernels (every variant the adapter runs) at shapes awkward for their tiles:
/// expert widths that are not multiples of the 64 / 128 weight rows per workgroup (nor of 32
/// for bf16), experts routed 0, 1, 17 and 70 pairs (a 64-pair tile and a remainder), a wide
/// activation range across tokens (the coop kernels scale each row), writing and accumulating.
#[test]
fn grouped_kernels_match_reference_at_tile_edges() {
    let Some(gpu) = support::gpu() else { return };
    let (e, k, t) = (7, 3, 90);
    // Token r: expert 3 (r < 70), 2 (r < 17), 1 (r == 5), then fillers 4, 5, 6; expert 0 never.
    let mut idx = Vec::new();
    for r in 0..t {
        let mut chosen: Vec<u32> = Vec::new();
        if r < 70 {
            chosen.push(3);
        }
        if r < 17 {
            chosen.push(2);
        }
        if r == 5 {
            chosen.push(1);
        }
        for f in [4, 5, 6] {
            if chosen.len() < k {
                chosen.push(f);
            }
        }
        chosen.rotate_left(r % k);
        idx.extend(chosen);
    }
    let wts: Vec<f32> = support::random_vec(8, t * k).iter().map(|v| v.abs() + 0.1).collect();
    // Token rows scaled by 2^-range .. 2^range: per-row scales must not lose the small rows.
    // (SiTU's tanh loses relative precision at tiny arguments in every kernel, decode too:
    // 1 - exp(-2|v|) cancels; its tokens stay within 2^+-3.)
    for (format, act, n_in, n_mid, range) in [
        (ExpertFormat::Mxfp4, SITU, 160, 96, 3),
        (ExpertFormat::Mxfp4, Activation::Silu, 64, 224, 12),
        (ExpertFormat::Bf16, Activation::Silu, 40, 72, 12),
    ] {
        let (store, dense) = random_experts(&gpu, format, n_in, n_mid, e);
        let z: Vec<f32> = support::random_vec(7, t * n_in)
            .iter()
            .enumerate()
            .map(|(i, v)| v * 2f32.powi((i / n_in) as i32 % (2 * range + 1) - range))
            .collect();
        let (zb, ib, wb) = (gpu.storage_from("z", &z), gpu.storage_from("idx", &idx), gpu.storage_from("wts", &wts));
        let call = moe::ExpertCall { layer: 0, tokens: t, top_k: k, act, accumulate: false };
        let scratch = moe::GroupedScratch::new(&gpu, &store, t, k);
        let mut want = Vec::new();
        for r in 0..t {
            want.extend(reference::moe::experts(act, &dense, n_in, n_mid, &idx[r * k..(r + 1) * k], &wts[r * k..(r + 1) * k], &z[r * n_in..(r + 1) * n_in]));
        }
        let base = support::random_vec(11, t * n_in);
        let want_acc: Vec<f32> = want.iter().zip(&base).map(|(a, b)| a + b).collect();
        for &g in moe::GROUPED_VARIANTS.iter().filter(|&&g| moe::grouped_supported(&gpu, &store.layout, g)) {
            let y = gpu.storage("y", (t * n_in * 4) as u64);
            let y_acc = gpu.storage_from("y base", &base);
            let acc_call = moe::ExpertCall { accumulate: true, ..call };
            run(&gpu, |enc| {
                moe::experts_grouped_with(&gpu, enc, &store, &call, Some(g), &zb, &ib, &wb, &scratch, &y, None).unwrap();
                moe::experts_grouped_with(&gpu, enc, &store, &acc_call, Some(g), &zb, &ib, &wb, &scratch, &y_acc, None).unwrap();
            });
            // Per token, so a small-scaled token's error is not hidden by the large ones.
            let got: Vec<f32> = gpu.read(&y, t * n_in).unwrap();
            let worst = (0..t).map(|r| rel_l2(&got[r * n_in..(r + 1) * n_in], &want[r * n_in..(r + 1) * n_in])).fold(0.0, f64::max);
            let acc = rel_l2(&gpu.read::<f32>(&y_acc, t * n_in).unwrap(), &want_acc);
            eprintln!("{format:?} {n_in}x{n_mid} grouped {}: worst token {worst:.2e}, accumulating {acc:.2e}", g.name());
            assert!(worst < 1e-5 && acc < 1e-5, "{format:?} {n_in}x{n_mid} grouped {}: worst token {worst}, accumulating {acc}", g.name());
        }
    }
}
