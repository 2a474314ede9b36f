//! KDA on the GPU vs the f64 CPU reference and the golden data: the fused decode kernel, the
//! chunked WY/UT prefill (T in {1, 17, 64, 65, 200, 1000}, 1-4 heads, head dims 16..128, both
//! gate forms, with and without an initial state; each state-pass kernel forced, whatever the
//! adapter reports), the choice of kernels by workgroup memory, prefill-then-decode hand-off,
//! and the layer.

mod support;

use k31_engine::config::{KdaGate, KdaOutputGate};
use k31_engine::gpu::Gpu;
use k31_engine::ops::kda::{self, ChunkScratch, DecodeVariant, KdaGeom, KdaInputs, PrepKernel, Prepped, StateVariant};
use k31_engine::reference::kda as r;
use support::golden;

const TOL: f64 = 1e-4;

fn rel_l2(got: &[f32], want: &[f32]) -> f64 {
    support::nmse(got, want).sqrt()
}

fn scaled(seed: u64, n: usize, s: f32) -> Vec<f32> {
    support::random_vec(seed, n).into_iter().map(|x| x * s).collect()
}

/// Host-side inputs of the core: pre-conv qkv [T, 3P], f [T, P], b [T, H] and parameters.
struct Core {
    geom: KdaGeom,
    qkv: Vec<f32>,
    f: Vec<f32>,
    b: Vec<f32>,
    conv_w: Vec<f32>,
    a_log: Vec<f32>,
    dt_bias: Vec<f32>,
    s0: Vec<f32>,
    /// kda_prep_run with this run length instead of the default prep (64: g written as the
    /// within-chunk cumsum by the prep).
    prep_run: Option<usize>,
}

impl Core {
    /// Uploads tokens [t0, t1) and runs `f` on them (the buffers live until `f` returns).
    fn with_rows<R>(&self, gpu: &Gpu, t0: usize, t1: usize, f: impl FnOnce(&KdaInputs) -> R) -> R {
        let p = self.geom.proj();
        let h = self.geom.heads;
        let qkv = gpu.storage_from("qkv", &self.qkv[t0 * 3 * p..t1 * 3 * p]);
        let fb = gpu.storage_from("f", &self.f[t0 * p..t1 * p]);
        let b = gpu.storage_from("b", &self.b[t0 * h..t1 * h]);
        let conv_w = gpu.storage_from("conv_w", &self.conv_w);
        let a_log = gpu.storage_from("a_log", &self.a_log);
        let dt_bias = gpu.storage_from("dt_bias", &self.dt_bias);
        f(&KdaInputs { qkv: &qkv, f: &fb, b: &b, conv_w: &conv_w, a_log: &a_log, dt_bias: &dt_bias })
    }

    /// CPU reference over the first `t` tokens: (o [t, H, V], final state).
    fn reference(&self, t: usize) -> (Vec<f32>, Vec<f32>) {
        let g = &self.geom;
        let (p, k) = (g.proj(), g.head_dim);
        let mut streams = Vec::new();
        for i in 0..3 {
            let x: Vec<f32> = (0..t).flat_map(|tt| self.qkv[tt * 3 * p + i * p..tt * 3 * p + (i + 1) * p].to_vec()).collect();
            streams.push(if g.post_conv {
                x
            } else {
                let w = &self.conv_w[i * p * g.taps..(i + 1) * p * g.taps];
                r::conv_silu(&x, w, &vec![0.0; (g.taps - 1) * p], t, p, g.taps)
            });
        }
        let scale = 1.0 / (k as f32).sqrt();
        let q: Vec<f32> = streams[0].chunks(k).flat_map(|c| r::l2n(c).into_iter().map(move |a| a * scale)).collect();
        let kk: Vec<f32> = streams[1].chunks(k).flat_map(r::l2n).collect();
        let gg = r::gate(g.gate, &self.f[..t * p], &self.a_log, &self.dt_bias, g.heads, k);
        let beta = r::beta(&self.b[..t * g.heads]);
        r::recurrence(&q, &kk, &streams[2], &gg, &beta, &self.s0, t, g.heads, k, k)
    }

    /// GPU: chunked prefill of tokens [0, t), then `n` decode steps.
    /// Returns (o [t+n, H, V], state).
    fn gpu_run(&self, gpu: &Gpu, t: usize, n: usize) -> (Vec<f32>, Vec<f32>) {
        self.gpu_run_with(gpu, None, DecodeVariant::default_for(gpu, &self.geom), t, n)
    }

    /// [`Core::gpu_run`] with the prefill's state pass forced to `sv` where given and the
    /// decode through `dv`.
    fn gpu_run_with(&self, gpu: &Gpu, sv: Option<StateVariant>, dv: DecodeVariant, t: usize, n: usize) -> (Vec<f32>, Vec<f32>) {
        let g = &self.geom;
        let (p, k, h) = (g.proj(), g.head_dim, g.heads);
        let ring = gpu.storage("ring", (g.taps * 3 * p * 4) as u64);
        let state = if self.s0.is_empty() {
            gpu.storage("state", (h * k * k * 4) as u64)
        } else {
            gpu.storage_from("state", &self.s0)
        };
        let mut out = Vec::new();
        if t > 0 {
            let pre = Prepped::new(gpu, g, t);
            let scratch = ChunkScratch::new(gpu, g, t).expect("scratch");
            let o = gpu.storage("o", (t * p * 4) as u64);
            self.with_rows(gpu, 0, t, |inp| {
                let mut enc = gpu.device.create_command_encoder(&Default::default());
                match self.prep_run {
                    Some(run) => kda::prep_with_run(gpu, &mut enc, PrepKernel::Run, g, t, 0, inp, &ring, &pre, run, None),
                    None => kda::prep(gpu, &mut enc, g, t, 0, inp, &ring, &pre, None),
                }
                .expect("prep");
                match sv {
                    Some(sv) => kda::chunk_prefill_state(gpu, &mut enc, sv, g, &pre, &scratch, &state, &o, None),
                    None => kda::chunk_prefill(gpu, &mut enc, g, &pre, &scratch, &state, &o, None),
                }
                .expect("prefill");
                gpu.queue.submit([enc.finish()]);
            });
            out.extend(gpu.read::<f32>(&o, t * p).expect("read o"));
        }
        let o = gpu.storage("o", (n.max(1) * p * 4) as u64);
        for i in t..t + n {
            let oi = gpu.storage("o step", (p * 4) as u64);
            self.with_rows(gpu, i, i + 1, |inp| {
                let mut enc = gpu.device.create_command_encoder(&Default::default());
                kda::decode_with(gpu, &mut enc, dv, g, i as u64, inp, &ring, &state, &oi, None).expect("decode");
                enc.copy_buffer_to_buffer(&oi, 0, &o, ((i - t) * p * 4) as u64, (p * 4) as u64);
                gpu.queue.submit([enc.finish()]);
            });
        }
        if n > 0 {
            out.extend(gpu.read::<f32>(&o, n * p).expect("read o"));
        }
        (out, gpu.read::<f32>(&state, h * k * k).expect("read state"))
    }
}

fn random_core(seed: u64, t_len: usize, heads: usize, dk: usize, gate: KdaGate, init: bool) -> Core {
    random_core_taps(seed, t_len, heads, dk, gate, init, 4)
}

fn random_core_taps(seed: u64, t_len: usize, heads: usize, dk: usize, gate: KdaGate, init: bool, taps: usize) -> Core {
    let p = heads * dk;
    Core {
        geom: KdaGeom { heads, head_dim: dk, taps, gate, post_conv: false },
        qkv: scaled(seed, t_len * 3 * p, 1.0),
        f: scaled(seed + 1, t_len * p, 2.0),
        b: scaled(seed + 2, t_len * heads, 3.0),
        conv_w: scaled(seed + 3, 3 * p * taps, 0.8),
        a_log: support::random_vec(seed + 4, heads).into_iter().map(|x| 1.4 * (x + 1.0)).collect(),
        dt_bias: scaled(seed + 5, p, 1.0),
        s0: if init { scaled(seed + 6, heads * dk * dk, 0.5) } else { Vec::new() },
        prep_run: None,
    }
}

const BOUNDED: KdaGate = KdaGate::Bounded { lower_bound: -5.0 };

/// Prefill T then decode N, against the reference over T + N and against one prefill of T + N.
#[allow(clippy::too_many_arguments)]
fn check_case(gpu: &Gpu, seed: u64, t: usize, n: usize, heads: usize, dk: usize, gate: KdaGate, init: bool) {
    check_case_taps(gpu, seed, t, n, heads, dk, gate, init, 4)
}

#[allow(clippy::too_many_arguments)]
fn check_case_taps(gpu: &Gpu, seed: u64, t: usize, n: usize, heads: usize, dk: usize, gate: KdaGate, init: bool, taps: usize) {
    let core = random_core_taps(seed, t + n, heads, dk, gate, init, taps);
    let (want_o, want_s) = core.reference(t + n);
    let (got_o, got_s) = core.gpu_run(gpu, t, n);
    let (eo, es) = (rel_l2(&got_o, &want_o), rel_l2(&got_s, &want_s));
    eprintln!("T={t} N={n} H={heads} K={dk} {gate:?} init={init}: o {eo:.2e} state {es:.2e}");
    assert!(eo <= TOL && es <= TOL, "T={t} N={n} H={heads} K={dk} {gate:?} init={init}: o {eo:.2e} state {es:.2e}");
    if n > 0 {
        let (all_o, all_s) = core.gpu_run(gpu, t + n, 0);
        let (eo2, es2) = (rel_l2(&got_o, &all_o), rel_l2(&got_s, &all_s));
        assert!(eo2 <= TOL && es2 <= TOL, "prefill {t} + decode {n} vs prefill {}: o {eo2:.2e} state {es2:.2e}", t + n);
    }
}

/// kda_prep_run in runs of a whole chunk writes g as its within-chunk cumulative sum and the
/// prefill skips kda_chunk_cumsum: T across chunk edges (ragged last chunk), both gates, with
/// and without an initial state, then decode (the ring hand-off); against the reference and
/// against the same prefill in runs of 8 (g summed by kda_chunk_cumsum).
#[test]
fn prep_cumsum_in_runs_of_a_chunk_matches_reference() {
    let Some(gpu) = support::gpu() else { return };
    let probe = KdaGeom { heads: 2, head_dim: 32, taps: 4, gate: BOUNDED, post_conv: false };
    if !PrepKernel::Run.supported(&gpu, &probe) {
        eprintln!("kda_prep_run does not run here: skipped");
        return;
    }
    for (i, &(t, n, h, k, gate, init)) in [
        (17, 2, 2, 32, BOUNDED, false),
        (64, 3, 3, 16, KdaGate::Softplus, true),
        (65, 0, 2, 32, KdaGate::Softplus, false),
        (200, 2, 1, 32, BOUNDED, true),
    ]
    .iter()
    .enumerate()
    {
        // The kernel's subgroups must tile the head (head dim 16 does not run with 32 lanes).
        if !PrepKernel::Run.supported(&gpu, &KdaGeom { head_dim: k, ..probe }) {
            eprintln!("T={t}+{n} H={h} K={k}: kda_prep_run does not run here at this head dim: skipped");
            continue;
        }
        let mut core = random_core(900 + i as u64, t + n, h, k, gate, init);
        let (want_o, want_s) = core.reference(t + n);
        core.prep_run = Some(kda::CHUNK);
        let (got_o, got_s) = core.gpu_run(&gpu, t, n);
        core.prep_run = Some(8);
        let (unfused_o, unfused_s) = core.gpu_run(&gpu, t, n);
        let (eo, es) = (rel_l2(&got_o, &want_o), rel_l2(&got_s, &want_s));
        let (uo, us) = (rel_l2(&got_o, &unfused_o), rel_l2(&got_s, &unfused_s));
        eprintln!("T={t}+{n} H={h} K={k} {gate:?} init={init}: o {eo:.2e} state {es:.2e}; vs runs of 8: {uo:.2e} {us:.2e}");
        assert!(eo <= TOL && es <= TOL, "T={t}+{n} H={h} K={k}: o {eo:.2e} state {es:.2e}");
        assert!(uo <= 1e-6 && us <= 1e-6, "T={t}+{n}: against runs of 8: o {uo:.2e} state {us:.2e}");
    }
}

#[test]
fn decode_matches_reference() {
    let Some(gpu) = support::gpu() else { return };
    check_case(&gpu, 10, 0, 9, 2, 16, BOUNDED, false);
    check_case(&gpu, 11, 0, 5, 3, 48, KdaGate::Softplus, true);
    check_case(&gpu, 12, 0, 3, 1, 256, BOUNDED, true);
    check_case(&gpu, 13, 0, 4, 2, 128, KdaGate::Softplus, false);
    // Partial vec4-column tiles (80 = 2.5 tiles of 32 columns) and a one-tile head.
    check_case(&gpu, 14, 0, 6, 4, 80, BOUNDED, true);
    check_case(&gpu, 15, 0, 4, 3, 16, KdaGate::Softplus, true);
}

/// Every decode variant this adapter runs (the default is also tested through every other
/// case): partial and idle column tiles (K = 16, 48, 80), K = 256 (most rows per thread),
/// conv widths 1-4, decode from position 0 (taps before the sequence start), after a
/// prefill (the ring hand-off) and on already-convolved inputs.
#[test]
fn decode_variants_match_reference() {
    let Some(gpu) = support::gpu() else { return };
    let cases = [
        (20, 0, 5, 2, 16, BOUNDED, true, 4),
        (21, 0, 4, 3, 48, KdaGate::Softplus, false, 4),
        (22, 0, 3, 1, 256, BOUNDED, true, 4),
        (23, 0, 6, 4, 128, KdaGate::Softplus, true, 4),
        (24, 0, 5, 2, 80, BOUNDED, true, 3),
        (25, 3, 4, 2, 64, KdaGate::Softplus, true, 2),
        (26, 2, 3, 3, 32, BOUNDED, false, 1),
        (27, 70, 5, 2, 128, BOUNDED, true, 4),
    ];
    // One more case with inputs taken as already convolved (post_conv, as the goldens).
    let post = (29, 2, 4, 2, 128, KdaGate::Softplus, true, 4);
    for (i, (seed, t, n, h, k, gate, init, taps)) in cases.into_iter().chain([post]).enumerate() {
        let mut core = random_core_taps(seed, t + n, h, k, gate, init, taps);
        core.geom.post_conv = i == cases.len();
        let (want_o, want_s) = core.reference(t + n);
        for dv in DecodeVariant::available(&gpu, &core.geom) {
            let (got_o, got_s) = core.gpu_run_with(&gpu, None, dv, t, n);
            let (eo, es) = (rel_l2(&got_o, &want_o), rel_l2(&got_s, &want_s));
            let pc = core.geom.post_conv;
            eprintln!("{dv:?} T={t} N={n} H={h} K={k} W={taps} post_conv={pc}: o {eo:.2e} state {es:.2e}");
            assert!(eo <= TOL && es <= TOL, "{dv:?} decode T={t} N={n} H={h} K={k} W={taps} post_conv={pc}: o {eo:.2e} state {es:.2e}");
        }
    }
}

/// The tiled decode kernels need conv width <= 4: the default is T32w256 up to that and
/// C32 beyond.
#[test]
fn decode_variants_by_conv_width() {
    let Some(gpu) = support::gpu() else { return };
    let geom = |taps| KdaGeom { heads: 2, head_dim: 32, taps, gate: BOUNDED, post_conv: false };
    assert!(DecodeVariant::available(&gpu, &geom(4)).contains(&DecodeVariant::T16));
    assert_eq!(DecodeVariant::default_for(&gpu, &geom(4)), DecodeVariant::T32w256);
    assert_eq!(DecodeVariant::available(&gpu, &geom(5)), vec![DecodeVariant::C32, DecodeVariant::C16]);
    assert!(DecodeVariant::default_for(&gpu, &geom(5)).runs_on(&gpu, &geom(5)));
    check_case_taps(&gpu, 28, 0, 4, 2, 32, BOUNDED, true, 6);
}

#[test]
fn prefill_matches_reference() {
    let Some(gpu) = support::gpu() else { return };
    let cases: &[(usize, usize, usize, KdaGate, bool)] = &[
        (1, 1, 16, BOUNDED, false),
        (17, 2, 32, KdaGate::Softplus, true),
        (64, 3, 64, BOUNDED, true),
        (65, 4, 16, KdaGate::Softplus, false),
        (200, 2, 128, BOUNDED, false),
        (200, 1, 64, KdaGate::Softplus, true),
        (1000, 2, 32, BOUNDED, true),
        (1000, 1, 128, KdaGate::Softplus, false),
        (65, 1, 128, BOUNDED, true),
        (17, 4, 128, KdaGate::Softplus, true),
        (100, 1, 256, BOUNDED, true),
        (70, 2, 80, KdaGate::Softplus, false),
        // The bounded gate at the reference-row intra's limit (diagonal factors up to e^82.5),
        // and past it (the pairwise intra).
        (130, 2, 64, KdaGate::Bounded { lower_bound: -5.5 }, true),
        (130, 2, 64, KdaGate::Bounded { lower_bound: -8.0 }, false),
    ];
    for (i, &(t, h, k, gate, init)) in cases.iter().enumerate() {
        check_case(&gpu, 100 + i as u64, t, 0, h, k, gate, init);
    }
}

/// Every state-pass kernel, forced (on lavapipe, which reports 32 KiB of workgroup memory
/// but runs more, the default is Reg32 and the 41 KB one runs only here): T across chunk
/// edges, K = 16, 48, 64, 80, 128 (48, 80: 32-column tiles half empty; 256 for the narrow
/// kernel), both gates, with and without an initial state.
#[test]
fn prefill_state_variants_match_reference() {
    let Some(gpu) = support::gpu() else { return };
    let mut seed = 800;
    let mut worst: f64 = 0.0;
    let mut ran = std::collections::BTreeSet::new();
    for sv in StateVariant::ALL {
        for t in [17, 64, 65, 200] {
            for k in [16, 48, 64, 80, 128, 256] {
                for (gate, init) in [(BOUNDED, false), (BOUNDED, true), (KdaGate::Softplus, false), (KdaGate::Softplus, true)] {
                    seed += 1;
                    let core = random_core(seed, t, 2, k, gate, init);
                    if !sv.supports(&core.geom) {
                        continue;
                    }
                    let (want_o, want_s) = core.reference(t);
                    let (got_o, got_s) = core.gpu_run_with(&gpu, Some(sv), DecodeVariant::C32, t, 0);
                    let (eo, es) = (rel_l2(&got_o, &want_o), rel_l2(&got_s, &want_s));
                    worst = worst.max(eo).max(es);
                    assert!(eo <= TOL && es <= TOL, "{sv:?} T={t} K={k} {gate:?} init={init}: o {eo:.2e} state {es:.2e}");
                    ran.insert(format!("{sv:?}"));
                }
            }
        }
    }
    eprintln!("state variants: worst rel L2 {worst:.2e}; ran {ran:?}");
    assert_eq!(ran.len(), StateVariant::ALL.len(), "every state variant runs at some K");
    let big = KdaGeom { heads: 1, head_dim: 256, taps: 4, gate: BOUNDED, post_conv: false };
    assert!(!StateVariant::Staged.supports(&big) && !StateVariant::Bcast.supports(&big));
}

/// The prefill picks its kernels by the adapter's workgroup memory: the intra kernels and the
/// register state passes fit 32 KiB (Metal, DX12; Bcast and Reg 16 KiB) and so run everywhere;
/// the staged state pass only where its 41 KB fit (NVIDIA, AMD Vulkan; not lavapipe's reported
/// 32 KiB). The default for K <= 128 is Reg32, Narrow beyond.
#[test]
fn prefill_kernels_by_workgroup_memory() {
    let Some(gpu) = support::gpu() else { return };
    let p = &gpu.pipelines;
    for kern in [kda::KDA_CHUNK_INTRA, kda::KDA_CHUNK_INTRA_REF, kda::KDA_CHUNK_STATE16, kda::KDA_CHUNK_STATE_R32, kda::KDA_CHUNK_STATE_B, kda::KDA_CHUNK_OUT] {
        let b = p.workgroup_bytes(&kern).expect("measure");
        assert!(b <= 32 * 1024, "{}: {b} bytes", kern.name);
    }
    for kern in [kda::KDA_CHUNK_STATE_R32, kda::KDA_CHUNK_STATE_B] {
        let b = p.workgroup_bytes(&kern).expect("measure");
        assert!(b <= 16 * 1024, "{}: {b} bytes", kern.name);
    }
    let staged_fits = p.fits(&gpu, &kda::KDA_CHUNK_STATE).expect("measure");
    assert_eq!(staged_fits, gpu.caps.max_workgroup_storage >= p.workgroup_bytes(&kda::KDA_CHUNK_STATE).unwrap());
    for (k, want) in [(64, StateVariant::Reg32), (128, StateVariant::Reg32), (256, StateVariant::Narrow)] {
        let geom = KdaGeom { heads: 2, head_dim: k, taps: 4, gate: BOUNDED, post_conv: false };
        assert_eq!(StateVariant::default_for(&gpu, &geom).expect("choose"), want, "K={k}");
    }
}

/// With the workgroup limit enforced (lavapipe is otherwise let through: it runs larger
/// kernels than it reports), a kernel over the limit is a clear pipeline error, and the
/// default prefill and decode do not ask for one.
#[test]
fn workgroup_limit_is_enforced_and_defaults_fit() {
    let Some(_) = support::gpu() else { return };
    let gpu = Gpu::open(None).expect("second device");
    gpu.pipelines.enforce_workgroup_limit(true);
    let limit = gpu.caps.max_workgroup_storage;
    let staged = gpu.pipelines.workgroup_bytes(&kda::KDA_CHUNK_STATE).expect("measure");
    match gpu.pipelines.get(&gpu, &kda::KDA_CHUNK_STATE) {
        Ok(_) => assert!(staged <= limit, "kda_chunk_state ({staged} bytes) built past the {limit}-byte limit"),
        Err(e) => {
            assert!(staged > limit, "kda_chunk_state ({staged} bytes, limit {limit}): {e}");
            let msg = e.to_string();
            assert!(msg.contains("workgroup memory") && msg.contains(&staged.to_string()), "unclear error: {msg}");
            eprintln!("over the limit: {msg}");
        }
    }
    for (seed, t, n, k, gate, init) in [(900, 65, 2, 128, BOUNDED, true), (901, 17, 1, 256, KdaGate::Softplus, false)] {
        let core = random_core(seed, t + n, 2, k, gate, init);
        let (want_o, want_s) = core.reference(t + n);
        let (got_o, got_s) = core.gpu_run(&gpu, t, n);
        let (eo, es) = (rel_l2(&got_o, &want_o), rel_l2(&got_s, &want_s));
        assert!(eo <= TOL && es <= TOL, "strict T={t} N={n} K={k}: o {eo:.2e} state {es:.2e}");
    }
}

#[test]
fn prefill_then_decode_equals_longer_prefill() {
    let Some(gpu) = support::gpu() else { return };
    check_case(&gpu, 200, 17, 5, 2, 32, BOUNDED, true);
    check_case(&gpu, 201, 64, 3, 2, 64, KdaGate::Softplus, false);
    check_case(&gpu, 202, 130, 4, 1, 128, BOUNDED, false);
}

/// The golden core cases (H = 2, K = V = 128): inputs are post-conv, so the conv is skipped.
#[test]
fn golden_core_prefill_and_decode() {
    let Some(gpu) = support::gpu() else { return };
    let file = "ops/kda.safetensors";
    let ts = golden::load_tensors(file);
    let cases = ["bounded_T1", "bounded_T17", "bounded_T64", "bounded_T200", "softplus_T1", "softplus_T17", "softplus_T64"];
    for case in cases {
        let get = |n: &str| golden::get(&ts, &format!("{case}.{n}")).clone();
        let (qs, q) = get("q");
        let (t, h, k) = (qs[0], qs[1], qs[2]);
        let p = h * k;
        let (k_in, v) = (get("k").1, get("v").1);
        let qkv: Vec<f32> =
            (0..t).flat_map(|i| [&q[i * p..(i + 1) * p], &k_in[i * p..(i + 1) * p], &v[i * p..(i + 1) * p]].concat()).collect();
        let gate = if case.starts_with("bounded") { BOUNDED } else { KdaGate::Softplus };
        let core = Core {
            geom: KdaGeom { heads: h, head_dim: k, taps: 4, gate, post_conv: true },
            qkv,
            f: get("f").1,
            b: get("b").1,
            conv_w: vec![0.0; 3 * p * 4],
            a_log: get("A_log").1,
            dt_bias: get("dt_bias").1,
            s0: get("S0").1,
            prep_run: None,
        };
        // The reference's gate agrees with the golden g.
        let g = r::gate(gate, &core.f, &core.a_log, &core.dt_bias, h, k);
        assert!(rel_l2(&g, &get("g").1) < 1e-6, "{case}: gate");
        let (want_o, want_s) = (get("o").1, get("S").1);
        for (label, tp, n) in [("prefill", t, 0), ("decode", 0, t)] {
            let (o, s) = core.gpu_run(&gpu, tp, n);
            let (eo, es) = (rel_l2(&o, &want_o), rel_l2(&s, &want_s));
            eprintln!("golden {case} {label}: o {eo:.2e} state {es:.2e}");
            assert!(eo <= TOL && es <= TOL, "golden {case} {label}: o {eo:.2e} state {es:.2e}");
        }
    }
}

/// Every prep kernel the adapter runs gives the shared-memory one's recurrence inputs (the
/// other tests run whichever the adapter picks), with the conv window from a previous call.
#[test]
fn prep_variants_agree() {
    let Some(gpu) = support::gpu() else { return };
    let mut checked = 0;
    // Head dims 16 and 32 take the run kernel where subgroups are 8 wide (lavapipe), 128
    // where they are 32; T = 150 spans runs of 64 and a ragged one.
    for (seed, t, h, k, gate) in [
        (400, 37, 3, 48, BOUNDED),
        (401, 9, 2, 256, KdaGate::Softplus),
        (402, 70, 5, 16, BOUNDED),
        (403, 150, 3, 32, KdaGate::Softplus),
        (404, 131, 2, 128, BOUNDED),
    ] {
        let core = random_core(seed, t, h, k, gate, false);
        let g = &core.geom;
        let p = g.proj();
        let kinds: Vec<kda::PrepKernel> = kda::PrepKernel::ALL.into_iter().filter(|kind| kind.supported(&gpu, g)).collect();
        checked += kinds.len() - 1;
        let mut outs = Vec::new();
        for &sg in &kinds {
            let ring = gpu.storage_from("ring", &scaled(seed + 9, g.taps * 3 * p, 1.0));
            let pre = Prepped::new(&gpu, g, t);
            core.with_rows(&gpu, 0, t, |inp| {
                let mut enc = gpu.device.create_command_encoder(&Default::default());
                kda::prep_with(&gpu, &mut enc, sg, g, t, 7, inp, &ring, &pre, None).expect("prep");
                gpu.queue.submit([enc.finish()]);
            });
            let n = t * p;
            let read = |b: &k31_engine::wgpu::Buffer, n: usize| gpu.read::<f32>(b, n).expect("read");
            outs.push([read(&pre.q, n), read(&pre.k, n), read(&pre.v, n), read(&pre.g, n), read(&pre.beta, t * h), read(&ring, g.taps * 3 * p)]);
        }
        for (kind, out) in kinds.iter().zip(&outs).skip(1) {
            for (i, name) in ["q", "k", "v", "g", "beta", "ring"].iter().enumerate() {
                let e = rel_l2(&out[i], &outs[0][i]);
                assert!(e < 1e-6, "prep {name} (T={t} H={h} K={k}): {kind:?} vs shared memory {e:.2e}");
            }
        }
    }
    eprintln!("{checked} prep kernel runs checked against the shared-memory one");
}

/// The one-dispatch decode (`decode_gated`: f = W_fb f_a, the recurrence and the gated norm),
/// N steps from position 0, against the reference recurrence on that f through the reference
/// gated norm: partial column tiles (K = 16, 48, 80), K = 128, conv widths 2-4, with and
/// without an initial state. K = 256 is refused (the caller runs the separate kernels). With
/// `decode_variants_match_reference` this covers lib/kda_decode_tile.wgsl, whose tile body
/// both kernels include.
#[test]
fn decode_gated_matches_reference() {
    use k31_engine::gpu::GpuTensor;
    use k31_engine::layout::DType;
    let Some(gpu) = support::gpu() else { return };
    let bf16 = |v: &[f32]| -> Vec<f32> { v.iter().map(|&x| half::bf16::from_f32(x).to_f32()).collect() };
    for (seed, n, h, k, gate, init, taps) in [
        (40, 4, 2, 16, BOUNDED, true, 4),
        (41, 3, 3, 48, KdaGate::Softplus, false, 3),
        (42, 5, 2, 80, BOUNDED, true, 4),
        (43, 4, 4, 128, KdaGate::Softplus, true, 4),
        (44, 2, 1, 256, BOUNDED, true, 2),
    ] {
        let mut core = random_core_taps(seed, n, h, k, gate, init, taps);
        let p = core.geom.proj();
        // f = W_fb f_a per token (f64 sums), as the reference's raw f.
        let w_fb = bf16(&scaled(seed + 102, p * k, 0.3));
        let f_a: Vec<f32> = scaled(seed + 103, n * k, 1.0);
        for t in 0..n {
            for row in 0..p {
                let dot: f64 = (0..k).map(|c| w_fb[row * k + c] as f64 * f_a[t * k + c] as f64).sum();
                core.f[t * p + row] = dot as f32;
            }
        }
        let g = &core.geom;
        let bytes: Vec<u8> = bytemuck::cast_slice(&w_fb.iter().map(|&x| half::bf16::from_f32(x)).collect::<Vec<_>>()).to_vec();
        let wt = GpuTensor::upload(&gpu, "w_fb", DType::BF16, &[p, k], &bytes, None).expect("upload");
        if !kda::gated_fits(&gpu, g, &wt) {
            assert!(k > 128, "K={k}: the one-dispatch decode should run here");
            continue;
        }
        let gl = scaled(seed + 100, n * p, 3.0);
        let w: Vec<f32> = scaled(seed + 101, k, 0.2).into_iter().map(|x| x + 1.0).collect();
        let (want_o, _) = core.reference(n);
        let want = r::gated_norm(&want_o, &gl, &w, n * h, k, 1e-5);
        let ring = gpu.storage("ring", (g.taps * 3 * p * 4) as u64);
        let state = if core.s0.is_empty() { gpu.storage("state", (h * k * k * 4) as u64) } else { gpu.storage_from("state", &core.s0) };
        let wb = gpu.storage_from("w", &w);
        let mut got = Vec::new();
        for i in 0..n {
            let gb = gpu.storage_from("gate", &gl[i * p..(i + 1) * p]);
            let fab = gpu.storage_from("f_a", &f_a[i * k..(i + 1) * k]);
            let y = gpu.storage("y", (p * 4) as u64);
            core.with_rows(&gpu, i, i + 1, |inp| {
                let mut enc = gpu.device.create_command_encoder(&Default::default());
                let fb = kda::GateLowRank { w_fb: &wt, f_a: &fab };
                kda::decode_gated(&gpu, &mut enc, g, i as u64, inp, fb, &ring, &state, &gb, &wb, &y, None).expect("decode_gated");
                gpu.queue.submit([enc.finish()]);
            });
            got.extend(gpu.read::<f32>(&y, p).expect("read y"));
        }
        let e = rel_l2(&got, &want);
        eprintln!("decode_gated H={h} K={k} W={taps}: y {e:.2e}");
        assert!(e <= TOL, "decode_gated H={h} K={k} W={taps}: y {e:.2e}");
    }
}

#[test]
fn gated_norm_matches_reference() {
    let Some(gpu) = support::gpu() else { return };
    let (t, h, k) = (17, 3, 48);
    let geom = KdaGeom { heads: h, head_dim: k, taps: 4, gate: BOUNDED, post_conv: false };
    let o = scaled(1, t * h * k, 1.0);
    let gl = scaled(2, t * h * k, 3.0);
    let w: Vec<f32> = scaled(3, k, 0.2).into_iter().map(|x| x + 1.0).collect();
    let want = r::gated_norm(&o, &gl, &w, t * h, k, 1e-5);
    let (ob, gb, wb) = (gpu.storage_from("o", &o), gpu.storage_from("g", &gl), gpu.storage_from("w", &w));
    let y = gpu.storage("y", (t * h * k * 4) as u64);
    let mut enc = gpu.device.create_command_encoder(&Default::default());
    kda::gated_norm(&gpu, &mut enc, &geom, t, &ob, &gb, &wb, &y, None).expect("gated norm");
    gpu.queue.submit([enc.finish()]);
    let got = gpu.read::<f32>(&y, t * h * k).expect("read");
    assert!(rel_l2(&got, &want) < 1e-6);
}

#[test]
fn bad_head_dim_is_an_error() {
    let geom = KdaGeom { heads: 2, head_dim: 24, taps: 4, gate: BOUNDED, post_conv: false };
    assert!(geom.check().is_err());
    let geom = KdaGeom { heads: 2, head_dim: 272, taps: 4, gate: BOUNDED, post_conv: false };
    assert!(geom.check().is_err());
    let _ = KdaOutputGate::FullRank;
}

// ---- the whole layer ----

use k31_engine::checkpoint::{Checkpoint, TensorView};
use k31_engine::config::KdaConfig;
use k31_engine::layers::kda::{KdaLayer, KdaState};
use k31_engine::layout::DType;

/// Runs `layer` over x [T, d] as one prefill of `t0` tokens then one token at a time.
fn run_layer(gpu: &Gpu, layer: &KdaLayer, st: &mut KdaState, x: &[f32], t0: usize, t_len: usize) -> Vec<f32> {
    let d = layer.hidden;
    let mut out = Vec::new();
    let mut at = 0;
    while at < t_len {
        let n = if at == 0 && t0 > 0 { t0 } else { 1 };
        let xb = gpu.storage_from("x", &x[at * d..(at + n) * d]);
        let ob = gpu.storage("out", (n * d * 4) as u64);
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        layer.forward(gpu, &mut enc, &xb, n, st, &ob, None).expect("layer forward");
        gpu.queue.submit([enc.finish()]);
        out.extend(gpu.read::<f32>(&ob, n * d).expect("read"));
        at += n;
    }
    out
}

/// Layer 0 of the tiny K3.1 golden model (bounded gate, full-rank g_proj): its input is
/// RMSNorm(embed(ids)) (no AttnRes bank before layer 0) and its output `layers.0.mixer_out`.
#[test]
fn golden_tiny_k31_layer0() {
    let Some(gpu) = support::gpu() else { return };
    let dir = golden::golden_path("k31_tiny/model");
    let ckpt = Checkpoint::open(&dir).expect("open k31_tiny");
    let d = ckpt.config.hidden_size;
    let ids = golden::load_int_tensors("k31_tiny/outputs.safetensors")["input_ids"].1.clone();
    let outs = golden::load_tensors("k31_tiny/outputs.safetensors");
    let want = &golden::get(&outs, "layers.0.mixer_out").1;
    let widen = |n: &str| -> Vec<f32> {
        let v = ckpt.tensor(n).unwrap_or_else(|| panic!("no {n}"));
        v.data.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect()
    };
    let emb = widen("model.embed_tokens.weight");
    let norm = widen("model.layers.0.input_layernorm.weight");
    let x: Vec<f32> = ids
        .iter()
        .flat_map(|&id| {
            let e = &emb[id as usize * d..(id as usize + 1) * d];
            let ms = e.iter().map(|&a| a as f64 * a as f64).sum::<f64>() / d as f64;
            let r = 1.0 / (ms + 1e-5).sqrt();
            e.iter().zip(&norm).map(move |(&a, &w)| (a as f64 * r * w as f64) as f32).collect::<Vec<_>>()
        })
        .collect();
    let t = ids.len();
    let layer = KdaLayer::from_checkpoint(&gpu, &ckpt, 0).expect("load layer 0");
    for t0 in [t, 20, 0] {
        let mut st = KdaState::new(&gpu, &layer.geom);
        let got = run_layer(&gpu, &layer, &mut st, &x, t0, t);
        let e = rel_l2(&got, want);
        eprintln!("k31_tiny layer 0, prefill {t0} then decode: rel L2 {e:.2e}");
        assert!(e <= TOL, "k31_tiny layer 0 (prefill {t0}): {e:.2e}");
    }
}

fn bf16_round(v: Vec<f32>) -> (Vec<f32>, Vec<u8>) {
    let b: Vec<half::bf16> = v.iter().map(|&x| half::bf16::from_f32(x)).collect();
    (b.iter().map(|x| x.to_f32()).collect(), b.iter().flat_map(|x| x.to_le_bytes()).collect())
}

/// A random layer (Kimi Linear form: softplus gate, low-rank output gate) against the
/// reference, prefill then decode, with a snapshot/restore round trip of the state.
#[test]
fn layer_matches_reference_with_snapshot() {
    let Some(gpu) = support::gpu() else { return };
    let (d, h, k, taps) = (48, 2, 32, 4);
    let p = h * k;
    let cfg = KdaConfig { num_heads: h, head_dim: k, conv_kernel: taps, gate: KdaGate::Softplus, output_gate: KdaOutputGate::LowRank };
    let sh = r::KdaShape { d, heads: h, head_dim: k, taps, gate: cfg.gate, output_gate: cfg.output_gate };
    let mut seed = 500;
    let mut tensors: Vec<(String, DType, Vec<usize>, Vec<u8>)> = Vec::new();
    let mut mat = |name: &str, rows: usize, cols: usize, s: f32| -> Vec<f32> {
        seed += 1;
        let (vals, bytes) = bf16_round(scaled(seed, rows * cols, s / (cols as f32).sqrt()));
        tensors.push((name.into(), DType::BF16, vec![rows, cols], bytes));
        vals
    };
    let w = r::KdaWeights {
        q_proj: mat("q_proj.weight", p, d, 1.7),
        k_proj: mat("k_proj.weight", p, d, 1.7),
        v_proj: mat("v_proj.weight", p, d, 1.7),
        q_conv: Vec::new(),
        k_conv: Vec::new(),
        v_conv: Vec::new(),
        f_a: mat("f_a_proj.weight", k, d, 1.7),
        f_b: mat("f_b_proj.weight", p, k, 1.0),
        dt_bias: Vec::new(),
        a_log: Vec::new(),
        b_proj: mat("b_proj.weight", h, d, 1.7),
        g_proj: Vec::new(),
        g_a: mat("g_a_proj.weight", k, d, 1.7),
        g_b: mat("g_b_proj.weight", p, k, 1.7),
        o_norm: Vec::new(),
        o_proj: mat("o_proj.weight", d, p, 1.7),
    };
    let mut w = w;
    let mut f32t = |name: &str, shape: Vec<usize>, vals: Vec<f32>| -> Vec<f32> {
        tensors.push((name.into(), DType::F32, shape, bytemuck::cast_slice(&vals).to_vec()));
        vals
    };
    w.q_conv = f32t("q_conv1d.weight", vec![p, 1, taps], scaled(601, p * taps, 0.8));
    w.k_conv = f32t("k_conv1d.weight", vec![p, 1, taps], scaled(602, p * taps, 0.8));
    w.v_conv = f32t("v_conv1d.weight", vec![p, 1, taps], scaled(603, p * taps, 0.8));
    w.dt_bias = f32t("dt_bias", vec![p], scaled(604, p, 1.0));
    w.a_log = f32t("A_log", vec![1, 1, h, 1], support::random_vec(605, h).into_iter().map(|x| x + 1.0).collect());
    w.o_norm = f32t("o_norm.weight", vec![k], scaled(606, k, 0.2).into_iter().map(|x| x + 1.0).collect());
    let views: Vec<(String, TensorView)> =
        tensors.iter().map(|(n, dt, s, b)| (format!("attn.{n}"), TensorView { dtype: *dt, shape: s, data: b })).collect();
    let layer = KdaLayer::from_tensors(&gpu, &cfg, d, "attn.", |n| views.iter().find(|(m, _)| m == n).map(|(_, v)| *v))
        .expect("build layer");
    let (t0, n) = (33, 4);
    let x = scaled(700, (150 + n) * d, 1.0);
    let mut rst = r::KdaState::zeros(&sh);
    let (want, _) = r::layer(&sh, &w, &x[..(t0 + n) * d], t0 + n, &mut rst);
    let mut st = KdaState::new(&gpu, &layer.geom);
    let got = run_layer(&gpu, &layer, &mut st, &x[..t0 * d], t0, t0);
    let snap = st.snapshot(&gpu).expect("snapshot");
    let tail = run_layer(&gpu, &layer, &mut st, &x[t0 * d..(t0 + n) * d], 0, n);
    let all: Vec<f32> = [got, tail.clone()].concat();
    let e = rel_l2(&all, &want);
    eprintln!("random low-rank softplus layer: rel L2 {e:.2e}");
    assert!(e <= TOL, "layer vs reference: {e:.2e}");
    // Restore and replay: bit-identical; a different continuation then diverges from it.
    st.restore(&gpu, &snap).expect("restore");
    assert_eq!(st.pos, t0 as u64);
    let again = run_layer(&gpu, &layer, &mut st, &x[t0 * d..(t0 + n) * d], 0, n);
    assert_eq!(again, tail, "restored state replays bit-identically");
    // A prompt longer than one prefill piece runs as pieces and gives the same result.
    let mut layer = layer;
    layer.max_prefill_tokens = 64;
    let mut st = KdaState::new(&gpu, &layer.geom);
    let pieces = run_layer(&gpu, &layer, &mut st, &x, 150, 150 + n);
    let mut rst = r::KdaState::zeros(&sh);
    let (want, _) = r::layer(&sh, &w, &x[..(150 + n) * d], 150 + n, &mut rst);
    let e = rel_l2(&pieces, &want);
    eprintln!("prefill of 150 tokens in pieces of 64, then decode: rel L2 {e:.2e}");
    assert!(e <= TOL, "pieces: {e:.2e}");
    let bad = k31_engine::layers::kda::KdaSnapshot { state: vec![0.0; 3], ring: Vec::new(), pos: 0 };
    assert!(st.restore(&gpu, &bad).is_err(), "a mis-sized snapshot is refused");
}
