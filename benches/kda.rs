//! KDA kernels at one K3.1 layer's shape (96 heads x 128), next to ceilings measured in the same
//! run. Every row says how it was timed:
//! * decode: the fused one-token kernel per layer over 16 distinct layer states (96 MiB, more
//!   than the 60 MB L2) so the state streams from memory; rate = state read + write bytes.
//!   Timed three ways: one compute pass per layer with its own timestamp pair (what the
//!   engine's profiler sees), and all 16 layers in ONE pass with one timestamp pair (a) with
//!   independent buffers per layer (dispatches may overlap) and (b) sharing the o buffer, so
//!   wgpu orders them like dependent layers. Same-size ceilings: a copy of each of the 16
//!   states with a pass each, and all 16 copies in ONE pass, independent or ordered (every
//!   dispatch writes its own range of one shared destination buffer, so wgpu puts a barrier
//!   between them as between the ordered decodes). Each one-pass decode figure is printed as
//!   a % of the large-buffer copy and of the same-size one-pass copy timed the same way.
//!   Every variant this adapter runs is timed and checked against the chunked path at T = 1,
//!   and the model's one-dispatch decode (`decode_gated`: f_b's product, the recurrence and the
//!   gated norm, a workgroup per head) with a pass each.
//! * prefill: the chunked WY/UT path (prep + cumsum + intra + scan + out) at T = 8192, with a
//!   per-kernel breakdown, its FLOP rate and its error against the f64 CPU recurrence on a few
//!   heads, then with each state-pass kernel;
//! * the same 8192 tokens token by token through the decode kernel (wall clock of one
//!   submission, the fastest of three), for the >= 20x comparison.
//!
//! Run: `cargo bench --bench kda -- [--quick] [--decode-only | --prefill-only | --state-only]
//! [--json FILE]` (`--decode-only`: the decode section and its targets only; `--prefill-only`:
//! everything but the decode timings; `--state-only`: the SIMT prefill with each state-pass
//! kernel, nothing else).

use k31_engine::bench::{copy_bandwidth, median_span, time_gpu, warm_gpu, Row};
use k31_engine::config::KdaGate;
use k31_engine::gpu::{Gpu, GpuError, Profiler};
use k31_engine::ops::kda::{self, ChunkScratch, DecodeStep, DecodeVariant, KdaGeom, KdaInputs, PrepKernel, Prepped, StateVariant};
use k31_engine::reference::kda as r;
use k31_engine::wgpu;

/// Median GPU time (s) of one compute pass that `record` opens with the timestamp writes it
/// is given (wall clock of the submission where timestamps are unavailable).
fn time_one_pass(
    gpu: &Gpu,
    reps: usize,
    mut record: impl FnMut(&mut wgpu::CommandEncoder, Option<wgpu::ComputePassTimestampWrites>) -> Result<(), GpuError>,
) -> Result<f64, GpuError> {
    median_span(gpu, 3, reps, |enc, stamps| record(enc, stamps.map(|st| st.writes(Some(0), Some(1)))))
}

/// (relative L2 error, max |err| / max |want|) of `got` against `want`.
fn errors(got: &[f32], want: &[f32]) -> (f64, f64) {
    let (mut num, mut den, mut emax, mut wmax) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
    for (&g, &w) in got.iter().zip(want) {
        let d = g as f64 - w as f64;
        num += d * d;
        den += (w as f64) * (w as f64);
        emax = emax.max(d.abs());
        wmax = wmax.max((w as f64).abs());
    }
    ((num / den.max(1e-300)).sqrt(), emax / wmax.max(1e-300))
}

fn note(extra: &mut serde_json::Map<String, serde_json::Value>, k: &str, v: f64) {
    extra.insert(k.to_string(), v.into());
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let json_out = args.iter().position(|a| a == "--json").and_then(|i| args.get(i + 1)).cloned();
    let quick = args.iter().any(|a| a == "--quick");
    let decode_only = args.iter().any(|a| a == "--decode-only");
    // --state-only: only the SIMT path's state-pass variants (kernel experiments).
    let state_only = args.iter().any(|a| a == "--state-only");
    let prefill_only = state_only || args.iter().any(|a| a == "--prefill-only");
    let gpu = Gpu::open(None)?;
    println!("GPU: {}  (coopmat: {}, workgroup memory limit {} B)", gpu.describe(), gpu.caps.coopmat, gpu.caps.max_workgroup_storage);
    let copy = copy_bandwidth(&gpu, if quick { 64 << 20 } else { 1 << 30 })? / 1e9;
    println!("copy bandwidth (read+write, 1 GiB): {copy:.1} GB/s");
    let (heads, dk, t_len, layers, check_heads) = if quick { (4, 128, 512, 2, 2) } else { (96, 128, 8192, 16, 4) };
    let geom = KdaGeom { heads, head_dim: dk, taps: 4, gate: KdaGate::Bounded { lower_bound: -5.0 }, post_conv: false };
    let p = geom.proj();
    let rnd = |n: usize, s: f32| -> Vec<f32> { (0..n).map(|i| (((i * 7919) % 1013) as f32 / 1013.0 - 0.5) * s).collect() };
    // Decode reads one token's inputs: --decode-only binds no prefill-sized buffers (1.2 GB
    // of qkv at T = 8192 is past lavapipe's 128 MiB binding limit).
    let input_rows = if decode_only { 1 } else { t_len };
    let qkv = gpu.storage_from("qkv", &rnd(input_rows * 3 * p, 2.0));
    let f = gpu.storage_from("f", &rnd(input_rows * p, 2.0));
    let b = gpu.storage_from("b", &rnd(input_rows * heads, 4.0));
    let conv_w = gpu.storage_from("conv", &rnd(3 * p * 4, 1.0));
    let a_log = gpu.storage_from("a_log", &vec![1.0f32; heads]);
    let dt_bias = gpu.storage_from("dt", &rnd(p, 1.0));
    let inp = KdaInputs { qkv: &qkv, f: &f, b: &b, conv_w: &conv_w, a_log: &a_log, dt_bias: &dt_bias };
    let ring_data = rnd(4 * 3 * p, 1.5);
    let ring = gpu.storage_from("ring", &ring_data);
    let state_bytes = heads * dk * dk * 4;
    let mut rows = Vec::new();
    let mut extra = serde_json::Map::new();

    // ---- Decode: one token per layer, `layers` distinct states (and rings, o buffers). ----
    println!("\n== decode, {heads} heads x {dk}x{dk} f32 state, {layers} distinct layer states; rate = state read+write ==");
    let states: Vec<_> = (0..layers).map(|_| gpu.storage_from("state", &rnd(heads * dk * dk, 0.1))).collect();
    let rings: Vec<_> = (0..layers).map(|_| gpu.storage_from("ring", &ring_data)).collect();
    let os: Vec<_> = (0..layers).map(|_| gpu.storage("o", (p * 4) as u64)).collect();
    let per_row = |name: String, t: f64| Row { name, time_us: t * 1e6, rate: 2.0 * state_bytes as f64 / t / 1e9, ceiling: copy, unit: "GB/s" };
    let mut copy_one_pass = [f64::NAN; 2];
    if !prefill_only {
        // Same-shape ceiling: a copy of one state per pass, 16 distinct buffers.
        let dsts: Vec<_> = (0..layers).map(|_| gpu.storage("copy dst", state_bytes as u64)).collect();
        let t = time_gpu(&gpu, 3, 20, |enc, mut prof| {
            for (s, d) in states.iter().zip(&dsts) {
                k31_engine::ops::copy::copy(&gpu, enc, s, d, state_bytes as u64, prof.as_deref_mut())?;
            }
            Ok(())
        })? / layers as f64;
        let row = per_row(format!("copy of one state ({:.1} MB), pass each", state_bytes as f64 / 1e6), t);
        row.print();
        note(&mut extra, "copy_state_pass_each_us", t * 1e6);
        rows.push(row);
        // The same 16 copies in ONE pass: independent (own destinations) or ordered (ranges of one
        // shared destination: wgpu tracks whole buffers, so it puts a barrier between them).
        let copy_pipe = gpu.pipelines.get(&gpu, &k31_engine::ops::copy::COPY_VEC4)?;
        let copy_uniform =
            gpu.uniform("copy params", &k31_engine::ops::copy::CopyParams { words4: (state_bytes / 16) as u32, ..Default::default() });
        let dst_all = gpu.storage("copy dst x layers", (layers * state_bytes) as u64);
        for (i, (label, ordered)) in [("one pass, independent", false), ("one pass, ordered", true)].into_iter().enumerate() {
            let binds: Vec<wgpu::BindGroup> = (0..layers)
                .map(|l| {
                    let dst = if ordered {
                        wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                            buffer: &dst_all,
                            offset: (l * state_bytes) as u64,
                            size: std::num::NonZeroU64::new(state_bytes as u64),
                        })
                    } else {
                        dsts[l].as_entire_binding()
                    };
                    gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
                        label: Some("copy x layers"),
                        layout: &copy_pipe.get_bind_group_layout(0),
                        entries: &[
                            wgpu::BindGroupEntry { binding: 0, resource: copy_uniform.as_entire_binding() },
                            wgpu::BindGroupEntry { binding: 1, resource: states[l].as_entire_binding() },
                            wgpu::BindGroupEntry { binding: 2, resource: dst },
                        ],
                    })
                })
                .collect();
            let (gx, gy) = gpu.grid((state_bytes / 16).div_ceil(256) as u32);
            let t = time_one_pass(&gpu, 20, |enc, ts| {
                let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("copy x layers"), timestamp_writes: ts });
                pass.set_pipeline(&copy_pipe);
                for b in &binds {
                    pass.set_bind_group(0, b, &[]);
                    pass.dispatch_workgroups(gx, gy, 1);
                }
                Ok(())
            })? / layers as f64;
            copy_one_pass[i] = t;
            let row = per_row(format!("copy of one state, {label}"), t);
            row.print();
            note(&mut extra, &format!("copy_state_{}_us", if ordered { "one_pass_ordered" } else { "one_pass_independent" }), t * 1e6);
            rows.push(row);
        }
        for dv in DecodeVariant::available(&gpu, &geom) {
            let t = time_gpu(&gpu, 3, 20, |enc, mut prof| {
                for ((s, rg), o) in states.iter().zip(&rings).zip(&os) {
                    kda::decode_with(&gpu, enc, dv, &geom, 100, &inp, rg, s, o, prof.as_deref_mut())?;
                }
                Ok(())
            })? / layers as f64;
            let row = per_row(format!("kda decode [{dv:?}] per layer, pass each"), t);
            row.print();
            note(&mut extra, &format!("decode_{dv:?}_pass_each_us"), t * 1e6);
            rows.push(row);
            for (label, shared_o) in [("one pass, independent", false), ("one pass, ordered", true)] {
                let t = time_one_pass(&gpu, 20, |enc, ts| {
                    let steps: Vec<DecodeStep> = (0..layers)
                        .map(|l| DecodeStep {
                            inp: KdaInputs { qkv: &qkv, f: &f, b: &b, conv_w: &conv_w, a_log: &a_log, dt_bias: &dt_bias },
                            ring: &rings[l],
                            state: &states[l],
                            o: if shared_o { &os[0] } else { &os[l] },
                            pos: 100,
                        })
                        .collect();
                    kda::decode_one_pass(&gpu, enc, &geom, dv, &steps, ts)
                })? / layers as f64;
                let row = per_row(format!("kda decode [{dv:?}] per layer, {label}"), t);
                row.print();
                let same = copy_one_pass[shared_o as usize];
                println!("{:<48} {:>10}     same-size copy, {label}: {:.2} us -> decode at {:.1} % of it", "", "", same * 1e6, 100.0 * same / t);
                note(&mut extra, &format!("decode_{dv:?}_{}_pct_of_same_copy", if shared_o { "one_pass_ordered" } else { "one_pass_independent" }), 100.0 * same / t);
                note(&mut extra, &format!("decode_{dv:?}_{}_us", if shared_o { "one_pass_ordered" } else { "one_pass_independent" }), t * 1e6);
                rows.push(row);
            }
        }
        // The model's decode where it fits: f = W_fb f_a, the recurrence and the gated norm in
        // one dispatch per layer (`kda_decode_tg`); the same state traffic, plus 32 KB of W_fb
        // per head.
        let w_fb_bytes: Vec<u8> = rnd(p * dk, 0.2).iter().flat_map(|&x| half::bf16::from_f32(x).to_le_bytes()).collect();
        let w_fb = k31_engine::gpu::GpuTensor::upload(&gpu, "w_fb", k31_engine::layout::DType::BF16, &[p, dk], &w_fb_bytes, None)?;
        if kda::gated_fits(&gpu, &geom, &w_fb) {
            let f_a = gpu.storage_from("f_a", &rnd(dk, 1.0));
            let gate = gpu.storage_from("gate", &rnd(p, 3.0));
            let norm_w = gpu.storage_from("o_norm", &vec![1.0f32; dk]);
            let ys: Vec<_> = (0..layers).map(|_| gpu.storage("y", (p * 4) as u64)).collect();
            let t = time_gpu(&gpu, 3, 20, |enc, mut prof| {
                for ((s, rg), y) in states.iter().zip(&rings).zip(&ys) {
                    let fb = kda::GateLowRank { w_fb: &w_fb, f_a: &f_a };
                    kda::decode_gated(&gpu, enc, &geom, 100, &inp, fb, rg, s, &gate, &norm_w, y, prof.as_deref_mut())?;
                }
                Ok(())
            })? / layers as f64;
            let row = per_row("kda decode + f_b + gated norm [kda_decode_tg] per layer, pass each".into(), t);
            row.print();
            note(&mut extra, "decode_gated_pass_each_us", t * 1e6);
            rows.push(row);
        }
        // Check: each decode variant vs prep + chunked prefill of the same single token, same ring
        // and state.
        for dv in DecodeVariant::available(&gpu, &geom) {
            let s0 = rnd(heads * dk * dk, 0.1);
            let (sa, sb) = (gpu.storage_from("sa", &s0), gpu.storage_from("sb", &s0));
            let (ra, rb) = (gpu.storage_from("ra", &ring_data), gpu.storage_from("rb", &ring_data));
            let (oa, ob) = (gpu.storage("oa", (p * 4) as u64), gpu.storage("ob", (p * 4) as u64));
            let pre = Prepped::new(&gpu, &geom, 1);
            let scratch = ChunkScratch::new(&gpu, &geom, 1)?;
            let mut enc = gpu.device.create_command_encoder(&Default::default());
            kda::decode_with(&gpu, &mut enc, dv, &geom, 100, &inp, &ra, &sa, &oa, None)?;
            kda::prep(&gpu, &mut enc, &geom, 1, 100, &inp, &rb, &pre, None)?;
            kda::chunk_prefill(&gpu, &mut enc, &geom, &pre, &scratch, &sb, &ob, None)?;
            gpu.queue.submit([enc.finish()]);
            let (eo, _) = errors(&gpu.read::<f32>(&oa, p)?, &gpu.read::<f32>(&ob, p)?);
            let (es, _) = errors(&gpu.read::<f32>(&sa, heads * dk * dk)?, &gpu.read::<f32>(&sb, heads * dk * dk)?);
            println!("    check: decode [{dv:?}] vs chunked SIMT at T=1: o rel L2 {eo:.2e}, state rel L2 {es:.2e}");
            note(&mut extra, &format!("decode_{dv:?}_check_o_rel_l2"), eo);
            note(&mut extra, &format!("decode_{dv:?}_check_state_rel_l2"), es);
        }
        println!("    default decode variant here: {:?}", DecodeVariant::default_for(&gpu, &geom));
    }

    let want_us = 2.0 * state_bytes as f64 / (0.7 * copy * 1e9) * 1e6;
    let decode_targets = |extra: &serde_json::Map<String, serde_json::Value>| {
        println!("\n== targets ==");
        let same = copy_one_pass[1] * 1e6;
        println!(
            "same-size copy per layer: {:.2} us pass each, {same:.2} us one pass ordered ({:.1} % of the large copy), {:.2} us one pass independent",
            extra.get("copy_state_pass_each_us").and_then(|v| v.as_f64()).unwrap_or(f64::NAN),
            100.0 * 2.0 * state_bytes as f64 / (same * 1e-6) / (copy * 1e9),
            copy_one_pass[0] * 1e6
        );
        for dv in DecodeVariant::available(&gpu, &geom) {
            let get = |k: &str| extra.get(&format!("decode_{dv:?}_{k}_us")).and_then(|v| v.as_f64()).unwrap_or(f64::NAN);
            let ord = get("one_pass_ordered");
            println!(
                "decode [{dv:?}] per layer: {:.2} us pass each, {ord:.2} us one pass ordered ({:.1} % of large copy, {:.1} % of same-size ordered copy), {:.2} us one pass independent; 70 % of copy = {want_us:.2} us",
                get("pass_each"),
                100.0 * 2.0 * state_bytes as f64 / (ord * 1e-6) / (copy * 1e9),
                100.0 * same / ord,
                get("one_pass_independent")
            );
        }
    };
    if decode_only {
        decode_targets(&extra);
        if let Some(path) = json_out {
            let mut j = serde_json::json!({"gpu": gpu.describe(), "copy_gbs": copy, "rows": rows});
            if let Some(m) = j.as_object_mut() {
                m.extend(extra);
            }
            std::fs::write(&path, serde_json::to_string_pretty(&j)?)?;
        }
        return Ok(());
    }

    // ---- Chunked prefill, per path. ----
    println!("\n== chunked prefill T={t_len}, {heads} heads x {dk}; rate = useful FLOPs of the chunked form ==");
    let pre = Prepped::new(&gpu, &geom, t_len);
    let state = gpu.storage("state", state_bytes as u64);
    let ot = gpu.storage("o", (t_len * p * 4) as u64);
    // Useful FLOPs of the chunked form per (chunk, head): A_kk + A_qk (2 C^2 K), UT solve on
    // K + V columns (C^2 (K+V)/2 x 2), U = u - wS, qg S, kg^T U (3 x 2 C K V), A_qk U (C^2 V).
    let (c, kf) = (64.0, dk as f64);
    let per = 2.0 * c * c * kf * 2.0 + c * c * 2.0 * kf + 3.0 * 2.0 * c * kf * kf + c * c * kf;
    let flops = per * (t_len as f64 / 64.0).ceil() * heads as f64;
    // Reference inputs for the error check: the prepped q, k, v, g, beta of `check_heads` heads
    // (runs of 8: runs of a whole chunk would write g as its within-chunk cumsum).
    let mut enc = gpu.device.create_command_encoder(&Default::default());
    kda::prep_with_run(&gpu, &mut enc, PrepKernel::default_for(&gpu, &geom), &geom, t_len, 0, &inp, &ring, &pre, 8, None)?;
    gpu.queue.submit([enc.finish()]);
    let pick = |buf: &wgpu::Buffer, w: usize| -> Result<Vec<f32>, GpuError> {
        let all = gpu.read::<f32>(buf, t_len * heads * w)?;
        Ok((0..t_len).flat_map(|t| all[(t * heads) * w..(t * heads + check_heads) * w].to_vec()).collect())
    };
    let (rq, rk, rv, rg) = (pick(&pre.q, dk)?, pick(&pre.k, dk)?, pick(&pre.v, dk)?, pick(&pre.g, dk)?);
    let rbeta = pick(&pre.beta, 1)?;
    let t0 = std::time::Instant::now();
    let (want_o, want_s) = r::recurrence(&rq, &rk, &rv, &rg, &rbeta, &[], t_len, check_heads, dk, dk);
    println!("    (f64 CPU reference over {check_heads} heads: {:.1} s)", t0.elapsed().as_secs_f64());
    let mut t_best = f64::INFINITY;
    // One run of `record` (which starts from S0 = 0): all heads' o and final state, and their
    // (rel L2, max) errors against the f64 reference on the first `check_heads` heads.
    type Record<'a> = dyn FnMut(&mut wgpu::CommandEncoder, Option<&mut Profiler>) -> Result<(), GpuError> + 'a;
    type Checked = (Vec<f32>, Vec<f32>, (f64, f64), (f64, f64));
    let checked_run = |record: &mut Record| -> Result<Checked, GpuError> {
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        record(&mut enc, None)?;
        gpu.queue.submit([enc.finish()]);
        let o_all = gpu.read::<f32>(&ot, t_len * p)?;
        let s_all = gpu.read::<f32>(&state, heads * dk * dk)?;
        let o_sub: Vec<f32> = (0..t_len).flat_map(|t| o_all[t * p..t * p + check_heads * dk].to_vec()).collect();
        let (eo, es) = (errors(&o_sub, &want_o), errors(&s_all[..check_heads * dk * dk], &want_s));
        Ok((o_all, s_all, eo, es))
    };
    // One run of `record` with per-kernel timestamps: the kernels' GPU times, largest first
    // (empty where the adapter has no timestamp queries).
    let profiled_run = |record: &mut Record| -> Result<Vec<k31_engine::gpu::OpTime>, GpuError> {
        let mut prof = Profiler::new(&gpu, 64);
        if !prof.enabled() {
            return Ok(Vec::new());
        }
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        record(&mut enc, Some(&mut prof))?;
        gpu.queue.submit([enc.finish()]);
        prof.collect(&gpu)?;
        Ok(prof.report())
    };
    if !state_only {
        // Report keys keep the name the SIMT path had beside the former coop path.
        let path = "Simt";
        let scratch = ChunkScratch::new(&gpu, &geom, t_len)?;
        let mut record = |enc: &mut wgpu::CommandEncoder, mut prof: Option<&mut Profiler>| -> Result<(), GpuError> {
            enc.clear_buffer(&state, 0, None);
            kda::prep(&gpu, enc, &geom, t_len, 0, &inp, &ring, &pre, prof.as_deref_mut())?;
            kda::chunk_prefill(&gpu, enc, &geom, &pre, &scratch, &state, &ot, prof)
        };
        // The f64 reference (seconds on the host) left the GPU idle: back to its steady clock.
        warm_gpu(&gpu, 150, 4000)?;
        let t_pre = time_gpu(&gpu, 2, 10, &mut record)?;
        t_best = t_best.min(t_pre);
        let name = format!("kda chunked prefill T={t_len} {heads}x{dk} [{path}]");
        println!("    ({path} chunk scratch: {:.1} MB, plus the prepped q, k, v, g, beta: {:.1} MB)", scratch.bytes() as f64 / 1e6,
            (4 * t_len * p * 4 + t_len * heads * 4) as f64 / 1e6);
        note(&mut extra, &format!("prefill_{path}_scratch_mb"), scratch.bytes() as f64 / 1e6);
        println!("{:<56} {:>10.2} us  {:>9.2} TFLOP/s  ({:.2} M tokens/s)", name, t_pre * 1e6, flops / t_pre / 1e12, t_len as f64 / t_pre / 1e6);
        rows.push(Row { name, time_us: t_pre * 1e6, rate: flops / t_pre / 1e12, ceiling: f64::NAN, unit: "TFLOP/s" });
        note(&mut extra, &format!("prefill_{path}_us"), t_pre * 1e6);
        for op in profiled_run(&mut record)? {
            println!("    {:<32} {:>10.1} us", op.label, op.total_ns / 1e3);
            note(&mut extra, &format!("prefill_{path}_{}_us", op.label), op.total_ns / 1e3);
        }
        // Errors: one more run from S0 = 0, against the CPU reference on the first heads.
        let (_, _, (eo, mo), (es, ms)) = checked_run(&mut record)?;
        println!("    vs f64 reference ({check_heads} heads): o rel L2 {eo:.2e} (max {mo:.2e}), final state rel L2 {es:.2e} (max {ms:.2e})");
        note(&mut extra, &format!("prefill_{path}_o_rel_l2"), eo);
        note(&mut extra, &format!("prefill_{path}_state_rel_l2"), es);
    }

    // The SIMT path with each state-pass kernel that runs here (same inputs): whole prefill,
    // the state kernel's profiled time, and the errors against the reference.
    {
        let scratch = ChunkScratch::new(&gpu, &geom, t_len)?;
        println!("    SIMT state-pass variants (default here: {:?}):", StateVariant::default_for(&gpu, &geom)?);
        for sv in StateVariant::ALL {
            if !sv.runs_on(&gpu, &geom)? {
                continue;
            }
            let mut record = |enc: &mut wgpu::CommandEncoder, mut prof: Option<&mut Profiler>| -> Result<(), GpuError> {
                enc.clear_buffer(&state, 0, None);
                kda::prep(&gpu, enc, &geom, t_len, 0, &inp, &ring, &pre, prof.as_deref_mut())?;
                kda::chunk_prefill_state(&gpu, enc, sv, &geom, &pre, &scratch, &state, &ot, prof)
            };
            let t_sv = time_gpu(&gpu, 2, 10, &mut record)?;
            t_best = t_best.min(t_sv);
            let ops = profiled_run(&mut record)?;
            let state_ops = ops.iter().filter(|op| op.label.starts_with("kda_chunk_state"));
            let state_us = if ops.is_empty() { f64::NAN } else { state_ops.map(|op| op.total_ns / 1e3).sum() };
            let (_, _, (eo, _), (es, _)) = checked_run(&mut record)?;
            println!("      [{sv:?}] prefill {:>9.1} us, state pass {state_us:>8.1} us; vs f64: o {eo:.2e}, state {es:.2e}", t_sv * 1e6);
            note(&mut extra, &format!("prefill_state_{sv:?}_us"), t_sv * 1e6);
            note(&mut extra, &format!("prefill_state_{sv:?}_state_us"), state_us);
            note(&mut extra, &format!("prefill_state_{sv:?}_o_rel_l2"), eo);
            note(&mut extra, &format!("prefill_state_{sv:?}_state_rel_l2"), es);
        }
    }

    if state_only {
        return Ok(());
    }
    // Token by token through the decode kernel: one submission of T dispatches, the fastest
    // of three, each started at the steady clock (one submission's wall clock swung from 142 to
    // 291 ms between processes on the H200 before the warm-up; the fastest is the conservative
    // baseline for the speedup).
    let mut tok = Vec::new();
    for _ in 0..3 {
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        for pos in 0..t_len {
            kda::decode(&gpu, &mut enc, &geom, pos as u64, &inp, &ring, &state, &ot, None)?;
        }
        let cmd = enc.finish();
        gpu.wait()?;
        // Recording 8192 dispatches leaves the GPU idle long enough to drop its clock.
        warm_gpu(&gpu, 150, 4000)?;
        let start = std::time::Instant::now();
        gpu.queue.submit([cmd]);
        gpu.wait()?;
        tok.push(start.elapsed().as_secs_f64());
    }
    let t_tok = tok.iter().copied().fold(f64::INFINITY, f64::min);
    println!(
        "\n{:<56} {:>10.2} us  (best chunked prefill is {:.1}x faster; the three submissions: {})",
        format!("kda token-by-token T={t_len} (wall clock)"),
        t_tok * 1e6,
        t_tok / t_best,
        tok.iter().map(|t| format!("{:.0} us", t * 1e6)).collect::<Vec<_>>().join(", ")
    );
    note(&mut extra, "token_by_token_us", t_tok * 1e6);
    note(&mut extra, "chunked_speedup", t_tok / t_best);

    // Targets (issue #4) against this run's numbers.
    if !prefill_only {
        decode_targets(&extra);
    }
    println!("prefill best path: {:.3} ms (target <= 2x fla chunk_kda, about 6.3 ms; fla measured 3.1 ms)", t_best * 1e3);
    println!("chunked vs token-by-token: {:.1}x (target >= 20x)", t_tok / t_best);

    if let Some(path) = json_out {
        let mut j = serde_json::json!({"gpu": gpu.describe(), "copy_gbs": copy, "rows": rows});
        if let Some(m) = j.as_object_mut() {
            m.extend(extra);
        }
        std::fs::write(&path, serde_json::to_string_pretty(&j)?)?;
    }
    Ok(())
}
