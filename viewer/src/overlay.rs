//! Everything that is text or a thin line (titles, row labels, axis ticks, legend, hover
//! line, figures panel, help), drawn on the CPU into a transparent RGBA canvas that the
//! shader lays over the heatmap. Uploaded only where it changed.

use crate::TokenText;
use crate::font::{self, CELL_W, GLYPH_H, GLYPH_W};
use crate::heatmap::{ColourMode, Heatmap, ViewMode, ViewState};
use crate::layout::{Layout, Rect, tick_step};
use crate::palette;

pub struct Canvas {
    pub width: u32,
    pub height: u32,
    /// [height, width, 4] RGBA bytes, straight alpha.
    pub px: Vec<u8>,
}

fn rgba(c: [u8; 3]) -> [u8; 4] {
    [c[0], c[1], c[2], 255]
}

impl Canvas {
    pub fn new(width: u32, height: u32) -> Canvas {
        Canvas { width, height, px: vec![0; (width * height * 4) as usize] }
    }

    pub fn clear(&mut self) {
        self.px.fill(0);
    }

    pub fn fill(&mut self, x: i64, y: i64, w: i64, h: i64, c: [u8; 4]) {
        let (x0, y0) = (x.max(0), y.max(0));
        let (x1, y1) = ((x + w).min(self.width as i64), (y + h).min(self.height as i64));
        for yy in y0..y1 {
            for xx in x0..x1 {
                let i = ((yy as u32 * self.width + xx as u32) * 4) as usize;
                self.px[i..i + 4].copy_from_slice(&c);
            }
        }
    }

    /// Draws `s` with its top-left corner at (x, y); returns the x after the last character.
    pub fn text(&mut self, x: i64, y: i64, s: &str, c: [u8; 3], scale: u32) -> i64 {
        let mut cx = x;
        let s_ = scale as i64;
        for ch in s.chars() {
            for gy in 0..GLYPH_H {
                for gx in 0..GLYPH_W {
                    if font::pixel(ch, gx, gy) {
                        self.fill(cx + gx as i64 * s_, y + gy as i64 * s_, s_, s_, rgba(c));
                    }
                }
            }
            cx += (CELL_W * scale) as i64;
        }
        cx
    }

    /// Text clipped to `max_chars` characters (with a trailing '~' when cut).
    pub fn text_clip(&mut self, x: i64, y: i64, s: &str, c: [u8; 3], scale: u32, max_chars: usize) -> i64 {
        let n = s.chars().count();
        if n <= max_chars {
            return self.text(x, y, s, c, scale);
        }
        let cut: String = s.chars().take(max_chars.saturating_sub(1)).chain(std::iter::once('~')).collect();
        self.text(x, y, &cut, c, scale)
    }
}

/// Makes token text printable on one line (newlines and tabs shown as escapes).
pub fn printable(s: &str) -> String {
    s.chars()
        .flat_map(|c| match c {
            '\n' => vec!['\\', 'n'],
            '\t' => vec!['\\', 't'],
            '\r' => vec!['\\', 'r'],
            c => vec![c],
        })
        .collect()
}

/// Draws the whole overlay for this frame.
pub fn draw(cv: &mut Canvas, lay: &Layout, hm: &Heatmap, view: &ViewState, token_text: Option<&TokenText>) {
    cv.clear();
    let s = lay.scale;
    let (cw, lh) = (lay.char_w() as i64, lay.line_h() as i64);
    let cols = (lay.width as i64 / cw).max(1) as usize;
    let h = lay.heat;

    // Title and subtitle.
    let mut title = String::from("k31 selection viewer");
    match view.mode {
        ViewMode::Layers => title += " | all global layers",
        ViewMode::Focus(r) => title += &format!(" | layer {} focus", hm.layers().get(r).copied().unwrap_or(0)),
    }
    if let Some(f) = hm.newest() {
        title += &format!(" | token {} at position {}", hm.tokens(), f.position);
        if !f.text.is_empty() {
            title += &format!(" '{}'", printable(&f.text));
        }
    } else {
        title += " | waiting for the first token";
    }
    if view.paused {
        title += " | PAUSED";
    }
    if hm.done {
        title += " | generation done";
    }
    cv.text_clip(6, 4, &title, palette::TEXT, s, cols - 1);
    let sub = match view.mode {
        ViewMode::Layers => format!(
            "rows: global layers | columns: context positions {}..{} | colour: selected for the newest token | H: keys",
            lay.x0.floor() as usize,
            (lay.x1.ceil() as usize).saturating_sub(1)
        ),
        ViewMode::Focus(_) => format!(
            "rows: tokens, newest at the bottom{} | columns: positions each token read | H: keys",
            if view.scroll > 0 { format!(" (scrolled back {})", view.scroll) } else { String::new() }
        ),
    };
    // Leave the figures panel's header (same line) free.
    let sub_cols = if lay.figures.is_some() { ((h.x + h.w) as i64 / cw - 1).max(1) as usize } else { cols - 1 };
    cv.text_clip(6, 4 + lh, &sub, palette::DIM, s, sub_cols);

    // Row labels: as many as fit without overlapping.
    if lay.rows > 0 {
        let row_px = h.h as f64 / lay.rows as f64;
        let every = ((lh as f64 + 2.0) / row_px).ceil().max(1.0) as usize;
        for r in (0..lay.rows).step_by(every) {
            let label = match view.mode {
                ViewMode::Layers => format!("L{}", hm.layers()[r]),
                ViewMode::Focus(_) => hm.frame(lay.first_token + r).map(|f| format!("p{}", f.position)).unwrap_or_default(),
            };
            let y = h.y as f64 + (r as f64 + 0.5) * row_px - (GLYPH_H * s) as f64 / 2.0;
            let x = h.x as i64 - 4 - label.chars().count() as i64 * cw;
            cv.text(x, y.round() as i64, &label, palette::TEXT, s);
        }
    }
    let st = lay.strip;
    cv.text(h.x as i64 - 4 - 4 * cw, st.y as i64 + st.h as i64 / 2 - (GLYPH_H * s) as i64 / 2, "freq", palette::DIM, s);

    // X axis: ticks at round positions under the strip.
    let span = lay.x1 - lay.x0;
    let label_px = 7.0 * cw as f64;
    let step = tick_step(label_px / h.w as f64 * span);
    let mut p = (lay.x0 / step as f64).ceil() as usize * step;
    while (p as f64) < lay.x1 {
        let x = lay.x_of(p as f64 + if span < h.w as f64 { 0.5 } else { 0.0 }).round() as i64;
        cv.fill(x, lay.axis_y as i64 - 3, 1, 3 * s as i64, rgba(palette::DIM));
        let label = p.to_string();
        let lo = h.x as i64 - cw;
        let lx = (x - label.len() as i64 * cw / 2).min(lay.width as i64 - label.len() as i64 * cw).max(lo);
        cv.text(lx, lay.axis_y as i64 + 2 * s as i64, &label, palette::DIM, s);
        p += step;
    }

    // Legend: gradient, swatches, strip meaning.
    let ly = lay.legend_y as i64;
    let mut x = cv.text(6, ly, &format!("colour = {}: low ", view.colour.name()), palette::TEXT, s);
    let (gw, gh) = (12 * cw, lh - 2 * s as i64);
    if view.colour == ColourMode::Binary {
        cv.fill(x, ly, 2 * cw, gh, rgba(palette::heat(255)));
        x += 2 * cw;
    } else {
        for i in 0..gw {
            let b = 1 + (i * 254 / (gw - 1).max(1)) as u8;
            cv.fill(x + i, ly, 1, gh, rgba(palette::heat(b)));
        }
        x += gw;
    }
    x = cv.text(x, ly, " high  ", palette::TEXT, s);
    cv.fill(x, ly, 2 * cw, gh, rgba(palette::UNSELECTED));
    x = cv.text(x + 2 * cw, ly, " unselected  ", palette::TEXT, s);
    cv.fill(x, ly, 2 * cw, gh, rgba(palette::marked(palette::heat(255))));
    x = cv.text(x + 2 * cw, ly, " query  ", palette::TEXT, s);
    cv.fill(x, ly, 2 * cw, gh, rgba(palette::FUTURE));
    cv.fill(x, ly, 2 * cw, 1, rgba(palette::DIM));
    cv.text(x + 2 * cw, ly, " after query", palette::TEXT, s);
    let who = match view.mode {
        ViewMode::Layers => "all layers".to_string(),
        ViewMode::Focus(r) => format!("layer {}", hm.layers().get(r).copied().unwrap_or(0)),
    };
    cv.text_clip(
        6,
        ly + lh,
        &format!("freq strip = how often each position was selected over the last {} tokens ({who}), brighter = more", hm.freq_window()),
        palette::DIM,
        s,
        cols - 1,
    );

    // Hover line.
    let hy = lay.hover_y as i64;
    if let Some((mx, my)) = view.hover {
        let on_heat = lay.heat.contains(mx, my);
        let on_strip = st.contains(mx, my) || (mx >= st.x as f32 && mx < (st.x + st.w) as f32 && my >= st.y as f32 && my < lay.axis_y as f32);
        if let (true, Some(pos)) = (on_heat || on_strip, lay.position_at(mx)) {
            let row = if on_heat { lay.row_at(my) } else { None };
            let row_token = row.map(|r| match view.mode {
                ViewMode::Layers => (r, hm.tokens().saturating_sub(1)),
                ViewMode::Focus(l) => (l, lay.first_token + r),
            });
            let info = hm.hover(view, pos, row_token, token_text);
            let mut line = format!("position {pos}");
            if let Some(t) = &info.text {
                line += &format!(" '{}'", printable(t));
            }
            if let Some((layer, q)) = info.row {
                line += &format!(" | layer {layer}, query {q}: ");
                line += &match info.score {
                    Some((sc, rank)) => format!("score {sc:.4}, rank {}", rank + 1),
                    None => "not selected".into(),
                };
            }
            cv.text_clip(6, hy, &line, palette::TEXT, s, cols - 1);
            let ls: Vec<String> = info.layers.iter().map(|l| l.to_string()).collect();
            let l2 = format!("selected for the newest token by {}/{} layers: {}", info.layers.len(), info.layers_total, ls.join(" "));
            cv.text_clip(6, hy + lh, &l2, palette::DIM, s, cols - 1);
        }
    } else {
        cv.text_clip(6, hy, "point at a cell for its position, token, score and layers", palette::DIM, s, cols - 1);
    }

    if let Some(fr) = lay.figures {
        figures_panel(cv, lay, fr, hm);
    }
    if view.help {
        help(cv, lay);
    }
}

fn figures_panel(cv: &mut Canvas, lay: &Layout, fr: Rect, hm: &Heatmap) {
    let s = lay.scale;
    let (cw, lh) = (lay.char_w() as i64, lay.line_h() as i64);
    cv.text(fr.x as i64, fr.y as i64 - lh - 2, "omitted  error  recall", palette::TEXT, s);
    if hm.figures.is_empty() {
        cv.text(fr.x as i64, fr.y as i64 + 2, "(no figures yet)", palette::DIM, s);
        return;
    }
    let row_px = lay.heat.h as f64 / lay.rows.max(1) as f64;
    let every = ((lh as f64 + 2.0) / row_px).ceil().max(1.0) as usize;
    for r in (0..lay.rows).step_by(every) {
        let layer = hm.layers()[r];
        let Some(f) = hm.figures.iter().find(|f| f.layer == layer) else { continue };
        let y = (fr.y as f64 + (r as f64 + 0.5) * row_px - (GLYPH_H * s) as f64 / 2.0).round() as i64;
        let x = cv.text(fr.x as i64, y, &format!("{:7.4} {:6.4} {:6.3} ", f.epsilon, f.error, f.recall), palette::TEXT, s);
        // Recall bar: a first-time reader sees which layers miss the most.
        let w = (((fr.x + fr.w) as i64 - x - cw).max(0) as f32 * f.recall.clamp(0.0, 1.0)) as i64;
        cv.fill(x, y, w, (GLYPH_H * s) as i64, rgba(palette::strip(255)));
    }
}

const HELP: &[&str] = &[
    "keys",
    "space    pause / resume generation",
    "n        step one token (pauses)",
    "tab      layers view <-> layer focus",
    "up/down  focused layer",
    "c        colour: score / rank / selected",
    "+ -      zoom (also the mouse wheel)",
    "<- ->    pan     0  whole context",
    "pgup/dn  scroll tokens   end  follow",
    "f        omitted-mass figures panel",
    "h        this help    q/esc  quit",
];

fn help(cv: &mut Canvas, lay: &Layout) {
    let s = lay.scale;
    let (cw, lh) = (lay.char_w() as i64, lay.line_h() as i64);
    let w = 40 * cw;
    let hh = HELP.len() as i64 * lh + 12;
    let x = (lay.width as i64 - w) / 2;
    let y = (lay.height as i64 - hh) / 2;
    cv.fill(x, y, w, hh, [20, 22, 30, 240]);
    cv.fill(x, y, w, 1, rgba(palette::DIM));
    for (i, l) in HELP.iter().enumerate() {
        cv.text(x + 6, y + 6 + i as i64 * lh, l, if i == 0 { palette::TEXT } else { palette::DIM }, s);
    }
}
