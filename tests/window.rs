//! The live window: opens under X11 (CI: `xvfb-run -a`, software Vulkan), draws frames from a
//! synthetic producer on another thread, and closes by itself when the producer is done
//! (`exit_when_done`). Skips with a message when there is no display. One test only: winit
//! allows one event loop per process.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k31_engine::trace::{Selection, SelectionSink};
use k31_viewer::*;

#[test]
fn window_draws_frames_and_closes_when_done() {
    let display = ["DISPLAY", "WAYLAND_DISPLAY"].iter().any(|v| std::env::var_os(v).is_some_and(|s| !s.is_empty()));
    if !display {
        eprintln!("skipping the window test: DISPLAY is not set (run it under `xvfb-run -a cargo test --test window`)");
        return;
    }
    // A hung window must fail the test, not the CI job's time limit.
    std::thread::spawn(|| {
        std::thread::sleep(Duration::from_secs(180));
        eprintln!("window test: no close after 180 s");
        std::process::exit(1);
    });
    const TOKENS: usize = 40;
    let (tx, rx) = std::sync::mpsc::channel();
    let (ctl_tx, mut ctl) = GenControl::channel();
    let producer = std::thread::spawn(move || {
        let mut sink = FrameSink::new(tx);
        let mut max_send = Duration::ZERO;
        sink.figures(vec![LayerFigures { layer: 1, epsilon: 0.01, error: 0.02, recall: 0.95 }]);
        for t in 0..TOKENS {
            assert_eq!(ctl.next_step(), Flow::Continue);
            let start = Instant::now();
            for layer in [1usize, 3, 5] {
                let ps: Vec<i32> = (0..=t as i32).rev().step_by(layer).take(8).collect();
                let sc: Vec<f32> = (0..ps.len()).map(|i| -(i as f32)).collect();
                sink.record(Selection { layer, position: t, positions: &ps, scores: &sc });
            }
            sink.end_step(&|p| format!("tok{p}"));
            max_send = max_send.max(start.elapsed());
            std::thread::sleep(Duration::from_millis(10));
        }
        sink.finish();
        max_send
    });
    let opts = ViewerOptions {
        size: (640, 400),
        exit_when_done: true,
        any_thread: true,
        token_text: Some(Arc::new(|p| Some(format!("prompt{p}")))),
        view: ViewState { figures: true, ..Default::default() },
        ..Default::default()
    };
    let summary = run_window(rx, Some(ctl_tx), opts).expect("window");
    let max_send = producer.join().expect("producer");
    eprintln!("{summary:?}; slowest producer step {max_send:?}");
    assert_eq!(summary.closed, CloseReason::Done);
    assert_eq!(summary.frames_received, TOKENS);
    assert!(summary.frames_drawn >= 1, "{summary:?}");
    assert!(summary.upload_bytes > 0);
}
