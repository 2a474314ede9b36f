//! A synthetic producer for the viewer (no model needed): 24 global layers, a sliding
//! local window plus a few "anchor" positions with noisy scores, like a DSA indexer.
//!
//!   cargo run -p k31-viewer --example synthetic -- --png out.png [--focus L] [--figures]
//!   cargo run -p k31-viewer --example synthetic -- --window [--exit-when-done]

use std::sync::Arc;
use std::time::Duration;

use k31_viewer::*;

fn frame(t: usize, layers: usize, k: usize) -> TokenFrame {
    let mut ls = Vec::new();
    let mut seed = (t as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 11) as f32 / (1u64 << 53) as f32
    };
    for l in 0..layers {
        let layer = 3 + 4 * l;
        let mut cand: Vec<(i32, f32)> = Vec::new();
        let local = 8 + 2 * l;
        for p in t.saturating_sub(local)..=t {
            cand.push((p as i32, 2.0 - (t - p) as f32 / local as f32 + rnd() * 0.3));
        }
        for a in [0usize, 1, 17, 40 + l * 3, t / 2] {
            if a <= t {
                cand.push((a as i32, 1.0 + rnd()));
            }
        }
        for _ in 0..k / 4 {
            let p = (rnd() * (t + 1) as f32) as usize;
            cand.push((p.min(t) as i32, rnd()));
        }
        cand.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        cand.dedup_by_key(|c| c.0);
        cand.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        cand.truncate(k);
        ls.push(LayerSelection { layer, positions: cand.iter().map(|c| c.0).collect(), scores: cand.iter().map(|c| c.1).collect() });
    }
    TokenFrame { position: t, text: format!("w{t}"), layers: ls }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let val = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let tokens: usize = val("--tokens").map(|s| s.parse()).transpose()?.unwrap_or(300);
    let mut view = ViewState { figures: args.iter().any(|a| a == "--figures"), ..Default::default() };
    if let Some(l) = val("--focus") {
        view.mode = ViewMode::Focus(l.parse()?);
    }
    let figures: Vec<LayerFigures> = (0..24)
        .map(|l| LayerFigures { layer: 3 + 4 * l, epsilon: 0.002 * (l + 1) as f32, error: 0.004 * (l + 1) as f32, recall: 1.0 - 0.015 * l as f32 })
        .collect();
    if let Some(png) = val("--png") {
        let mut hm = Heatmap::new(512, 64);
        for t in 0..tokens {
            hm.push(Arc::new(frame(t, 24, 32)));
        }
        hm.set_figures(figures);
        hm.done = true;
        view.hover = val("--hover").map(|h| {
            let v: Vec<f32> = h.split(',').filter_map(|x| x.parse().ok()).collect();
            (v.first().copied().unwrap_or(0.0), v.get(1).copied().unwrap_or(0.0))
        });
        let mut r = Renderer::headless()?;
        render_png(&mut r, &hm, &view, (1280, 760), None, png.as_ref())?;
        return Ok(());
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let (ctl_tx, mut ctl) = GenControl::channel();
    let producer = std::thread::spawn(move || {
        let mut sink = FrameSink::new(tx);
        sink.figures(figures);
        for t in 0..tokens {
            if ctl.next_step() == Flow::Stop {
                break;
            }
            let f = frame(t, 24, 32);
            for l in &f.layers {
                k31_engine::trace::SelectionSink::record(&mut sink, k31_engine::trace::Selection { layer: l.layer, position: t, positions: &l.positions, scores: &l.scores });
            }
            sink.end_step(&|p| format!("w{p}"));
            std::thread::sleep(Duration::from_millis(20));
        }
        sink.finish();
    });
    let opts = ViewerOptions { exit_when_done: args.iter().any(|a| a == "--exit-when-done"), view, ..Default::default() };
    let s = run_window(rx, Some(ctl_tx), opts)?;
    println!("{s:?}");
    let _ = producer.join();
    Ok(())
}
