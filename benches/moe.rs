//! MoE benchmarks on the benchmark GPU, next to the copy bandwidth measured in the same run:
//! bf16 GEMV at the K3.1 shapes (every fast-path variant), MXFP4 top-16 expert GEMV of the
//! real 3584 x 3072 experts (decode: gate/up + down, routing read from GPU memory), and
//! 256- and 2048-token prefill MoE chunks (grouped by expert on the GPU) with every grouped
//! kernel variant the adapter runs, each checked against an f64 CPU reference on sampled tokens.
//! Run: `cargo bench --bench moe [-- --quick] [--experts-only | --prefill-only [--skip-old]] [--json FILE]`.

use k31_engine::bench::{time_back_to_back, breakdown, copy_bandwidth, time_gpu, warm_gpu, Row};
use k31_engine::config::{Activation, ExpertFormat};
use k31_engine::experts::{ExpertStore, ExpertWeights, SlotLayout};
use k31_engine::gpu::{Gpu, GpuTensor};
use k31_engine::layout::DType;
use k31_engine::ops::{copy, gemv, moe};
use k31_engine::reference;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let json_out = args.iter().position(|a| a == "--json").and_then(|i| args.get(i + 1)).cloned();
    let quick = args.iter().any(|a| a == "--quick");
    // --experts-only: just the MXFP4 decode variants (kernel experiments).
    let experts_only = args.iter().any(|a| a == "--experts-only");
    // --prefill-only: just the grouped (prefill) expert kernels.
    let prefill_only = args.iter().any(|a| a == "--prefill-only");
    // --skip-old: leave out the first grouped kernels (seconds per 2048-token chunk).
    let skip_old = args.iter().any(|a| a == "--skip-old");
    let gpu = Gpu::open(None)?;
    println!("GPU: {}", gpu.describe());
    let copy = copy_bandwidth(&gpu, if quick { 64 << 20 } else { 1 << 30 })? / 1e9;
    println!("copy bandwidth (read+write): {copy:.1} GB/s");
    let mut rows = Vec::new();

    // bf16 GEMV at K3.1 shapes, each fast-path variant.
    let shapes: &[(&str, usize, usize)] = if experts_only || prefill_only {
        &[]
    } else if quick {
        &[("1024x1024", 1024, 1024)]
    } else {
        &[
            ("q/k/v/g 7168->12288", 12288, 7168),
            ("o_proj 12288->7168", 7168, 12288),
            ("shared up 7168->6144", 6144, 7168),
            ("shared down 6144->7168", 7168, 6144),
            ("latent down 7168->3584", 3584, 7168),
            ("latent up 3584->7168", 7168, 3584),
            ("dense up 7168->33792", 33792, 7168),
            ("lm_head 7168->163840", 163840, 7168),
            ("global q_b 1536->18432", 18432, 1536),
        ]
    };
    let variants: Vec<_> = gemv::FAST_VARIANTS.iter().filter(|k| !k.needs_subgroups || gpu.caps.subgroups).copied().collect();
    for &(name, n, k) in shapes {
        let bytes: Vec<u8> = (0..n * k).flat_map(|i| half::bf16::from_f32(((i % 13) as f32 - 6.0) * 0.01).to_le_bytes()).collect();
        let w = GpuTensor::upload(&gpu, name, DType::BF16, &[n, k], &bytes, None)?;
        let x = gpu.storage_from("x", &vec![0.5f32; k]);
        let y = gpu.storage("y", (n * 4) as u64);
        // A printed row of this matrix's bytes per `t` seconds.
        let gemv_row = |label: String, t: f64| {
            let row = Row { name: format!("{label} {name}"), time_us: t * 1e6, rate: (n * k * 2) as f64 / t / 1e9, ceiling: copy, unit: "GB/s" };
            row.print();
            row
        };
        // Generating W on the host left the GPU idle: back to its steady clock first.
        warm_gpu(&gpu, 150, 4000)?;
        for &v in &variants {
            let t = time_gpu(&gpu, 5, 30, |enc, prof| gemv::gemv_into(&gpu, enc, &w, &x, &y, Some(v), false, prof))?;
            rows.push(gemv_row(v.name.to_string(), t));
        }
        // The ceiling timed the way a GEMV is: one pass copying half of W's bytes (so as many
        // bytes move), with the same pass and dispatch costs that no kernel of this size avoids.
        if n * k * 2 <= gpu.caps.max_binding as usize {
            let (src, dst) = (gpu.storage("copy src", (n * k) as u64), gpu.storage("copy dst", (n * k) as u64));
            let t = time_gpu(&gpu, 5, 30, |enc, prof| copy::copy(&gpu, enc, &src, &dst, (n * k) as u64, prof))?;
            rows.push(gemv_row("same-size copy (half of W's bytes read, half written)".to_string(), t));
            // And W itself read once with no arithmetic: what any kernel reading it must take.
            let sink = gpu.storage("read sink", 16);
            let r = time_gpu(&gpu, 5, 30, |enc, mut prof| {
                for c in &w.chunks {
                    copy::read_all(&gpu, enc, &c.buffer, &sink, prof.as_deref_mut())?;
                }
                Ok(())
            })?;
            rows.push(gemv_row("read of W alone (no arithmetic)".to_string(), r));
            let g = time_gpu(&gpu, 5, 30, |enc, prof| gemv::gemv_into(&gpu, enc, &w, &x, &y, None, false, prof))?;
            println!("    the default GEMV ({:.2} us) at {:.1} % of the same-size copy's rate, {:.1} % of W's read alone", g * 1e6, 100.0 * t / g, 100.0 * r / g);
        }
        // Cold: each timed GEMV reads one of m copies of W in turn (~4 GB in all), as a model
        // reads each matrix once per token; the rows above repeat one matrix.
        if n * k * 2 <= 512 << 20 {
            let m = ((4usize << 30) / (n * k * 2)).clamp(2, 24);
            let copies: Vec<GpuTensor> = (0..m).map(|_| GpuTensor::upload(&gpu, name, DType::BF16, &[n, k], &bytes, None)).collect::<Result<_, _>>()?;
            let turn = std::cell::Cell::new(0usize);
            warm_gpu(&gpu, 150, 4000)?;
            // Then probes of why: each copy's address translations warmed (`copy::page_touch`,
            // one word per 64 KiB) in the same timed run just before its GEMV, or in the previous
            // submission (untimed).
            let cold = format!("gemv cold ({m} copies in turn)");
            for (label, first, ahead) in [(cold.as_str(), false, false), ("gemv cold, pages read first, timed", true, false), ("gemv cold, pages read one call ahead", false, true)] {
                let t = time_gpu(&gpu, 5, 30, |enc, mut prof| {
                    let i = turn.get();
                    turn.set(i + 1);
                    if first {
                        copy::page_touch_tensor(&gpu, enc, &copies[i % m], prof.as_deref_mut())?;
                    }
                    gemv::gemv_into(&gpu, enc, &copies[i % m], &x, &y, None, false, prof)?;
                    if ahead {
                        copy::page_touch_tensor(&gpu, enc, &copies[(i + 1) % m], None)?;
                    }
                    Ok(())
                })?;
                rows.push(gemv_row(label.to_string(), t));
            }
        }
        // Back to back as in a model's command stream (8 per submission, two copies of W in
        // turn so the previous GEMV's weights are not in L2), default kernel.
        if n * k * 2 <= 512 << 20 {
            let w2 = GpuTensor::upload(&gpu, name, DType::BF16, &[n, k], &bytes, None)?;
            let t = time_back_to_back(&gpu, 3, 20, 8, |enc, i| gemv::gemv(&gpu, enc, if i % 2 == 0 { &w } else { &w2 }, &x, &y, None))?;
            rows.push(gemv_row("gemv back to back".to_string(), t));
        }
    }

    // The global layer's decode projections as the model dispatches them (`gemv_many`: up to
    // four matrices per pass), then each matrix alone: where its GEMV time goes.
    // (group, cols, [(matrix, rows)]).
    type Projections<'a> = &'a [(&'a str, usize, &'a [(&'a str, usize)])];
    let projections: Projections = if shapes.len() > 1 {
        &[
            ("global from x", 7168, &[("q_a", 1536), ("kv_a", 576), ("g_proj", 12288), ("wk", 128), ("weights_proj", 32)]),
            ("global from c_q", 1536, &[("q_b", 18432), ("wq_b", 4096)]),
        ]
    } else {
        &[]
    };
    for &(group, k, mats) in projections {
        let ws = mats
            .iter()
            .map(|&(name, n)| {
                let bytes: Vec<u8> = (0..n * k).flat_map(|i| half::bf16::from_f32(((i % 13) as f32 - 6.0) * 0.01).to_le_bytes()).collect();
                GpuTensor::upload(&gpu, name, DType::BF16, &[n, k], &bytes, None)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let ys: Vec<_> = mats.iter().map(|&(_, n)| gpu.storage("y", (n * 4) as u64)).collect();
        let x = gpu.storage_from("x", &vec![0.5f32; k]);
        let pairs: Vec<(&GpuTensor, &_)> = ws.iter().zip(&ys).collect();
        let bytes: usize = mats.iter().map(|&(_, n)| n * k * 2).sum();
        warm_gpu(&gpu, 150, 4000)?;
        let t = time_gpu(&gpu, 5, 30, |enc, prof| gemv::gemv_many(&gpu, enc, &pairs, &x, prof))?;
        let row = Row { name: format!("gemv_many {group} ({k} cols, {} matrices)", mats.len()), time_us: t * 1e6, rate: bytes as f64 / t / 1e9, ceiling: copy, unit: "GB/s" };
        row.print();
        rows.push(row);
        for ((name, n), (w, y)) in mats.iter().zip(&pairs) {
            let t = time_gpu(&gpu, 5, 30, |enc, prof| gemv::gemv_into(&gpu, enc, w, &x, y, None, false, prof))?;
            let row = Row { name: format!("gemv alone {name} {k}->{n}"), time_us: t * 1e6, rate: (n * k * 2) as f64 / t / 1e9, ceiling: copy, unit: "GB/s" };
            row.print();
            rows.push(row);
        }
    }

    // MXFP4 experts of the real shape: latent 3584, intermediate 3072.
    let (n_in, n_mid, top_k) = if quick { (512, 256, 4) } else { (3584, 3072, 16) };
    let resident: usize = if quick { 8 } else { 64 };
    // Slots past `resident` hold copies of the first experts' weights in memory of their own,
    // for the cold decode row: as many disjoint sets of top_k experts, read in turn, as the
    // pool's one binding holds (up to 16; 7 sets, ~2 GB, at the real shape on a 2 GiB binding).
    let layout = SlotLayout::new(ExpertFormat::Mxfp4, n_in, n_mid)?;
    let cold_sets = ((gpu.caps.max_binding / layout.slot_bytes) as usize / top_k).clamp(1, 16);
    let slots = (cold_sets * top_k).max(resident);
    let mut store = ExpertStore::new(&gpu, layout, 1, slots, slots)?;
    // Distinct pseudo-random experts (w1, w3, w2 each): scales 2^-9 .. 2^-1, one group in 64 at
    // 2^-27 (a row range the coop kernels' reference exponent must hold exactly).
    let planes: Vec<[(Vec<u8>, Vec<u8>); 3]> = (0..resident)
        .map(|e| {
            std::array::from_fn(|m| {
                let seed = (e * 3 + m) as u64 + 1;
                let packed: Vec<u8> = (0..n_mid * n_in / 2).map(|i| (mix(seed, i as u64) >> 56) as u8).collect();
                let scales: Vec<u8> = (0..n_mid * n_in / 32)
                    .map(|i| {
                        let h = mix(seed + 1000, i as u64) >> 32;
                        if h.is_multiple_of(64) { 100 } else { 118 + (h % 9) as u8 }
                    })
                    .collect();
                (packed, scales)
            })
        })
        .collect();
    for e in 0..slots {
        let [w1, w3, w2] = &planes[e % resident];
        store.fill(&gpu, 0, e, &ExpertWeights::Mxfp4 { w1: (&w1.0, &w1.1), w3: (&w3.0, &w3.1), w2: (&w2.0, &w2.1) })?;
    }
    let act = Activation::Situ { beta: 4.0, linear_beta: Some(25.0) };
    // Weight bytes one token reads: 3 matrices of packed nibbles + scales per selected expert.
    let expert_bytes = 3 * (n_mid * n_in / 2 + n_mid * n_in / 32);
    if !prefill_only {
        let z: Vec<f32> = (0..n_in).map(|i| 0.25 + ((i * 13 % 17) as f32 - 8.0) * 0.01).collect();
        let z = gpu.storage_from("z", &z);
        // Selected experts spread over the pool (every 4th), weights from GPU memory.
        let idx: Vec<u32> = (0..top_k as u32).map(|j| (j * 4) % resident as u32).collect();
        let idx = gpu.storage_from("idx", &idx);
        let wts = gpu.storage_from("wts", &vec![1.0f32 / top_k as f32; top_k]);
        let h = gpu.storage("h", (top_k * n_mid * 4) as u64);
        let y = gpu.storage("y", (n_in * 4) as u64);
        let call = moe::ExpertCall { layer: 0, tokens: 1, top_k, act, accumulate: false };
        // A printed row of the weight bytes the selected experts read, per `t` seconds.
        let expert_row = |what: &str, t: f64| {
            let row = Row {
                name: format!("mxfp4 top-{top_k} experts {n_in}x{n_mid} {what}"),
                time_us: t * 1e6,
                rate: (top_k * expert_bytes) as f64 / t / 1e9,
                ceiling: copy,
                unit: "GB/s",
            };
            row.print();
            row
        };
        // Every variant's output against the first one's (same inputs): a kernel experiment
        // that is fast but wrong shows up here.
        let mut first: Option<(&str, Vec<f32>)> = None;
        warm_gpu(&gpu, 150, 4000)?;
        for kern in moe::DECODE_VARIANTS.iter().filter(|v| moe::decode_supported(&gpu, &store.layout, v)) {
            let name = kern.name;
            let t = time_gpu(&gpu, 5, 30, |enc, prof| moe::experts_decode(&gpu, enc, &store, &call, Some(*kern), &z, &idx, &wts, &h, &y, prof))?;
            let got: Vec<f32> = gpu.read(&y, n_in)?;
            match &first {
                None => first = Some((name, got)),
                Some((first_name, want)) => {
                    let num: f64 = want.iter().zip(&got).map(|(&a, &b)| (a as f64 - b as f64).powi(2)).sum();
                    let den: f64 = want.iter().map(|&a| (a as f64).powi(2)).sum();
                    println!("    check {name} vs {first_name}: rel L2 {:.2e}", (num / den.max(1e-300)).sqrt());
                }
            }
            rows.push(expert_row(&format!("decode {name}"), t));
            for (label, secs) in breakdown(&gpu, 10, |enc, prof| moe::experts_decode(&gpu, enc, &store, &call, Some(*kern), &z, &idx, &wts, &h, &y, prof))? {
                println!("    {label:<40} {:>9.2} us", secs * 1e6);
            }
        }
        // The default decode back to back (4 tokens' worth per submission, no per-pass timestamps).
        let t = time_back_to_back(&gpu, 3, 20, 4, |enc, _| moe::experts_decode(&gpu, enc, &store, &call, None, &z, &idx, &wts, &h, &y, None))?;
        rows.push(expert_row("decode, default, back to back", t));
        // Cold, as a model's decode reads its experts: each call one of `cold_sets` disjoint sets of
        // top_k slots in turn (the rows above repeat one set). Set s holds experts
        // s * top_k + j, copies of expert (s * top_k + j) % resident: sets with the same
        // experts must give the same output.
        let sets: Vec<_> =
            (0..cold_sets).map(|s| gpu.storage_from("idx set", &(0..top_k).map(|j| (s * top_k + j) as u32).collect::<Vec<u32>>())).collect();
        let turn = std::cell::Cell::new(0usize);
        warm_gpu(&gpu, 150, 4000)?;
        let t = time_gpu(&gpu, 5, 32, |enc, prof| {
            let s = turn.get();
            turn.set(s + 1);
            moe::experts_decode(&gpu, enc, &store, &call, None, &z, &sets[s % cold_sets], &wts, &h, &y, prof)
        })?;
        rows.push(expert_row(&format!("decode, default, cold ({cold_sets} sets of experts in turn)"), t));
        let out_of = |s: usize| -> anyhow::Result<Vec<f32>> {
            let mut enc = gpu.device.create_command_encoder(&Default::default());
            moe::experts_decode(&gpu, &mut enc, &store, &call, None, &z, &sets[s], &wts, &h, &y, None)?;
            gpu.submit([enc.finish()]);
            Ok(gpu.read(&y, n_in)?)
        };
        let twin = resident / top_k; // the first set whose experts repeat set 0's
        if twin < cold_sets && resident.is_multiple_of(top_k) {
            println!("    check cold set {twin} (copies of set 0) vs set 0: {}", if out_of(twin)? == out_of(0)? { "equal" } else { "DIFFERENT" });
        }
    }

    // Prefill chunks: T tokens, top_k of the resident experts each, grouped on the GPU; every
    // grouped variant, checked against the f64 reference on sampled tokens and against the
    // tiled SIMT kernel's output in the same process.
    if !experts_only {
        let chunks: &[usize] = if quick { &[64, 200] } else { &[256, 2048] };
        for &t in chunks {
            // Tokens of varied magnitude (2^-3 .. 2^3 by token) so per-row scales matter.
            let z: Vec<f32> = (0..t * n_in)
                .map(|i| ((mix(7, i as u64) >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * 2f32.powi((i / n_in) as i32 % 7 - 3))
                .collect();
            // Distinct per token: stride 3 over a pool with gcd(3, resident) = 1 stays distinct for top_k <= resident.
            let idx: Vec<u32> = (0..t).flat_map(|r| (0..top_k).map(move |j| ((r * 7 + j * 3) % resident) as u32)).collect();
            let wts: Vec<f32> = (0..t * top_k).map(|i| 0.5 + (mix(9, i as u64) >> 40) as f32 / (1u64 << 24) as f32).collect();
            let zb = gpu.storage_from("z", &z);
            let ib = gpu.storage_from("idx", &idx);
            let wb = gpu.storage_from("wts", &wts);
            let y = gpu.storage("y", (t * n_in * 4) as u64);
            let scratch = moe::GroupedScratch::new(&gpu, &store, t, top_k);
            let call = moe::ExpertCall { layer: 0, tokens: t, top_k, act, accumulate: false };
            let sample: Vec<usize> = (0..16.min(t)).map(|i| i * t / 16.min(t)).collect();
            let want = prefill_reference(&planes, act, n_in, n_mid, top_k, &sample, &z, &idx, &wts);
            let flops = (t * top_k * 3 * n_in * n_mid * 2) as f64;
            let mut tiled_out: Option<Vec<f32>> = None;
            for &g in moe::GROUPED_VARIANTS
                .iter()
                .filter(|&&g| moe::grouped_supported(&gpu, &store.layout, g) && !(skip_old && g == moe::GroupedKernels::Old))
            {
                // The old kernels take seconds per 2048-token chunk: fewer repetitions.
                let reps = if g == moe::GroupedKernels::Old && t > 256 { 1 } else { 3 };
                let parts = breakdown(&gpu, reps, |enc, prof| moe::experts_grouped_with(&gpu, enc, &store, &call, Some(g), &zb, &ib, &wb, &scratch, &y, prof))?;
                let secs: f64 = parts.iter().map(|(_, s)| s).sum();
                let got: Vec<f32> = gpu.read(&y, t * n_in)?;
                let sampled: Vec<f32> = sample.iter().flat_map(|&r| got[r * n_in..(r + 1) * n_in].iter().copied()).collect();
                let err = rel_l2(&sampled, &want);
                let vs_tiled = tiled_out.as_ref().map(|w| rel_l2(&got, w));
                if g == moe::GroupedKernels::Tiled {
                    tiled_out = Some(got);
                }
                let row = Row {
                    name: format!("mxfp4 prefill {t} tok top-{top_k}/{resident} {}", g.name()),
                    time_us: secs * 1e6,
                    rate: flops / secs.max(1e-12) / 1e12,
                    ceiling: 150.0,
                    unit: "TFLOP/s",
                };
                row.print();
                rows.push(row);
                match vs_tiled {
                    Some(v) => println!("    rel L2 vs f64 reference ({} tokens): {err:.2e}; vs tiled simt: {v:.2e}", sample.len()),
                    None => println!("    rel L2 vs f64 reference ({} tokens): {err:.2e}", sample.len()),
                }
                for (label, s) in parts {
                    println!("    {label:<40} {:>11.2} us", s * 1e6);
                }
            }
        }
    }
    if let Some(path) = json_out {
        std::fs::write(&path, serde_json::to_string_pretty(&serde_json::json!({"gpu": gpu.describe(), "copy_gbs": copy, "rows": rows}))?)?;
    }
    Ok(())
}

/// A 64-bit mix of (seed, i): the bench's deterministic pseudo-random data.
fn mix(seed: u64, i: u64) -> u64 {
    let mut h = (i ^ seed.wrapping_mul(0xD1B5_4A32_D192_ED03)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    h ^= h >> 29;
    h.wrapping_mul(0xBF58_476D_1CE4_E5B9) ^ (h >> 32)
}

fn rel_l2(got: &[f32], want: &[f32]) -> f64 {
    let num: f64 = got.iter().zip(want).map(|(&a, &b)| (a as f64 - b as f64).powi(2)).sum();
    let den: f64 = want.iter().map(|&b| (b as f64).powi(2)).sum();
    (num / den.max(1e-300)).sqrt()
}

/// y of the `sample` tokens in f64 from the exactly dequantised experts, one thread per
/// group of experts (each expert dequantised once for the sampled tokens routed to it).
#[allow(clippy::too_many_arguments)]
fn prefill_reference(
    planes: &[[(Vec<u8>, Vec<u8>); 3]],
    act: Activation,
    n_in: usize,
    n_mid: usize,
    top_k: usize,
    sample: &[usize],
    z: &[f32],
    idx: &[u32],
    wts: &[f32],
) -> Vec<f32> {
    let threads = std::thread::available_parallelism().map_or(4, |n| n.get()).min(planes.len());
    let dot = |w: &[f32], x: &[f32]| w.iter().zip(x).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>();
    let partials: Vec<Vec<f64>> = std::thread::scope(|sc| {
        let handles: Vec<_> = (0..threads)
            .map(|th| {
                sc.spawn(move || {
                    let mut acc = vec![0f64; sample.len() * n_in];
                    for (e, [p1, p3, p2]) in planes.iter().enumerate().skip(th).step_by(threads) {
                        let users: Vec<(usize, f64)> = sample
                            .iter()
                            .enumerate()
                            .flat_map(|(si, &r)| (0..top_k).filter(move |&j| idx[r * top_k + j] as usize == e).map(move |j| (si, wts[r * top_k + j] as f64)))
                            .collect();
                        if users.is_empty() {
                            continue;
                        }
                        let w1 = reference::numerics::dequant_mxfp4(&p1.0, &p1.1, n_mid, n_in);
                        let w3 = reference::numerics::dequant_mxfp4(&p3.0, &p3.1, n_mid, n_in);
                        let w2 = reference::numerics::dequant_mxfp4(&p2.0, &p2.1, n_in, n_mid);
                        for (si, wt) in users {
                            let zr = &z[sample[si] * n_in..(sample[si] + 1) * n_in];
                            let h: Vec<f64> = (0..n_mid)
                                .map(|m| reference::moe::glu(act, dot(&w1[m * n_in..(m + 1) * n_in], zr), dot(&w3[m * n_in..(m + 1) * n_in], zr)))
                                .collect();
                            for o in 0..n_in {
                                acc[si * n_in + o] += wt * w2[o * n_mid..(o + 1) * n_mid].iter().zip(&h).map(|(&a, &b)| a as f64 * b).sum::<f64>();
                            }
                        }
                    }
                    acc
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("reference thread")).collect()
    });
    (0..sample.len() * n_in).map(|i| partials.iter().map(|p| p[i]).sum::<f64>() as f32).collect()
}
