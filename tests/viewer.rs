//! The selection viewer without a display: the heatmap drawn offscreen from synthetic
//! selections (pixels at known cells, decoded from the PNG), the trace file round trip, the
//! sink that groups engine records into frames, the control channel, keys and the shader.

use std::path::PathBuf;
use std::sync::Arc;

use k31_engine::trace::{Selection, SelectionSink};
use k31_viewer::heatmap::{encode, fill_row};
use k31_viewer::keys::{self, Action};
use k31_viewer::*;

/// A test's own temporary directory, removed with everything in it when dropped (also when
/// the test panics).
struct Scratch(PathBuf);

impl Scratch {
    fn new(test: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("k31-viewer-test-{}-{test}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        Scratch(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A headless renderer, or None (test skipped) when the machine has no adapter.
fn renderer() -> Option<Renderer> {
    match Renderer::headless() {
        Ok(r) => Some(r),
        Err(e) => {
            eprintln!("skipping: {e}");
            None
        }
    }
}

fn sel(layer: usize, positions: &[i32], scores: &[f32]) -> LayerSelection {
    LayerSelection { layer, positions: positions.to_vec(), scores: scores.to_vec() }
}

/// 40 tokens at positions 0..40, layers 1, 5, 9: each layer selects a few earlier positions
/// with descending scores; layer 9 reports nothing for odd positions. The newest token
/// (position 39) has hand-picked selections.
fn synthetic() -> Vec<Arc<TokenFrame>> {
    let mut frames = Vec::new();
    for t in 0..40usize {
        let mut layers = Vec::new();
        if t == 39 {
            layers.push(sel(1, &[3, 10, 20], &[2.0, 1.0, 0.0]));
            layers.push(sel(5, &[0], &[7.0]));
        } else {
            for &l in &[1usize, 5, 9] {
                if l == 9 && t % 2 == 1 {
                    continue;
                }
                let ps: Vec<i32> = (0..=t as i32).rev().step_by(l).take(4).collect();
                let sc: Vec<f32> = (0..ps.len()).map(|i| 4.0 - i as f32).collect();
                layers.push(sel(l, &ps, &sc));
            }
        }
        frames.push(Arc::new(TokenFrame { position: t, text: format!("t{t}"), layers }));
    }
    frames
}

fn px(rgba: &[u8], w: u32, (x, y): (u32, u32)) -> [u8; 3] {
    let i = ((y * w + x) * 4) as usize;
    [rgba[i], rgba[i + 1], rgba[i + 2]]
}

fn close(a: [u8; 3], b: [u8; 3], what: &str) {
    let d = (0..3).map(|i| (a[i] as i32 - b[i] as i32).abs()).max().unwrap_or(0);
    assert!(d <= 1, "{what}: got {a:?}, expected {b:?}");
}

#[test]
fn png_has_expected_pixels_at_known_cells() {
    let Some(mut r) = renderer() else { return };
    let mut hm = Heatmap::new(64, 16);
    for f in synthetic() {
        hm.push(f);
    }
    assert_eq!(hm.layers(), &[1, 5, 9]);
    assert_eq!(hm.context(), 40);
    let view = ViewState::default();
    let (w, h) = (640, 360);
    let tmp = Scratch::new("layers");
    let path = tmp.path("layers.png");
    render_png(&mut r, &hm, &view, (w, h), None, &path).expect("render");
    let (pw, ph, rgba) = read_png(&path).expect("decode");
    assert_eq!((pw, ph), (w, h));
    let lay = Layout::new(w, h, &hm, &view);
    assert_eq!(lay.rows, 3);
    assert!(lay.heat.w as f64 / 40.0 >= 8.0, "cells should be several pixels wide: {:?}", lay.heat);
    let c = |row, pos| px(&rgba, w, lay.cell_center(row, pos));
    // Layer 1 (row 0): scores 2, 1, 0 normalise to 1, 0.5, 0.
    close(c(0, 3), palette::heat(encode(1.0)), "layer 1, position 3 (best score)");
    close(c(0, 10), palette::heat(encode(0.5)), "layer 1, position 10 (middle score)");
    close(c(0, 20), palette::heat(encode(0.0)), "layer 1, position 20 (lowest score)");
    close(c(0, 4), palette::UNSELECTED, "layer 1, position 4 (not selected)");
    // Layer 5 (row 1): one selection -> full brightness.
    close(c(1, 0), palette::heat(encode(1.0)), "layer 5, position 0");
    close(c(1, 3), palette::UNSELECTED, "layer 5, position 3");
    // Layer 9 (row 2) did not report for the newest token.
    close(c(2, 3), palette::UNSELECTED, "layer 9, position 3");
    // The query position (39) is marked in every row.
    close(c(0, 39), palette::marked(palette::UNSELECTED), "query position, layer 1");
    close(c(2, 39), palette::marked(palette::UNSELECTED), "query position, layer 9");
    // The strip: selection counts over the last 16 tokens, all layers.
    let mut strip = vec![0u8; 40];
    hm.strip(ViewMode::Layers, &mut strip);
    let sy = lay.strip.y + lay.strip.h / 2;
    for p in [0usize, 3, 20, 30, 38] {
        let x = lay.cell_center(0, p).0;
        close(px(&rgba, w, (x, sy)), palette::strip(strip[p]), &format!("strip at position {p}"));
    }
    assert!(strip[38] > 0 && strip[3] > 0, "strip should count recent selections: {strip:?}");
    // Margin right of the heatmap: background.
    close(px(&rgba, w, (w - 3, lay.heat.y + 2)), palette::BACKGROUND, "right margin");
    // The title is drawn in the text colour somewhere on the first text line.
    let title_px = (0..w).flat_map(|x| (4..14).map(move |y| (x, y))).filter(|&p| px(&rgba, w, p) == palette::TEXT).count();
    assert!(title_px > 100, "title text pixels: {title_px}");
}

#[test]
fn png_layer_focus_and_zoom() {
    let Some(mut r) = renderer() else { return };
    let mut hm = Heatmap::new(64, 16);
    let frames = synthetic();
    for f in &frames {
        hm.push(f.clone());
    }
    let (w, h) = (640, 480);
    // Layer focus on layer 5 (row 1): rows are tokens 0..40, newest at the bottom.
    let view = ViewState { mode: ViewMode::Focus(1), colour: ColourMode::Binary, ..Default::default() };
    let lay = Layout::new(w, h, &hm, &view);
    assert_eq!((lay.rows, lay.first_token), (40, 0));
    let rgba = r.render_rgba(&hm, &view, w, h, None).expect("render");
    let c = |row, pos| px(&rgba, w, lay.cell_center(row, pos));
    // Token 20 in layer 5 selected 20, 15, 10, 5.
    close(c(20, 15), palette::heat(encode(1.0)), "token 20 selected 15");
    close(c(20, 16), palette::UNSELECTED, "token 20 did not select 16");
    close(c(20, 30), palette::FUTURE, "position 30 is after token 20");
    close(c(20, 20), palette::marked(palette::heat(encode(1.0))), "token 20 at its own position");
    close(c(39, 0), palette::heat(encode(1.0)), "token 39 selected 0");
    close(c(39, 5), palette::UNSELECTED, "token 39 did not select 5");

    // Zoom in on positions 8..12 of the layers view: each position gets a wide cell.
    let mut view = ViewState::default();
    for _ in 0..8 {
        keys::apply(&mut view, &hm, Action::ZoomIn, Some(10.5));
    }
    let (x0, x1) = view.x_range(hm.context());
    assert_eq!(x1 - x0, heatmap::MIN_SPAN, "zoom stops at {} positions", heatmap::MIN_SPAN);
    assert!(x0 <= 10.0 && x1 >= 11.0, "zoom keeps position 10 in view: {x0}..{x1}");
    let lay = Layout::new(w, h, &hm, &view);
    assert!(lay.heat.w as f64 / (x1 - x0) > 100.0);
    let rgba = r.render_rgba(&hm, &view, w, h, None).expect("render");
    close(px(&rgba, w, lay.cell_center(0, 10)), palette::heat(encode(0.5)), "zoomed: layer 1, position 10");
    assert_eq!(lay.position_at(lay.cell_center(0, 10).0 as f32), Some(10));
}

#[test]
fn figures_panel_help_and_every_mode_render() {
    let Some(mut r) = renderer() else { return };
    let mut hm = Heatmap::new(8, 4);
    for f in synthetic() {
        hm.push(f);
    }
    hm.set_figures(vec![LayerFigures { layer: 1, epsilon: 0.01, error: 0.02, recall: 0.9 }, LayerFigures { layer: 5, epsilon: 0.1, error: 0.2, recall: 0.5 }]);
    let text: TokenText = Arc::new(|p| Some(format!("tok{p}")));
    for colour in [ColourMode::Score, ColourMode::Rank, ColourMode::Binary] {
        for mode in [ViewMode::Layers, ViewMode::Focus(2)] {
            for (w, h) in [(1280, 720), (200, 150), (1, 1)] {
                let view = ViewState { mode, colour, figures: true, help: true, hover: Some((300.0, 100.0)), ..Default::default() };
                let rgba = r.render_rgba(&hm, &view, w, h, Some(&text)).expect("render");
                assert_eq!(rgba.len(), (w * h * 4) as usize);
            }
        }
    }
    // History of 8 tokens: focus shows only those.
    let lay = Layout::new(1280, 720, &hm, &ViewState { mode: ViewMode::Focus(0), ..Default::default() });
    assert_eq!((lay.rows, lay.first_token), (8, 32));
}

#[test]
fn per_token_uploads_stay_small() {
    let Some(mut r) = renderer() else { return };
    let mut hm = Heatmap::new(64, 16);
    let frames = synthetic();
    for f in &frames[..39] {
        hm.push(f.clone());
    }
    let view = ViewState { mode: ViewMode::Focus(0), ..Default::default() };
    r.render_rgba(&hm, &view, 640, 360, None).expect("render");
    let before = r.stats;
    hm.push(frames[39].clone());
    r.render_rgba(&hm, &view, 640, 360, None).expect("render");
    let bytes = r.stats.bytes - before.bytes;
    // 3 layer rows + one history row + strip (40 bytes each) + positions + the title band
    // of the overlay (a few text lines of 640 RGBA pixels), nothing like a full frame.
    assert!(bytes < 640 * 4 * 60, "one token uploaded {bytes} bytes");
    eprintln!("one token: {bytes} bytes in {} writes", r.stats.writes - before.writes);
}

#[test]
fn values_per_colour_mode() {
    let s = sel(3, &[7, 2, 9], &[5.0, 3.0, 1.0]);
    let mut row = vec![0u8; 12];
    fill_row(&mut row, Some(&s), ColourMode::Score);
    assert_eq!((row[7], row[2], row[9], row[0]), (255, 128, 1, 0));
    fill_row(&mut row, Some(&s), ColourMode::Rank);
    assert_eq!((row[7], row[2], row[9]), (255, 128, 1));
    fill_row(&mut row, Some(&s), ColourMode::Binary);
    assert_eq!((row[7], row[2], row[9], row[1]), (255, 255, 255, 0));
    // Equal scores, NaN and out-of-range positions do not break a row.
    let s = sel(3, &[1, -1, 40, 2], &[1.0, 1.0, 1.0, f32::NAN]);
    fill_row(&mut row, Some(&s), ColourMode::Score);
    assert_eq!((row[1], row[2]), (255, 1));
}

#[test]
fn trace_round_trip() {
    let tmp = Scratch::new("trace");
    let path = tmp.path("trace.jsonl");
    let mut w = TraceWriter::create(&path).expect("create");
    {
        let sink: &mut dyn SelectionSink = &mut w;
        // Prefill order: layer-major over two positions, then a decode step.
        sink.record(Selection { layer: 3, position: 0, positions: &[0], scores: &[0.5] });
        sink.record(Selection { layer: 3, position: 1, positions: &[1, 0], scores: &[2.5, f32::NAN] });
        sink.record(Selection { layer: 7, position: 0, positions: &[0], scores: &[-1.0] });
        sink.record(Selection { layer: 7, position: 1, positions: &[0, 1], scores: &[1e-7, 3.0] });
    }
    w.end_step(&|p| ["Hello", " wor\nld\\"][p].to_string());
    w.record(Selection { layer: 3, position: 2, positions: &[2, 1, 0], scores: &[1.0, 0.25, f32::INFINITY] });
    w.end_step(&|_| "\"\n".to_string());
    w.write_figures(&[LayerFigures { layer: 3, epsilon: 0.125, error: 0.5, recall: 1.0 }]);
    let lines = w.finish().expect("finish");
    assert_eq!(lines, 1 + 5 + 3 + 1);
    let t = read_trace(&path).expect("read");
    assert_eq!(t.selections.len(), 5);
    assert_eq!(t.selections[0], (3, 0, vec![0], vec![0.5]));
    assert_eq!(t.selections[3], (7, 1, vec![0, 1], vec![1e-7, 3.0]));
    assert!(t.selections[1].3[1].is_nan() && t.selections[4].3[2].is_nan(), "non-finite scores read back as NaN");
    assert_eq!(t.texts.get(&1).map(String::as_str), Some(" wor\nld\\"));
    assert_eq!(t.texts.get(&2).map(String::as_str), Some("\"\n"));
    assert_eq!(t.figures, vec![LayerFigures { layer: 3, epsilon: 0.125, error: 0.5, recall: 1.0 }]);
    let frames = t.frames();
    assert_eq!(frames.iter().map(|f| f.position).collect::<Vec<_>>(), vec![0, 1, 2]);
    assert_eq!(frames[1].layers.iter().map(|l| l.layer).collect::<Vec<_>>(), vec![3, 7]);
    assert_eq!(frames[0].text, "Hello");

    // Every line is one JSON object; the first is the header.
    let raw = std::fs::read_to_string(&path).expect("read");
    let first: serde_json::Value = serde_json::from_str(raw.lines().next().unwrap_or_default()).expect("json");
    assert_eq!(first["format"], "k31-selection-trace");

    // A file that is not a trace is refused with its line number.
    let bad = tmp.path("bad.jsonl");
    std::fs::write(&bad, "{\"layer\": 1, \"position\": 0, \"positions\": [0], \"scores\": [1]}\n").expect("write");
    let e = read_trace(&bad).expect_err("no header").to_string();
    assert!(e.contains(":1:") && e.contains("header"), "{e}");
    std::fs::write(&bad, format!("{}\n{{\"layer\": 1, \"position\": 0, \"positions\": [0, 1], \"scores\": [1]}}\n", raw.lines().next().unwrap_or_default())).expect("write");
    let e = read_trace(&bad).expect_err("length mismatch").to_string();
    assert!(e.contains(":2:") && e.contains("2 positions but 1 scores"), "{e}");
    assert!(read_trace(&tmp.path("missing.jsonl")).is_err());
}

#[test]
fn frame_sink_groups_records_per_token() {
    let (tx, rx) = std::sync::mpsc::channel();
    let (tx2, rx2) = std::sync::mpsc::channel();
    let mut sink = FrameSink::new(tx);
    sink.add(tx2);
    // Prefill: each layer reports every position, layer by layer.
    for layer in [2usize, 6] {
        for pos in 0..3 {
            sink.record(Selection { layer, position: pos, positions: &[pos as i32], scores: &[1.0] });
        }
    }
    sink.end_step(&|p| format!("<{p}>"));
    drop(rx2); // one consumer going away does not stop the others
    sink.record(Selection { layer: 2, position: 3, positions: &[3, 0], scores: &[2.0, 1.0] });
    sink.end_step(&|p| format!("<{p}>"));
    sink.figures(vec![LayerFigures::default()]);
    sink.finish();
    assert!(sink.connected());
    let msgs: Vec<ViewerMsg> = rx.try_iter().collect();
    let frames: Vec<&TokenFrame> = msgs.iter().filter_map(|m| if let ViewerMsg::Frame(f) = m { Some(f.as_ref()) } else { None }).collect();
    assert_eq!(frames.iter().map(|f| f.position).collect::<Vec<_>>(), vec![0, 1, 2, 3]);
    assert_eq!(frames[1].layers.iter().map(|l| l.layer).collect::<Vec<_>>(), vec![2, 6]);
    assert_eq!(frames[3].text, "<3>");
    assert_eq!(frames[3].layers, vec![sel(2, &[3, 0], &[2.0, 1.0])]);
    assert!(matches!(msgs.last(), Some(ViewerMsg::Done)));
    assert_eq!(sink.frames_sent(), 4);
    // With no consumer left the engine is told to skip the readback.
    let (tx, rx) = std::sync::mpsc::channel();
    let mut sink = FrameSink::new(tx);
    drop(rx);
    sink.end_step(&|_| String::new());
    sink.figures(Vec::new());
    assert!(!sink.wants(2));
}

#[test]
fn gen_control_pause_step_stop() {
    let (tx, mut ctl) = GenControl::channel();
    assert_eq!(ctl.next_step(), Flow::Continue);
    tx.send(Control::Step).expect("send");
    assert_eq!(ctl.next_step(), Flow::Continue, "a step lets one token through");
    assert!(ctl.is_paused());
    // Paused: next() waits until the viewer says something.
    let t = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(50));
        tx.send(Control::Resume).expect("send");
        tx
    });
    assert_eq!(ctl.next_step(), Flow::Continue);
    let tx = t.join().expect("thread");
    tx.send(Control::Pause).expect("send");
    tx.send(Control::Stop).expect("send");
    assert_eq!(ctl.next_step(), Flow::Stop);
    // A viewer that vanished lets generation run on.
    tx.send(Control::Pause).expect("send");
    drop(tx);
    assert_eq!(ctl.next_step(), Flow::Continue);
}

#[test]
fn png_export_thread_writes_every_n_and_final() {
    let Some(_) = renderer() else { return };
    let tmp = Scratch::new("export");
    let path = tmp.path("export.png");
    let mut opts = PngExportOptions::new(&path);
    opts.every = Some(2);
    opts.size = (320, 200);
    let (tx, handle) = spawn_png_export(opts);
    let mut sink = FrameSink::new(tx);
    for t in 0..5usize {
        sink.record(Selection { layer: 0, position: t, positions: &[t as i32], scores: &[1.0] });
        sink.end_step(&|p| format!("w{p}"));
    }
    sink.finish();
    let summary = handle.join().expect("thread").expect("export");
    assert_eq!(summary.frames, 5);
    let names: Vec<String> = summary.files.iter().filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned())).collect();
    assert_eq!(names, vec!["export-000002.png", "export-000004.png", "export.png"]);
    for f in &summary.files {
        let (w, h, _) = read_png(f).expect("decode");
        assert_eq!((w, h), (320, 200));
    }
}

#[test]
fn keys_change_the_view() {
    let mut hm = Heatmap::new(64, 16);
    for f in synthetic() {
        hm.push(f);
    }
    let mut v = ViewState::default();
    assert_eq!(keys::apply(&mut v, &hm, Action::TogglePause, None), Some(Control::Pause));
    assert_eq!(keys::apply(&mut v, &hm, Action::TogglePause, None), Some(Control::Resume));
    assert_eq!(keys::apply(&mut v, &hm, Action::Step, None), Some(Control::Step));
    assert!(v.paused);
    assert_eq!(keys::apply(&mut v, &hm, Action::Quit, None), Some(Control::Stop));
    keys::apply(&mut v, &hm, Action::SwitchView, None);
    assert_eq!(v.mode, ViewMode::Focus(0));
    keys::apply(&mut v, &hm, Action::PrevLayer, None);
    assert_eq!(v.mode, ViewMode::Focus(2), "wraps to the last layer");
    keys::apply(&mut v, &hm, Action::ScrollBack, None);
    assert_eq!(v.scroll, 16);
    keys::apply(&mut v, &hm, Action::Follow, None);
    assert_eq!(v.scroll, 0);
    keys::apply(&mut v, &hm, Action::Colour, None);
    assert_eq!(v.colour, ColourMode::Rank);
    keys::apply(&mut v, &hm, Action::ZoomIn, Some(0.5));
    keys::apply(&mut v, &hm, Action::PanLeft, None);
    assert_eq!(v.x_range(40), (0.0, 20.0), "pan stops at position 0");
    for _ in 0..4 {
        keys::apply(&mut v, &hm, Action::PanRight, None);
    }
    assert_eq!(v.x_range(40), (20.0, 40.0), "pan stops at the end of the context");
    keys::apply(&mut v, &hm, Action::ZoomOut, None);
    assert_eq!(v.zoom, None, "zooming out to the whole context resets");
    // Hover names the position, its text, the row's score and the layers that selected it.
    let info = hm.hover(&ViewState::default(), 3, Some((0, 39)), None);
    assert_eq!(info.text.as_deref(), Some("t3"));
    assert_eq!(info.row, Some((1, 39)));
    assert_eq!(info.score, Some((2.0, 0)));
    assert_eq!((info.layers.clone(), info.layers_total), (vec![1], 3));
}

#[test]
fn font_covers_printable_ascii() {
    use k31_viewer::font;
    for c in ' '..='~' {
        let g = font::glyph(c);
        assert!(g.iter().all(|r| *r < 32), "{c:?} is wider than 5 pixels");
        assert_eq!(g.iter().any(|r| *r != 0), c != ' ', "{c:?}");
    }
    assert_eq!(font::glyph('\u{e9}'), font::glyph('\u{1F600}'), "non-ASCII draws as a box");
}

#[test]
fn shader_validates_and_params_match() {
    let module = naga::front::wgsl::parse_str(render::SHADER).expect("parse");
    let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::default())
        .validate(&module)
        .expect("validate");
    let _ = info;
    let params = module.types.iter().find(|(_, t)| t.name.as_deref() == Some("Params")).expect("Params struct");
    assert_eq!(params.1.inner.size(module.to_ctx()), 64, "Params is 64 bytes on both sides");
}
