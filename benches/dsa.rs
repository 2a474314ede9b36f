//! DSA decode kernels at the K3.1 shapes (32 x 128 indexer, top-2048, 96-head absorbed MLA over
//! 576-wide bf16 rows), each timed separately per token per layer at several context lengths
//! with random cache data, next to the copy bandwidth measured in the same run.
//! Run: `cargo bench --bench dsa` (`--quick` for small sizes, `--smoke` for one tiny run of every path,
//! `--json FILE` to save rows, `--indexer` for the indexer rows and checks only (`--prefill-indexer`:
//! a 512-query prompt block at 8K-128K positions), `--topk` for the
//! top-k rows and checks only (4K..1M, ordered and set, 200K with ties, a prefill block), `--mla`
//! for the MLA rows only (absorb, sparse MLA), `--sweep` to add the sparse MLA at other grid
//! sizes and with wgpu's runtime checks,
//! `--portable` to run the top-k without subgroups (topk.wgsl) where the adapter has them,
//! `--torch` to also run the PyTorch reference on the same GPU: naive indexer + torch.topk +
//! gathered absorbed attention; needs python3 with CUDA torch).

use k31_engine::bench::{copy_bandwidth, time_back_to_back, time_gpu, Row};
use k31_engine::gpu::Profiler;
use k31_engine::gpu::{Gpu, GpuTensor, Kernel};
use k31_engine::layout::DType;
use k31_engine::ops::dsa::{self, IndexPrecision::{Bf16, F32}, IndexVariant, MlaDims, PagedRows, TopkScratch};
use k31_engine::reference::dsa as refdsa;
use k31_engine::wgpu;

const IH: usize = 32;
const ID: usize = 128;
const TOPK: usize = 2048;
/// Before each size's timings, after its inputs are uploaded: the GPU runs an fma spin until
/// its clock is steady (at least MIN, at most MAX milliseconds; `bench::warm_gpu`).
const WARM_MIN_MS: u64 = 150;
const WARM_MAX_MS: u64 = 4000;

/// Brings the GPU back to its steady clock after the host left it idle, and says how long
/// that took (seconds at full clock means the clock had dropped).
fn warm(gpu: &Gpu, what: &str) -> anyhow::Result<()> {
    let ms = k31_engine::bench::warm_gpu(gpu, WARM_MIN_MS, WARM_MAX_MS)?;
    println!("  GPU clock steady after {ms:.0} ms of spin ({what})");
    Ok(())
}

/// Cheap deterministic uniform values in [-1, 1).
fn random(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// An indexer the bench times: a variant, the same with the query in bf16
/// (`IndexPrecision::Bf16`), or a bench-only kernel (run by `index_scores_kernel`).
#[derive(Clone, Copy)]
enum Indexer {
    Variant(IndexVariant),
    Bf16(IndexVariant),
    Kernel(Kernel),
}

impl Indexer {
    fn is_simt(&self) -> bool {
        matches!(self, Indexer::Variant(IndexVariant::Simt))
    }
}

/// Records `ix` scoring `t` queries at positions q_pos0.. over `n` positions (row stride n).
#[allow(clippy::too_many_arguments)]
fn record_indexer(
    gpu: &Gpu,
    enc: &mut wgpu::CommandEncoder,
    ix: Indexer,
    keys: &PagedRows,
    q: &wgpu::Buffer,
    w: &wgpu::Buffer,
    dst: &wgpu::Buffer,
    t: usize,
    q_pos0: usize,
    n: usize,
    prof: Option<&mut Profiler>,
) -> Result<(), k31_engine::gpu::GpuError> {
    match ix {
        Indexer::Variant(v) => dsa::index_scores_variant(gpu, enc, v, keys, IH, F32, q, w, dst, t, q_pos0, n, n, prof),
        Indexer::Bf16(v) => dsa::index_scores_variant(gpu, enc, v, keys, IH, Bf16, q, w, dst, t, q_pos0, n, n, prof),
        Indexer::Kernel(k) => dsa::index_scores_kernel(gpu, enc, k, keys, IH, F32, q, w, dst, t, q_pos0, n, n, prof),
    }
}

/// The indexers checked against SIMT f32: the tiled ones everywhere, the coop ones where the
/// adapter has them, with their labels.
fn checked_indexers(gpu: &Gpu) -> Vec<(Indexer, &'static str)> {
    let mut v = Vec::new();
    if dsa::coop_indexer_available(gpu, IH, ID) {
        v.push((Indexer::Variant(IndexVariant::Coop), "coop (exact: q scaled, hi+lo by masking)"));
        v.push((Indexer::Variant(IndexVariant::CoopF16), "coop (q f16, the original kernel)"));
        v.push((Indexer::Bf16(IndexVariant::Coop), "coop, q bf16 (one product per fragment)"));
    }
    v.push((Indexer::Variant(IndexVariant::Tiled), "tiled f32 (4 positions x 4 heads per thread, 128-position tiles)"));
    v.push((Indexer::Kernel(dsa::INDEX_SCORES_TILED_T64), "tiled f32, 64-position tiles"));
    v.push((Indexer::Bf16(IndexVariant::Tiled), "tiled, q bf16"));
    v
}

/// Compares a GPU top-k (sel read back) with the CPU reference on the same scores: "exact" or
/// the first differences (the rule is exact, order included: score desc, position asc).
fn check_topk(gpu: &Gpu, scores: &wgpu::Buffer, n: usize, sel: &wgpu::Buffer, k: usize) -> anyhow::Result<String> {
    let v: Vec<f32> = gpu.read(scores, n)?;
    let got: Vec<i32> = gpu.read(sel, k)?;
    let row: Vec<f64> = v.iter().map(|&x| x as f64).collect();
    let want = refdsa::topk(&row, n, k);
    let bad = (0..k).filter(|&i| want.get(i).map_or(-1, |&w| w as i32) != got[i]).count();
    Ok(if bad == 0 { "exact".into() } else { format!("MISMATCH at {bad} of {k} ranks") })
}

/// Scores `b` against the reference `a` (both [n] f32): max |b - a| / max |a|, and with `sel_b`
/// (b's top-k) whether the top-k of `a` selects the same set.
fn compare_scores(gpu: &Gpu, a: &wgpu::Buffer, b: &wgpu::Buffer, n: usize, sel_b: Option<&[i32]>, k: usize) -> anyhow::Result<String> {
    let va: Vec<f32> = gpu.read(a, n)?;
    let vb: Vec<f32> = gpu.read(b, n)?;
    let scale = va.iter().filter(|x| x.is_finite()).fold(0f32, |m, x| m.max(x.abs())).max(1e-30);
    let err = va.iter().zip(&vb).filter(|(x, _)| x.is_finite()).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale;
    let mut text = format!("max err / max |score| = {err:.2e}");
    if let Some(sb) = sel_b {
        let row: Vec<f64> = va.iter().map(|&x| x as f64).collect();
        let want: std::collections::BTreeSet<i32> = refdsa::topk(&row, n, k).iter().map(|&x| x as i32).collect();
        let got: std::collections::BTreeSet<i32> = sb.iter().copied().filter(|&x| x >= 0).collect();
        let diff = want.symmetric_difference(&got).count() / 2;
        text += &format!(", top-{k} sets differ in {diff} positions");
    }
    Ok(text)
}

/// Like [`check_topk`] for the unordered form: the same set as the reference.
fn check_topk_set(gpu: &Gpu, scores: &wgpu::Buffer, n: usize, sel: &wgpu::Buffer, k: usize) -> anyhow::Result<String> {
    let v: Vec<f32> = gpu.read(scores, n)?;
    let mut got: Vec<i32> = gpu.read(sel, k)?;
    let row: Vec<f64> = v.iter().map(|&x| x as f64).collect();
    let mut want: Vec<i32> = refdsa::topk(&row, n, k).iter().map(|&x| x as i32).collect();
    want.resize(k, -1);
    got.sort();
    want.sort();
    let bad = got.iter().zip(&want).filter(|(a, b)| a != b).count();
    Ok(if bad == 0 { "exact set".into() } else { format!("MISMATCH: sets differ ({bad} sorted slots)") })
}

/// Mean GPU time per labelled pass over 10 runs of `record` (after 3 warm-ups), as "label us, ...".
fn breakdown(
    gpu: &Gpu,
    mut record: impl FnMut(&mut wgpu::CommandEncoder, Option<&mut Profiler>) -> Result<(), k31_engine::gpu::GpuError>,
) -> anyhow::Result<String> {
    let mut prof = Profiler::new(gpu, 256);
    if !prof.enabled() {
        return Ok("no timestamps on this adapter".into());
    }
    for i in 0..13 {
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        record(&mut enc, if i >= 3 { Some(&mut prof) } else { None })?;
        gpu.queue.submit([enc.finish()]);
        gpu.wait()?;
        if i >= 3 {
            prof.collect(gpu)?;
        }
    }
    Ok(prof.report().iter().map(|t| format!("{} {:.2} us", t.label, t.total_ns / 10.0 / 1e3)).collect::<Vec<_>>().join(", "))
}

thread_local! {
    /// Correctness checks run inside the bench (printed and saved with --json).
    static CHECKS: std::cell::RefCell<Vec<(String, String)>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn report_check(name: String, result: String) {
    println!("  check {name}: {result}");
    CHECKS.with(|c| c.borrow_mut().push((name, result)));
}

const TORCH: &str = r#"
import json, sys, torch
torch.manual_seed(0)
dev = 'cuda'
IH, ID, K, H, R, E, V = 32, 128, 2048, 96, 512, 64, 128
def t(f, reps=30):
    for _ in range(5): f()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
        a.record(); f(); b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b) * 1e3)
    ts.sort(); return ts[len(ts) // 2]
out = []
for S in [int(x) for x in sys.argv[1:]]:
    keys = torch.randn(S, ID, device=dev, dtype=torch.bfloat16)
    q = torch.randn(IH, ID, device=dev, dtype=torch.bfloat16)
    w = torch.randn(IH, device=dev, dtype=torch.float32) * (IH * ID) ** -0.5
    idx = lambda: (torch.relu((q @ keys.T).float()) * w[:, None]).sum(0)
    sc = idx()
    k = min(K, S)
    cache = torch.randn(S, R + E, device=dev, dtype=torch.bfloat16)
    qa = torch.randn(H, R + E, device=dev, dtype=torch.float32)
    wuv = torch.randn(H, V, R, device=dev, dtype=torch.bfloat16)
    sel = torch.topk(sc, k).indices
    def attn():
        rows = cache[sel].float()
        p = torch.softmax(qa @ rows.T, -1)
        ob = p @ rows[:, :R]
        return torch.einsum('hvr,hr->hv', wuv.float(), ob)
    out.append({'S': S, 'indexer_us': t(idx), 'topk_us': t(lambda: torch.topk(sc, k)),
                'indexer_topk_us': t(lambda: torch.topk(idx(), k)), 'sparse_attn_us': t(attn)})
sc = torch.randn(200 * 1024, device=dev)
out.append({'S': 204800, 'topk_random_us': t(lambda: torch.topk(sc, 2048))})
print(json.dumps({'device': torch.cuda.get_device_name(), 'torch': torch.__version__, 'rows': out}))
"#;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let json_out = args.iter().position(|a| a == "--json").and_then(|i| args.get(i + 1)).cloned();
    // --smoke: one small size, one repetition, every code path (the cliff rows included): a check
    // that the bench runs through on a software adapter before spending GPU time.
    let smoke = args.iter().any(|a| a == "--smoke");
    let quick = smoke || args.iter().any(|a| a == "--quick");
    let (wu, reps, reps_long) = if smoke { (0, 1, 1) } else { (5, 30, 50) };
    let cliff_from = if smoke { 0 } else { 131072 };
    let torch = args.iter().any(|a| a == "--torch");
    // --indexer: only the indexer rows and checks (saves device time).
    let indexer_only = args.iter().any(|a| a == "--indexer");
    // --topk: only the top-k rows and checks.
    let topk_only = args.iter().any(|a| a == "--topk");
    // --mla: only the MLA rows (absorb, sparse MLA and its tuning sweep; the indexer and top-k
    // run once untimed, for the selection).
    let mla_only = args.iter().any(|a| a == "--mla");
    // --sweep: also time the tiled MLA at other grid sizes and with wgpu's runtime checks.
    let sweep = args.iter().any(|a| a == "--sweep");
    // --portable: the top-k without subgroups (topk.wgsl) even where the adapter has them.
    if args.iter().any(|a| a == "--portable") {
        dsa::set_topk_portable(true);
    }
    let gpu = Gpu::open(None)?;
    println!("GPU: {}  (max binding {} MiB)", gpu.describe(), gpu.caps.max_binding >> 20);
    let copy = copy_bandwidth(&gpu, if quick || topk_only { 64 << 20 } else { 1 << 30 })? / 1e9;
    println!("copy bandwidth (read+write): {copy:.1} GB/s");
    if topk_only {
        let mut rows = Vec::new();
        topk_bench(&gpu, copy, wu, reps, quick, &mut rows)?;
        return save(json_out, &gpu, copy, &rows, serde_json::Value::Null);
    }
    let sizes: Vec<usize> = if smoke {
        vec![4096]
    } else if quick {
        vec![4096, 32768]
    } else { vec![4096, 32768, 131072, 524288, 1048576] };
    let dims = MlaDims { heads: 96, latent: 512, rope: 64, nope: 128, v_dim: 128, scale: 192f32.powf(-0.5) };
    let wkv_v = random(7, dims.heads * (dims.nope + dims.v_dim) * dims.latent);
    let wkv_b: Vec<u8> = wkv_v.iter().flat_map(|&x| half::bf16::from_f32(x * 0.05).to_le_bytes()).collect();
    let wkv = GpuTensor::upload(&gpu, "kv_b_proj", DType::BF16, &[dims.heads * (dims.nope + dims.v_dim), dims.latent], &wkv_b, None)?;
    // --prefill-indexer: only a block of prompt queries' indexer (rows and checks), top-k and
    // sparse MLA.
    if args.iter().any(|a| a == "--prefill-indexer") {
        let mut rows = Vec::new();
        prefill_indexer_bench(&gpu, copy, wu, reps.min(10), quick, &mut rows, &dims, &wkv)?;
        return save(json_out, &gpu, copy, &rows, serde_json::Value::Null);
    }
    let mut rows = Vec::new();
    let push = |rows: &mut Vec<Row>, name: String, t: f64, bytes: f64| {
        let row = Row { name, time_us: t * 1e6, rate: bytes / t / 1e9, ceiling: copy, unit: "GB/s" };
        row.print();
        rows.push(row);
    };
    {
        let absorb_cache = PagedRows::new(&gpu, "absorb cache", dims.width(), 1024, 1024)?;
        let q1 = gpu.storage_from("q", &random(11, dims.heads * (dims.nope + dims.rope)));
        let qa1 = gpu.storage("qa", (dims.heads * dims.width() * 4) as u64);
        for checked in [false, true] {
            let default = dsa::set_mla_tuning(dsa::MlaTuning { checked, ..dsa::MlaTuning::default() });
            let t = time_gpu(&gpu, wu, reps, |enc, prof| dsa::mla_absorb(&gpu, enc, &dims, &absorb_cache, &q1, &wkv, &qa1, 1, prof))?;
            dsa::set_mla_tuning(default);
            let checks = if checked { ", wgpu runtime checks" } else { "" };
            push(&mut rows, format!("MLA absorb (W_UK into q), one token{checks}"), t, (dims.heads * dims.nope * dims.latent * 2) as f64);
        }
    }
    for &s in &sizes {
        let run = || -> anyhow::Result<Vec<(String, f64, f64)>> {
            let mut out = Vec::new();
            let mut keys = PagedRows::new(&gpu, "keys", ID, 1024, s)?;
            keys.upload(&gpu, &random(s as u64, s * ID))?;
            warm(&gpu, &format!("indexer, S={s}"))?;
            let q = gpu.storage_from("q", &random(1, IH * ID));
            let w = gpu.storage_from("w", &random(2, IH));
            let scores = gpu.storage("scores", (s * 4) as u64);
            let k = TOPK.min(s);
            let key_bytes = (s * ID * 2) as f64;
            // Every indexer variant; the SIMT one last, so `scores` holds its output.
            let mut variants = if mla_only { vec![] } else { checked_indexers(&gpu) };
            if !dsa::coop_indexer_available(&gpu, IH, ID) && !mla_only {
                println!("  (no cooperative-matrix indexer on this adapter: coop rows skipped)");
            }
            variants.push((Indexer::Variant(IndexVariant::Simt), "SIMT f32"));
            let outs: Vec<(Indexer, &str, wgpu::Buffer)> =
                variants.iter().map(|&(v, label)| (v, label, gpu.storage("scores of a variant", (s * 4) as u64))).collect();
            for (v, label, dst) in &outs {
                let dst = if v.is_simt() { &scores } else { dst };
                if mla_only {
                    let mut enc = gpu.device.create_command_encoder(&Default::default());
                    record_indexer(&gpu, &mut enc, *v, &keys, &q, &w, dst, 1, s - 1, s, None)?;
                    gpu.queue.submit([enc.finish()]);
                    continue;
                }
                let t = time_gpu(&gpu, wu, reps, |enc, prof| record_indexer(&gpu, enc, *v, &keys, &q, &w, dst, 1, s - 1, s, prof))?;
                out.push((format!("indexer {label}, S={s}"), t, key_bytes));
            }
            // The floor of the access pattern: the key reads alone, same bindings and paging.
            if s >= cliff_from && !mla_only {
                let tmp = gpu.storage("scores probe", (s * 4) as u64);
                let t = time_gpu(&gpu, wu, reps, |enc, prof| {
                    dsa::index_scores_kernel(&gpu, enc, dsa::INDEX_KEYS_PROBE, &keys, IH, F32, &q, &w, &tmp, 1, s - 1, s, s, prof)
                })?;
                out.push((format!("indexer key reads only (diagnostic probe), S={s}"), t, key_bytes));
            }
            if s <= 32768 && !mla_only {
                indexer_checks(&gpu, s)?;
            }
            // Grid of the coop indexer (workgroups per query; the default is 264 = two per H200 SM).
            if dsa::coop_indexer_available(&gpu, IH, ID) && s >= cliff_from && !mla_only {
                let tmp = gpu.storage("scores grid", (s * 4) as u64);
                for groups in [132, 528, 1056] {
                    let prev = dsa::set_index_coop_groups(groups);
                    let t = time_gpu(&gpu, wu, reps, |enc, prof| {
                        dsa::index_scores_variant(&gpu, enc, IndexVariant::Coop, &keys, IH, F32, &q, &w, &tmp, 1, s - 1, s, s, prof)
                    })?;
                    dsa::set_index_coop_groups(prev);
                    out.push((format!("indexer coop (q hi+lo f16), {groups} workgroups, S={s}"), t, key_bytes));
                }
            }
            // The cliff lead: the same SIMT scan over one unpaged allocation.
            if s >= cliff_from && !mla_only && (!indexer_only || s == 131072 || s == 1048576) {
                let mut one = PagedRows::new(&gpu, "keys one page", ID, s.next_power_of_two(), s)?;
                one.upload(&gpu, &random(s as u64, s * ID))?;
                let tmp = gpu.storage("scores one page", (s * 4) as u64);
                let t = time_gpu(&gpu, wu, reps, |enc, prof| {
                    dsa::index_scores_variant(&gpu, enc, IndexVariant::Simt, &one, IH, F32, &q, &w, &tmp, 1, s - 1, s, s, prof)
                })?;
                out.push((format!("indexer SIMT f32, one page, S={s}"), t, key_bytes));
                report_check(format!("indexer one page == paged, S={s}"), compare_scores(&gpu, &scores, &tmp, s, None, 0)?);
            }
            // The SIMT scores with q in bf16: what the bf16 rows are checked against.
            let scores_bf16 = gpu.storage("scores, q bf16", (s * 4) as u64);
            let mut enc = gpu.device.create_command_encoder(&Default::default());
            record_indexer(&gpu, &mut enc, Indexer::Bf16(IndexVariant::Simt), &keys, &q, &w, &scores_bf16, 1, s - 1, s, None)?;
            gpu.queue.submit([enc.finish()]);
            drop(keys);
            let scratch = TopkScratch::new(&gpu, 1, s, k)?;
            let sel = gpu.storage("sel", (k * 4) as u64);
            let sel_s = gpu.storage("sel scores", (k * 4) as u64);
            for (v, label, dst) in outs.iter().filter(|o| !o.0.is_simt()) {
                let mut enc = gpu.device.create_command_encoder(&Default::default());
                dsa::topk(&gpu, &mut enc, &scratch, dst, s, 1, s - 1, s, &sel, &sel_s, None)?;
                gpu.queue.submit([enc.finish()]);
                let a = gpu.read::<i32>(&sel, k)?;
                let (want, twin) = if matches!(v, Indexer::Bf16(_)) { (&scores_bf16, "SIMT q bf16") } else { (&scores, "SIMT") };
                report_check(format!("indexer {label} vs {twin}, S={s}"), compare_scores(&gpu, want, dst, s, Some(&a), k)?);
            }
            report_check(format!("indexer SIMT q bf16 vs f32, S={s}"), {
                let mut enc = gpu.device.create_command_encoder(&Default::default());
                dsa::topk(&gpu, &mut enc, &scratch, &scores_bf16, s, 1, s - 1, s, &sel, &sel_s, None)?;
                gpu.queue.submit([enc.finish()]);
                compare_scores(&gpu, &scores, &scores_bf16, s, Some(&gpu.read::<i32>(&sel, k)?), k)?
            });
            if indexer_only {
                return Ok(out);
            }
            if mla_only {
                let mut enc = gpu.device.create_command_encoder(&Default::default());
                dsa::topk(&gpu, &mut enc, &scratch, &scores, s, 1, s - 1, s, &sel, &sel_s, None)?;
                gpu.queue.submit([enc.finish()]);
            }
            let t = if mla_only { 0.0 } else { time_gpu(&gpu, wu, reps, |enc, prof| dsa::topk(&gpu, enc, &scratch, &scores, s, 1, s - 1, s, &sel, &sel_s, prof))? };
            if !mla_only {
                out.push((format!("top-{k} of indexer scores, S={s}"), t, (s * 4) as f64));
                report_check(format!("top-{k} S={s} vs CPU reference"), check_topk(&gpu, &scores, s, &sel, k)?);
            }
            if !mla_only {
                let sel_set = gpu.storage("sel set", (k * 4) as u64);
                let t = time_gpu(&gpu, wu, reps, |enc, prof| dsa::topk_set(&gpu, enc, &scratch, &scores, s, 1, s - 1, s, &sel_set, &sel_s, prof))?;
                out.push((format!("top-{k} set (unordered) of indexer scores, S={s}"), t, (s * 4) as f64));
                report_check(format!("top-{k} set S={s} vs CPU reference"), check_topk_set(&gpu, &scores, s, &sel_set, k)?);
            }
            let mut cache = PagedRows::new(&gpu, "latent", dims.width(), 1024, s)?;
            cache.upload(&gpu, &random(s as u64 + 1, s * dims.width()))?;
            // The upload's host work leaves the GPU idle for seconds at large S.
            warm(&gpu, &format!("sparse MLA, S={s}"))?;
            let qa = gpu.storage_from("qa", &random(3, dims.heads * dims.width()));
            let gate = gpu.storage_from("gate", &random(4, dims.heads * dims.v_dim));
            let part = gpu.storage("part", dsa::partial_bytes(&dims, 1, dsa::MLA_MAX_SPLITS) as u64);
            let o = gpu.storage("o", (dims.heads * dims.v_dim * 4) as u64);
            let lse = gpu.storage("lse", (dims.heads * 4) as u64);
            let o_ref = gpu.storage("o per-head", (dims.heads * dims.v_dim * 4) as u64);
            let lse_ref = gpu.storage("lse per-head", (dims.heads * 4) as u64);
            let mut mla_variants = vec![(dsa::MlaVariant::PerHead, "per head"), (dsa::MlaVariant::Tiled, "tiled, 16 heads per workgroup")];
            if dsa::coop_attention_available(&gpu, &dims) {
                mla_variants.push((dsa::MlaVariant::Coop, "coop, 16 heads per workgroup"));
            }
            for &(v, label) in &mla_variants {
                let (ob, lb) = if v == dsa::MlaVariant::PerHead { (&o_ref, &lse_ref) } else { (&o, &lse) };
                let t = time_gpu(&gpu, wu, reps, |enc, prof| {
                    dsa::mla_attention_variant(&gpu, enc, v, &dims, &cache, &qa, Some((&sel, k)), &wkv, Some(&gate), &part, ob, lb, 1, s - 1, prof, None)
                })?;
                out.push((format!("sparse MLA {label}, {k} rows of 576, S={s}"), t, (k * dims.width() * 2) as f64));
                if v != dsa::MlaVariant::PerHead {
                    let (a, b) = (gpu.read::<f32>(&o_ref, dims.heads * dims.v_dim)?, gpu.read::<f32>(ob, dims.heads * dims.v_dim)?);
                    let num: f64 = a.iter().zip(&b).map(|(&x, &y)| (x as f64 - y as f64).powi(2)).sum();
                    let den: f64 = a.iter().map(|&x| (x as f64).powi(2)).sum();
                    report_check(format!("sparse MLA {label} vs per head, S={s}"), format!("o rel L2 {:.2e}", (num / den.max(1e-300)).sqrt()));
                }
            }
            for &(v, _) in &mla_variants {
                let b = breakdown(&gpu, |enc, prof| {
                    dsa::mla_attention_variant(&gpu, enc, v, &dims, &cache, &qa, Some((&sel, k)), &wkv, Some(&gate), &part, &o, &lse, 1, s - 1, prof, None)
                })?;
                println!("  sparse MLA {v:?} per pass, S={s}: {b}");
            }
            // Grid sizing of the tiled path: attention workgroups per query, W_UV rows per merge workgroup.
            if s == sizes[0] && sweep {
                let default = dsa::set_mla_tuning(dsa::MlaTuning::default());
                for (target_groups, out_rows, checked) in
                    [(64, 32, false), (128, 32, false), (128, 64, false), (192, 32, false), (256, 32, false), (256, 64, false), (512, 32, false), (256, 32, true)]
                {
                    {
                        dsa::set_mla_tuning(dsa::MlaTuning { target_groups, out_rows, checked });
                        let t = time_gpu(&gpu, wu, reps, |enc, prof| {
                            dsa::mla_attention(&gpu, enc, &dims, &cache, &qa, Some((&sel, k)), &wkv, Some(&gate), &part, &o, &lse, 1, s - 1, prof)
                        })?;
                        let splits = dsa::attend_splits(&dims, k, 1);
                        let checks = if checked { ", wgpu runtime checks" } else { "" };
                        out.push((format!("sparse MLA tiled, {splits} splits (target {target_groups}), {out_rows} W_UV rows per workgroup{checks}, S={s}"), t, (k * dims.width() * 2) as f64));
                        let b = breakdown(&gpu, |enc, prof| {
                            dsa::mla_attention(&gpu, enc, &dims, &cache, &qa, Some((&sel, k)), &wkv, Some(&gate), &part, &o, &lse, 1, s - 1, prof)
                        })?;
                        println!("  tuning ({target_groups}, {out_rows}, checked {checked}) per pass: {b}");
                    }
                }
                dsa::set_mla_tuning(default);
            }
            let err = |a: &wgpu::Buffer, b: &wgpu::Buffer, n: usize| -> anyhow::Result<f64> {
                let x: Vec<f32> = gpu.read(a, n)?;
                let y: Vec<f32> = gpu.read(b, n)?;
                let num: f64 = x.iter().zip(&y).map(|(&p, &q)| (p as f64 - q as f64).powi(2)).sum();
                let den: f64 = x.iter().map(|&p| (p as f64).powi(2)).sum();
                Ok((num / den.max(1e-300)).sqrt())
            };
            report_check(
                format!("sparse MLA tiled vs per head, S={s}"),
                format!(
                    "o rel L2 {:.2e}, lse rel L2 {:.2e}",
                    err(&o_ref, &o, dims.heads * dims.v_dim)?,
                    err(&lse_ref, &lse, dims.heads)?
                ),
            );
            // The cliff lead: the same attention over the LAST k rows (one page, ~2.3 MB) instead of
            // k rows spread over the whole cache. A large gap points at address translation.
            if s >= cliff_from {
                let near: Vec<i32> = (0..k as i32).map(|j| (s - k) as i32 + j).collect();
                let sel_near = gpu.storage_from("sel near", &near);
                let t = time_gpu(&gpu, wu, reps, |enc, prof| {
                    dsa::mla_attention(&gpu, enc, &dims, &cache, &qa, Some((&sel_near, k)), &wkv, Some(&gate), &part, &o, &lse, 1, s - 1, prof)
                })?;
                out.push((format!("sparse MLA tiled, last {k} rows, S={s}"), t, (k * dims.width() * 2) as f64));
            }
            Ok(out)
        };
        match run() {
            Ok(v) => v.into_iter().for_each(|(n, t, b)| push(&mut rows, n, t, b)),
            Err(e) => println!("S={s}: skipped: {e}"),
        }
    }
    if indexer_only || mla_only {
        return save(json_out, &gpu, copy, &rows, serde_json::Value::Null);
    }
    // The acceptance figure: top-2048 of a 200K row of random scores.
    let n = 200 * 1024;
    let scores = gpu.storage_from("scores", &random(9, n));
    let scratch = TopkScratch::new(&gpu, 1, n, TOPK)?;
    let sel = gpu.storage("sel", (TOPK * 4) as u64);
    let sel_s = gpu.storage("sel scores", (TOPK * 4) as u64);
    let t = time_gpu(&gpu, wu, reps_long, |enc, prof| dsa::topk(&gpu, enc, &scratch, &scores, n, 1, n, n, &sel, &sel_s, prof))?;
    push(&mut rows, format!("top-2048 of {n} random scores"), t, (n * 4) as f64);
    report_check(format!("top-2048 of {n} random vs CPU reference"), check_topk(&gpu, &scores, n, &sel, TOPK)?);
    let t = time_gpu(&gpu, wu, reps_long, |enc, prof| dsa::topk_set(&gpu, enc, &scratch, &scores, n, 1, n, n, &sel, &sel_s, prof))?;
    push(&mut rows, format!("top-2048 set (unordered) of {n} random scores"), t, (n * 4) as f64);
    report_check(format!("top-2048 set of {n} random vs CPU reference"), check_topk_set(&gpu, &scores, n, &sel, TOPK)?);
    // Worst case for the tie rule: scores on 129 levels, the 2048th tied with ~2300 others
    // spread over the whole row.
    let tied: Vec<f32> = random(10, n).iter().map(|x| (x * 64.0).round()).collect();
    let scores = gpu.storage_from("tied scores", &tied);
    let t = time_gpu(&gpu, wu, reps_long, |enc, prof| dsa::topk(&gpu, enc, &scratch, &scores, n, 1, n, n, &sel, &sel_s, prof))?;
    push(&mut rows, format!("top-2048 of {n} scores, ties at the k-th"), t, (n * 4) as f64);
    report_check(format!("top-2048 of {n} tied vs CPU reference"), check_topk(&gpu, &scores, n, &sel, TOPK)?);
    // 1M random scores (the largest context).
    let n = if quick { 1 << 16 } else { 1 << 20 };
    let scores = gpu.storage_from("scores 1M", &random(11, n));
    let scratch = TopkScratch::new(&gpu, 1, n, TOPK)?;
    let t = time_gpu(&gpu, wu, reps_long, |enc, prof| dsa::topk(&gpu, enc, &scratch, &scores, n, 1, n, n, &sel, &sel_s, prof))?;
    push(&mut rows, format!("top-2048 of {n} random scores"), t, (n * 4) as f64);
    report_check(format!("top-2048 of {n} random vs CPU reference"), check_topk(&gpu, &scores, n, &sel, TOPK)?);
    let mut torch_json = serde_json::Value::Null;
    if torch {
        let path = std::env::temp_dir().join("k31_dsa_torch.py");
        std::fs::write(&path, TORCH)?;
        let out = std::process::Command::new("python3").arg(&path).args(sizes.iter().map(|s| s.to_string())).output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        println!("PyTorch reference (same GPU): {text}");
        if !out.status.success() {
            println!("PyTorch reference failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        torch_json = serde_json::from_str(text.trim()).unwrap_or(serde_json::Value::Null);
    }
    save(json_out, &gpu, copy, &rows, torch_json)
}

/// `--prefill-indexer`: the indexer for a prompt block of 512 queries (the last 512 positions
/// of S, causal), each kernel timed in a pass of its own; rate = key bytes x queries (what the
/// block's per-query scans read). The coop block kernel (8 queries per workgroup) is checked
/// against the one-query coop kernel (same scheme: same scores) and SIMT in the same run. Then
/// the rest of the block's sparse attention at that context: the top-2048 sets of its 512 rows
/// and the sparse MLA over them (rate = selected rows' bytes).
#[allow(clippy::too_many_arguments)]
fn prefill_indexer_bench(gpu: &Gpu, copy: f64, wu: usize, reps: usize, quick: bool, rows: &mut Vec<Row>, dims: &MlaDims, wkv: &GpuTensor) -> anyhow::Result<()> {
    let t = 512;
    let sizes: Vec<usize> = if quick { vec![8192] } else { vec![1024, 2048, 4096, 8192, 32768, 131072] };
    let coop = dsa::coop_indexer_available(gpu, IH, ID);
    let mut variants = vec![(Indexer::Variant(IndexVariant::Simt), "SIMT f32"), (Indexer::Variant(IndexVariant::Tiled), "tiled f32")];
    if coop {
        variants.push((Indexer::Variant(IndexVariant::CoopPerQuery), "coop exact, one query per workgroup"));
        variants.push((Indexer::Variant(IndexVariant::Coop), "coop exact, 8 queries per workgroup"));
        variants.push((Indexer::Bf16(IndexVariant::CoopPerQuery), "coop q bf16, one query per workgroup"));
        variants.push((Indexer::Bf16(IndexVariant::Coop), "coop q bf16, 8 queries per workgroup"));
    } else {
        println!("  (no cooperative-matrix indexer on this adapter: coop rows skipped)");
    }
    for &s in &sizes {
        let mut keys = PagedRows::new(gpu, "keys", ID, 1024, s)?;
        keys.upload(gpu, &random(s as u64, s * ID))?;
        let q = gpu.storage_from("q", &random(41, t * IH * ID));
        let w = gpu.storage_from("w", &random(42, t * IH));
        let q_pos0 = s - t;
        warm(gpu, &format!("prefill indexer, S={s}"))?;
        let mut outs: Vec<Vec<f32>> = Vec::new();
        for &(v, label) in &variants {
            let dst = gpu.storage("prefill scores", (t * s * 4) as u64);
            let time = time_gpu(gpu, wu, reps, |enc, prof| record_indexer(gpu, enc, v, &keys, &q, &w, &dst, t, q_pos0, s, prof))?;
            let row = Row { name: format!("prefill indexer {label}, {t} queries, S={s}"), time_us: time * 1e6, rate: (t * s * ID * 2) as f64 / time / 1e9, ceiling: copy, unit: "GB/s" };
            row.print();
            rows.push(row);
            outs.push(gpu.read(&dst, t * s)?);
        }
        // The last 64 queries of the block (a whole check of 512 rows costs minutes of host time).
        let tail = |v: &[f32]| v[(t - 64) * s..].to_vec();
        if coop {
            report_check(format!("prefill indexer coop 8 queries per workgroup vs SIMT, S={s}"), diff_text(&tail(&outs[0]), &tail(&outs[3]), 64, s - 64));
            report_check(format!("prefill indexer coop 8 vs 1 query per workgroup (exact), S={s}"), diff_text(&tail(&outs[2]), &tail(&outs[3]), 64, s - 64));
            report_check(format!("prefill indexer coop 8 vs 1 query per workgroup (q bf16), S={s}"), diff_text(&tail(&outs[4]), &tail(&outs[5]), 64, s - 64));
        }
        drop(outs);
        let k = TOPK;
        let scores = gpu.storage("prefill scores", (t * s * 4) as u64);
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        record_indexer(gpu, &mut enc, Indexer::Variant(IndexVariant::Auto), &keys, &q, &w, &scores, t, q_pos0, s, None)?;
        gpu.queue.submit([enc.finish()]);
        let scratch = TopkScratch::new(gpu, t, s, k)?;
        let (sel, sel_s) = (gpu.storage("sel", (t * k * 4) as u64), gpu.storage("sel scores", (t * k * 4) as u64));
        // The checks above kept the host busy and the GPU idle (its clock drops).
        warm(gpu, &format!("prefill top-k, S={s}"))?;
        let time = time_gpu(gpu, wu, reps, |enc, prof| dsa::topk_set(gpu, enc, &scratch, &scores, s, t, q_pos0, s, &sel, &sel_s, prof))?;
        let row = Row { name: format!("prefill top-{k} sets, {t} rows, S={s}"), time_us: time * 1e6, rate: (t * s * 4) as f64 / time / 1e9, ceiling: copy, unit: "GB/s" };
        row.print();
        rows.push(row);
        // The block's last row (valid over all of S) and its selection, then that row alone as a
        // decode step selects it (the acceptance row's scores are uniform random; an indexer's
        // fill its first-digit bins differently).
        let one = gpu.storage("one row", (s * 4) as u64);
        let one_sel = gpu.storage("one row's selection", (k * 4) as u64);
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        gpu.copy_buffer(&mut enc, &scores, ((t - 1) * s * 4) as u64, &one, 0, (s * 4) as u64);
        gpu.copy_buffer(&mut enc, &sel, ((t - 1) * k * 4) as u64, &one_sel, 0, (k * 4) as u64);
        gpu.queue.submit([enc.finish()]);
        let scratch1 = TopkScratch::new(gpu, 1, s, k)?;
        let time = time_gpu(gpu, wu, reps, |enc, prof| dsa::topk_set(gpu, enc, &scratch1, &one, s, 1, s - 1, s, &sel, &sel_s, prof))?;
        let row = Row { name: format!("top-{k} set of one row of indexer scores, S={s}"), time_us: time * 1e6, rate: (s * 4) as f64 / time / 1e9, ceiling: copy, unit: "GB/s" };
        row.print();
        rows.push(row);
        report_check(format!("prefill top-{k} sets, last row, S={s}"), check_topk_set(gpu, &one, s, &one_sel, k)?);
        report_check(format!("top-{k} set of one row of indexer scores, S={s}"), check_topk_set(gpu, &one, s, &sel, k)?);
        // How the row fills the select's first digit (the top 12 bits of the order-preserving
        // key): the k-th score's bin is what the gather lists and its last workgroup refines.
        let v: Vec<f32> = if s > k { gpu.read(&one, s)? } else { Vec::new() };
        let okey = |x: f32| { let b = x.to_bits(); if b >> 31 == 0 { b | 0x8000_0000 } else { !b } };
        let mut keys: Vec<u32> = v.iter().map(|&x| okey(x)).collect();
        keys.sort_unstable_by(|a, b| b.cmp(a));
        let kth = keys.get(k - 1).copied().unwrap_or(0);
        let in_bin = keys.iter().filter(|&&x| x >> 20 == kth >> 20).count();
        let tied = keys.iter().filter(|&&x| x == kth).count();
        println!("  row of indexer scores, S={s}: the k-th score's first-digit bin holds {in_bin} positions, {tied} tied with it");
        drop((scores, scratch));
        let mut cache = PagedRows::new(gpu, "latent", dims.width(), 1024, s)?;
        cache.upload(gpu, &random(s as u64 + 1, s * dims.width()))?;
        warm(gpu, &format!("prefill sparse MLA, S={s}"))?;
        let qa = gpu.storage_from("qa", &random(3, t * dims.heads * dims.width()));
        let gate = gpu.storage_from("gate", &random(4, t * dims.heads * dims.v_dim));
        let part = gpu.storage("part", dsa::partial_bytes_max(dims, k, t) as u64);
        let o = gpu.storage("o", (t * dims.heads * dims.v_dim * 4) as u64);
        let lse = gpu.storage("lse", (t * dims.heads * 4) as u64);
        let time = time_gpu(gpu, wu, reps, |enc, prof| {
            dsa::mla_attention(gpu, enc, dims, &cache, &qa, Some((&sel, k)), wkv, Some(&gate), &part, &o, &lse, t, q_pos0, prof)
        })?;
        let row = Row { name: format!("prefill sparse MLA, {t} queries x {k} rows of 576, S={s}"), time_us: time * 1e6, rate: (t * k * dims.width() * 2) as f64 / time / 1e9, ceiling: copy, unit: "GB/s" };
        row.print();
        rows.push(row);
    }
    Ok(())
}

/// `--topk`: only the top-k rows, every one checked against the CPU reference in the same run:
/// top-2048 of random rows from 4K to 1M (ordered and as a set), the acceptance row (200K),
/// ties at the k-th, a causal prefill block, the per-dispatch breakdown and the launch floor.
fn topk_bench(gpu: &Gpu, copy: f64, wu: usize, reps: usize, quick: bool, rows: &mut Vec<Row>) -> anyhow::Result<()> {
    let push = |rows: &mut Vec<Row>, name: String, t: f64, bytes: f64| {
        let row = Row { name, time_us: t * 1e6, rate: bytes / t / 1e9, ceiling: copy, unit: "GB/s" };
        row.print();
        rows.push(row);
    };
    // The floor: empty dispatches of one workgroup, one pass.
    for n in [1usize, 2, 3] {
        let t = time_gpu(gpu, wu, reps, |enc, prof| dsa::topk_probe(gpu, enc, n, prof))?;
        push(rows, format!("top-k probe: {n} empty dispatches in one pass"), t, 0.0);
        let t = time_back_to_back(gpu, wu, reps, 20, |enc, _| dsa::topk_probe(gpu, enc, n, None))?;
        push(rows, format!("top-k probe: {n} empty dispatches in one pass, 20 back to back"), t, 0.0);
    }
    let sizes: Vec<usize> = if quick { vec![4096, 32768, 204800] } else { vec![4096, 32768, 131072, 204800, 524288, 1048576] };
    let k = TOPK;
    let sel = gpu.storage("sel", (k * 4) as u64);
    let sel_s = gpu.storage("sel scores", (k * 4) as u64);
    for &n in &sizes {
        for (kind, label) in [(0, "random"), (1, "ties at the k-th")] {
            if kind == 1 && n != 204800 {
                continue;
            }
            let mut v = random(9, n);
            if kind == 1 {
                // Scores on 129 levels: the 2048th tied with ~1600 others spread over the row.
                v.iter_mut().for_each(|x| *x = (*x * 64.0).round());
            }
            let scores = gpu.storage_from("scores", &v);
            let scratch = TopkScratch::new(gpu, 1, n, k)?;
            warm(gpu, &format!("top-{k} of {n}"))?;
            let t = time_gpu(gpu, wu, reps, |enc, prof| dsa::topk_set(gpu, enc, &scratch, &scores, n, 1, n, n, &sel, &sel_s, prof))?;
            push(rows, format!("top-{k} set of {n} {label} scores"), t, (n * 4) as f64);
            report_check(format!("top-{k} set of {n} {label} vs CPU reference"), check_topk_set(gpu, &scores, n, &sel, k)?);
            let t = time_gpu(gpu, wu, reps, |enc, prof| dsa::topk(gpu, enc, &scratch, &scores, n, 1, n, n, &sel, &sel_s, prof))?;
            push(rows, format!("top-{k} ordered of {n} {label} scores"), t, (n * 4) as f64);
            report_check(format!("top-{k} ordered of {n} {label} vs CPU reference"), check_topk(gpu, &scores, n, &sel, k)?);
            // Steady state: 20 calls back to back in one submission (GPU clocks up, no per-pass
            // timestamps), the cost inside a model's command stream.
            let t = time_back_to_back(gpu, wu, reps, 20, |enc, _| dsa::topk_set(gpu, enc, &scratch, &scores, n, 1, n, n, &sel, &sel_s, None))?;
            push(rows, format!("top-{k} set of {n} {label} scores, 20 back to back"), t, (n * 4) as f64);
            let t = time_back_to_back(gpu, wu, reps, 20, |enc, _| dsa::topk(gpu, enc, &scratch, &scores, n, 1, n, n, &sel, &sel_s, None))?;
            push(rows, format!("top-{k} ordered of {n} {label} scores, 20 back to back"), t, (n * 4) as f64);
            report_check(format!("top-{k} ordered of {n} {label} after back to back"), check_topk(gpu, &scores, n, &sel, k)?);
            if n == 204800 {
                dsa::set_topk_split_passes(true);
                for ordered in [false, true] {
                    let b = breakdown(gpu, |enc, prof| {
                        if ordered {
                            dsa::topk(gpu, enc, &scratch, &scores, n, 1, n, n, &sel, &sel_s, prof)
                        } else {
                            dsa::topk_set(gpu, enc, &scratch, &scores, n, 1, n, n, &sel, &sel_s, prof)
                        }
                    })?;
                    println!("  top-{k} {} of {n} {label}, one pass per dispatch: {b}", if ordered { "ordered" } else { "set" });
                }
                dsa::set_topk_split_passes(false);
            }
        }
    }
    // A causal prefill block: 16 rows of 32K, row r valid up to 32K - 16 + r.
    let (nr, len) = (16usize, 32768usize);
    let v = random(123, nr * len);
    let scores = gpu.storage_from("prefill scores", &v);
    let scratch = TopkScratch::new(gpu, nr, len, k)?;
    let psel = gpu.storage("prefill sel", (nr * k * 4) as u64);
    let psc = gpu.storage("prefill sel scores", (nr * k * 4) as u64);
    let t = time_gpu(gpu, wu, reps, |enc, prof| dsa::topk(gpu, enc, &scratch, &scores, len, nr, len - nr, len, &psel, &psc, prof))?;
    push(rows, format!("top-{k} ordered, prefill block of {nr} rows of {len}"), t, (nr * len * 4) as f64);
    let got: Vec<i32> = gpu.read(&psel, nr * k)?;
    let mut bad = 0;
    for r in 0..nr {
        let row: Vec<f64> = v[r * len..(r + 1) * len].iter().map(|&x| x as f64).collect();
        let want = refdsa::topk(&row, len - nr + r + 1, k);
        bad += (0..k).filter(|&i| want.get(i).map_or(-1, |&w| w as i32) != got[r * k + i]).count();
    }
    report_check(
        format!("top-{k} prefill block of {nr} rows vs CPU reference"),
        if bad == 0 { "exact".into() } else { format!("MISMATCH at {bad} ranks") },
    );
    Ok(())
}

fn save(json_out: Option<String>, gpu: &Gpu, copy: f64, rows: &[Row], torch_json: serde_json::Value) -> anyhow::Result<()> {
    if let Some(path) = json_out {
        let checks: Vec<serde_json::Value> =
            CHECKS.with(|c| c.borrow().iter().map(|(n, r)| serde_json::json!({"check": n, "result": r})).collect());
        let doc = serde_json::json!({"gpu": gpu.describe(), "copy_gbs": copy, "rows": rows, "checks": checks, "torch": torch_json});
        std::fs::write(&path, serde_json::to_string_pretty(&doc)?)?;
    }
    Ok(())
}

/// Scores of `ix` for `t` queries at positions q_pos0.. over `keys` (n_pos = row stride).
#[allow(clippy::too_many_arguments)]
fn scores_of(gpu: &Gpu, ix: Indexer, keys: &PagedRows, q: &[f32], w: &[f32], t: usize, q_pos0: usize, n: usize) -> anyhow::Result<Vec<f32>> {
    let qb = gpu.storage_from("q", q);
    let wb = gpu.storage_from("w", w);
    let out = gpu.storage("scores", (t * n * 4) as u64);
    let mut enc = gpu.device.create_command_encoder(&Default::default());
    record_indexer(gpu, &mut enc, ix, keys, &qb, &wb, &out, t, q_pos0, n, None)?;
    gpu.queue.submit([enc.finish()]);
    Ok(gpu.read(&out, t * n)?)
}

/// max |b - a| / max |a| over finite a, whether the -inf masks agree, and how many positions
/// the top-64 of each of the `t` rows (valid up to q_pos0 + row) differ in.
fn diff_text(a: &[f32], b: &[f32], t: usize, q_pos0: usize) -> String {
    let scale = a.iter().filter(|x| x.is_finite()).fold(0f32, |m, x| m.max(x.abs())).max(1e-30);
    let err = a.iter().zip(b).filter(|(x, _)| x.is_finite()).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale;
    let masks = a.iter().zip(b).filter(|(x, y)| x.is_finite() != y.is_finite()).count();
    let n = a.len() / t;
    let mut moved = 0;
    for r in 0..t {
        let set = |v: &[f32]| -> std::collections::BTreeSet<usize> {
            let row: Vec<f64> = v[r * n..(r + 1) * n].iter().map(|&x| x as f64).collect();
            refdsa::topk(&row, (q_pos0 + r + 1).min(n), 64).into_iter().collect()
        };
        moved += set(a).symmetric_difference(&set(b)).count() / 2;
    }
    format!("max err / max |score| = {err:.2e}, {masks} mask mismatches, top-64 of {t} rows differ in {moved} positions")
}

/// The coop (where the adapter has it) and tiled indexers against SIMT f32 in the forms the scan
/// rows do not cover: prefill (several queries, causal mask mid-row), pages not a multiple of
/// the coop kernel's 32-position step, keys out of the exact f16 range (recomputed in f32 by
/// coop), and q heads of very different magnitudes.
fn indexer_checks(gpu: &Gpu, s: usize) -> anyhow::Result<()> {
    let t = 8;
    let q = random(21, t * IH * ID);
    let w = random(22, t * IH);
    let kv = random(s as u64 + 5, s * ID);
    // Every 97th key far out of the exact f16 range at the 1024 key scale (|k| up to 1000).
    let mut big = kv.clone();
    for r in (3..s).step_by(97) {
        big[r * ID..(r + 1) * ID].iter_mut().for_each(|x| *x *= 1000.0);
    }
    // Head 1's q 1e-3 and head 2's 1e3 times the rest (weights the inverse): per-head scaling.
    let (mut qv, mut wv) = (q.clone(), w.clone());
    for row in 0..t {
        qv[(row * IH + 1) * ID..(row * IH + 2) * ID].iter_mut().for_each(|x| *x *= 1e-3);
        qv[(row * IH + 2) * ID..(row * IH + 3) * ID].iter_mut().for_each(|x| *x *= 1e3);
        wv[row * IH + 1] *= 1e3;
        wv[row * IH + 2] *= 1e-3;
    }
    // q exactly representable in f16: separates q rounding from every other error source.
    let q16: Vec<f32> = q.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect();
    // (label, first page rows, keys, q, w)
    type Case<'a> = (&'a str, usize, &'a [f32], &'a [f32], &'a [f32]);
    let cases: [Case; 4] = [
        ("pages of 16", 16, &kv, &q, &w),
        ("pages of 1024, q exact in f16", 1024, &kv, &q16, &w),
        ("pages of 1024, every 97th key x1000", 1024, &big, &q, &w),
        ("pages of 1024, head q scales 1e-3 / 1e3", 1024, &kv, &qv, &wv),
    ];
    for (label, page0, keys_v, qx, wx) in cases {
        let mut keys = PagedRows::new(gpu, "keys check", ID, page0, s)?;
        keys.upload(gpu, keys_v)?;
        // Prefill: queries at s/2 .. s/2 + 7 over all s positions (the rest masked).
        let a = scores_of(gpu, Indexer::Variant(IndexVariant::Simt), &keys, qx, wx, t, s / 2, s)?;
        let a_bf16 = scores_of(gpu, Indexer::Bf16(IndexVariant::Simt), &keys, qx, wx, t, s / 2, s)?;
        report_check(format!("indexer SIMT q bf16 vs f32: prefill 8 queries, {label}, S={s}"), diff_text(&a, &a_bf16, t, s / 2));
        for (v, name) in checked_indexers(gpu) {
            let b = scores_of(gpu, v, &keys, qx, wx, t, s / 2, s)?;
            let (want, twin) = if matches!(v, Indexer::Bf16(_)) { (&a_bf16, "SIMT q bf16") } else { (&a, "SIMT") };
            report_check(format!("indexer {name} vs {twin}: prefill 8 queries, {label}, S={s}"), diff_text(want, &b, t, s / 2));
        }
    }
    Ok(())
}
