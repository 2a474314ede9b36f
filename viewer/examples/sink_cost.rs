//! What the viewer costs the generating thread per token at K3.1's shape (24 global layers x
//! top-2048): FrameSink::record for every layer + end_step (copy + channel send), with a
//! consumer thread folding the frames into a Heatmap as the window does. Prints µs per token.
//!
//!   cargo run --release -p k31-viewer --example sink_cost [-- TOKENS [--drop]]

use std::time::Instant;

use k31_engine::trace::{Selection, SelectionSink};
use k31_viewer::*;

fn main() {
    let tokens: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(2000);
    // --drop: the consumer only drops frames (isolates the producer's own cost).
    let drop_only = std::env::args().any(|a| a == "--drop");
    let (layers, k) = (24usize, 2048usize);
    let positions: Vec<i32> = (0..k as i32).collect();
    let scores: Vec<f32> = (0..k).map(|i| 1.0 - i as f32 / k as f32).collect();
    let (tx, rx) = std::sync::mpsc::channel();
    let consumer = std::thread::spawn(move || {
        let mut hm = Heatmap::new(512, 64);
        for m in rx {
            match m {
                ViewerMsg::Frame(f) if drop_only => drop(f),
                ViewerMsg::Frame(f) => hm.push(f),
                ViewerMsg::Done => break,
                ViewerMsg::Figures(_) => {}
            }
        }
        hm.tokens()
    });
    let mut sink = FrameSink::new(tx);
    let mut worst = 0f64;
    let start = Instant::now();
    for t in 0..tokens {
        let s = Instant::now();
        for l in 0..layers {
            let n = k.min(2048 + t);
            sink.record(Selection { layer: 3 + 4 * l, position: 2048 + t, positions: &positions[..n], scores: &scores[..n] });
        }
        sink.end_step(&|_| String::new());
        worst = worst.max(s.elapsed().as_secs_f64());
    }
    let per = start.elapsed().as_secs_f64() / tokens as f64;
    sink.finish();
    let seen = consumer.join().unwrap_or(0);
    println!("{{\"tokens\":{tokens},\"layers\":{layers},\"topk\":{k},\"sink_us_per_token\":{:.1},\"worst_us\":{:.1},\"consumer_frames\":{seen}}}", per * 1e6, worst * 1e6);
}
