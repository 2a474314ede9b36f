//! The heatmap model: what the viewer knows (recent frames, per-position selection counts,
//! figures) and how the user looks at it (view mode, colour mode, zoom, scroll). Pure CPU
//! state shared by the window and the PNG exporter.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::frame::{LayerFigures, LayerSelection, TokenFrame};

/// What a row is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ViewMode {
    /// Rows = global layers, for the newest token.
    Layers,
    /// Rows = tokens (newest at the bottom) for one layer (index into [`Heatmap::layers`]).
    Focus(usize),
}

/// What a selected cell's brightness means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ColourMode {
    /// The indexer score, normalised per row (min..max of that row's selection).
    Score,
    /// Rank in the selection (first = brightest).
    Rank,
    /// Selected or not.
    Binary,
}

impl ColourMode {
    pub fn next(self) -> Self {
        match self {
            ColourMode::Score => ColourMode::Rank,
            ColourMode::Rank => ColourMode::Binary,
            ColourMode::Binary => ColourMode::Score,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            ColourMode::Score => "score, per row",
            ColourMode::Rank => "rank",
            ColourMode::Binary => "selected",
        }
    }
}

/// How the user looks at the data.
#[derive(Clone, Debug, PartialEq)]
pub struct ViewState {
    pub mode: ViewMode,
    pub colour: ColourMode,
    /// Visible positions [start, start + span); None: the whole context.
    pub zoom: Option<(f64, f64)>,
    /// Focus mode: rows scrolled back from the newest token (0 follows generation).
    pub scroll: usize,
    pub figures: bool,
    pub help: bool,
    pub paused: bool,
    /// Mouse position in window pixels.
    pub hover: Option<(f32, f32)>,
}

impl Default for ViewState {
    fn default() -> Self {
        ViewState { mode: ViewMode::Layers, colour: ColourMode::Score, zoom: None, scroll: 0, figures: false, help: false, paused: false, hover: None }
    }
}

/// Smallest zoom span, so single positions get wide cells.
pub const MIN_SPAN: f64 = 4.0;

impl ViewState {
    /// Visible position range [start, end) for a context of `context` positions.
    pub fn x_range(&self, context: usize) -> (f64, f64) {
        let n = context.max(1) as f64;
        match self.zoom {
            None => (0.0, n),
            Some((s, span)) => {
                let span = span.clamp(MIN_SPAN.min(n), n.max(MIN_SPAN));
                let s = s.clamp(0.0, (n - span).max(0.0));
                (s, s + span)
            }
        }
    }

    /// Zooms by `factor` (< 1 zooms in) keeping position `at` under the cursor.
    pub fn zoom_by(&mut self, factor: f64, at: f64, context: usize) {
        let (s, e) = self.x_range(context);
        let span = ((e - s) * factor).clamp(MIN_SPAN, (context.max(1) as f64).max(MIN_SPAN));
        let t = if e > s { (at - s) / (e - s) } else { 0.5 };
        self.zoom = Some((at - t * span, span));
        let (s, e) = self.x_range(context);
        self.zoom = if e - s >= context as f64 { None } else { Some((s, e - s)) };
    }

    /// Pans by `fraction` of the visible span.
    pub fn pan(&mut self, fraction: f64, context: usize) {
        if let Some((s, span)) = self.zoom {
            self.zoom = Some((s + fraction * span, span));
            let (s, e) = self.x_range(context);
            self.zoom = Some((s, e - s));
        }
    }
}

/// One value byte per cell: 0 unselected, 1..=255 selected with brightness (byte-1)/254.
pub fn encode(v: f32) -> u8 {
    1 + (v.clamp(0.0, 1.0) * 254.0).round() as u8
}

/// Brightness values of one selection under `mode`, in the selection's order.
pub fn values(sel: &LayerSelection, mode: ColourMode) -> Vec<f32> {
    let n = sel.positions.len();
    match mode {
        ColourMode::Binary => vec![1.0; n],
        ColourMode::Rank => (0..n).map(|i| if n > 1 { 1.0 - i as f32 / (n - 1) as f32 } else { 1.0 }).collect(),
        ColourMode::Score => {
            let finite = sel.scores.iter().copied().filter(|s| s.is_finite());
            let (lo, hi) = finite.fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), s| (a.min(s), b.max(s)));
            sel.scores.iter().map(|&s| if !s.is_finite() { 0.0 } else if hi > lo { (s - lo) / (hi - lo) } else { 1.0 }).collect()
        }
    }
}

/// Writes a selection into a dense row of value bytes (positions outside the row are skipped).
pub fn fill_row(row: &mut [u8], sel: Option<&LayerSelection>, mode: ColourMode) {
    row.fill(0);
    if let Some(sel) = sel {
        for (&p, v) in sel.positions.iter().zip(values(sel, mode)) {
            if p >= 0 && (p as usize) < row.len() {
                row[p as usize] = row[p as usize].max(encode(v));
            }
        }
    }
}

/// What the cursor points at.
#[derive(Clone, Debug, PartialEq)]
pub struct HoverInfo {
    pub position: usize,
    pub text: Option<String>,
    /// The row's layer and query position (token), when over the heatmap.
    pub row: Option<(usize, usize)>,
    /// Score and rank of `position` in that row's selection.
    pub score: Option<(f32, usize)>,
    /// Layers that selected `position` for the newest token.
    pub layers: Vec<usize>,
    pub layers_total: usize,
}

/// Recent frames and running counts.
pub struct Heatmap {
    layers: Vec<usize>,
    history: VecDeque<Arc<TokenFrame>>,
    history_cap: usize,
    tokens: usize,
    context: usize,
    freq_window: usize,
    /// Per position: selections over the last `freq_window` tokens, all layers.
    freq: Vec<u32>,
    texts: Vec<Option<String>>,
    pub figures: Vec<LayerFigures>,
    pub done: bool,
    version: u64,
}

impl Heatmap {
    /// Keeps the last `history` tokens (layer focus scrolls through them) and counts
    /// selections over the last `freq_window` tokens.
    pub fn new(history: usize, freq_window: usize) -> Self {
        Heatmap {
            layers: Vec::new(),
            history: VecDeque::new(),
            history_cap: history.max(1),
            tokens: 0,
            context: 0,
            freq_window: freq_window.clamp(1, history.max(1)),
            freq: Vec::new(),
            texts: Vec::new(),
            figures: Vec::new(),
            done: false,
            version: 0,
        }
    }

    fn count(&mut self, frame: &TokenFrame, add: bool) {
        for l in &frame.layers {
            for &p in &l.positions {
                if p >= 0 && (p as usize) < self.freq.len() {
                    let c = &mut self.freq[p as usize];
                    *c = if add { *c + 1 } else { c.saturating_sub(1) };
                }
            }
        }
    }

    pub fn push(&mut self, frame: Arc<TokenFrame>) {
        for l in &frame.layers {
            if let Err(i) = self.layers.binary_search(&l.layer) {
                self.layers.insert(i, l.layer);
            }
        }
        let max_sel = frame.layers.iter().flat_map(|l| l.positions.iter()).copied().max().unwrap_or(0).max(0) as usize;
        self.context = self.context.max(frame.position + 1).max(max_sel + 1);
        if self.freq.len() < self.context {
            self.freq.resize(self.context, 0);
            self.texts.resize(self.context, None);
        }
        if !frame.text.is_empty() {
            self.texts[frame.position] = Some(frame.text.clone());
        }
        self.count(&frame, true);
        if self.history.len() >= self.freq_window {
            let old = self.history[self.history.len() - self.freq_window].clone();
            self.count(&old, false);
        }
        if self.history.len() == self.history_cap {
            self.history.pop_front();
        }
        self.history.push_back(frame);
        self.tokens += 1;
        self.version += 1;
    }

    pub fn set_figures(&mut self, figures: Vec<LayerFigures>) {
        self.figures = figures;
        self.version += 1;
    }

    /// Global layers seen so far, ascending: the rows of the layers view.
    pub fn layers(&self) -> &[usize] {
        &self.layers
    }
    /// Frames received so far.
    pub fn tokens(&self) -> usize {
        self.tokens
    }
    /// Positions seen so far (max position + 1).
    pub fn context(&self) -> usize {
        self.context
    }
    pub fn history_cap(&self) -> usize {
        self.history_cap
    }
    pub fn freq_window(&self) -> usize {
        self.freq_window
    }
    /// Changes on every update (the renderer re-uploads when it moves).
    pub fn version(&self) -> u64 {
        self.version
    }
    pub fn newest(&self) -> Option<&Arc<TokenFrame>> {
        self.history.back()
    }
    /// Frame of token number `t` (0-based arrival order) if still in the history.
    pub fn frame(&self, t: usize) -> Option<&Arc<TokenFrame>> {
        let first = self.tokens - self.history.len();
        t.checked_sub(first).and_then(|i| self.history.get(i))
    }
    /// Token numbers still in the history: [first, tokens).
    pub fn history_range(&self) -> (usize, usize) {
        (self.tokens - self.history.len(), self.tokens)
    }
    pub fn text(&self, position: usize) -> Option<&str> {
        self.texts.get(position).and_then(|t| t.as_deref())
    }

    /// One frame's selection in the layer of row `layer_row`.
    pub fn selection<'a>(&self, frame: &'a TokenFrame, layer_row: usize) -> Option<&'a LayerSelection> {
        let layer = *self.layers.get(layer_row)?;
        frame.layers.iter().find(|l| l.layer == layer)
    }

    /// Per-position selection frequency over the recent tokens, 0..=255 relative to the
    /// most selected position: all layers in the layers view, the focused layer otherwise.
    pub fn strip(&self, mode: ViewMode, out: &mut [u8]) {
        out.fill(0);
        let counts: Vec<u32> = match mode {
            ViewMode::Layers => self.freq.clone(),
            ViewMode::Focus(r) => {
                let mut c = vec![0u32; self.context];
                for f in self.history.iter().rev().take(self.freq_window) {
                    if let Some(s) = self.selection(f, r) {
                        for &p in &s.positions {
                            if p >= 0 && (p as usize) < c.len() {
                                c[p as usize] += 1;
                            }
                        }
                    }
                }
                c
            }
        };
        let max = counts.iter().copied().max().unwrap_or(0);
        if max == 0 {
            return;
        }
        for (o, &c) in out.iter_mut().zip(&counts) {
            if c > 0 {
                *o = encode(c as f32 / max as f32);
            }
        }
    }

    /// Rows visible in focus mode for `fit` rows of room: token numbers [first, last].
    pub fn focus_rows(&self, fit: usize, scroll: usize) -> (usize, usize) {
        let (h0, h1) = self.history_range();
        if h1 == h0 {
            return (0, 0);
        }
        let last = h1 - 1 - scroll.min(h1 - 1 - h0);
        let n = fit.max(1).min(last + 1 - h0);
        (last + 1 - n, n)
    }

    /// Hover details for `position`, in row `row` of the current view (None: the strip).
    pub fn hover(&self, view: &ViewState, position: usize, row_token: Option<(usize, usize)>, text: Option<&crate::TokenText>) -> HoverInfo {
        let own = self.text(position).map(str::to_string);
        let text = own.or_else(|| text.and_then(|f| f(position)));
        let newest = self.newest();
        let layers: Vec<usize> = newest
            .map(|f| f.layers.iter().filter(|l| l.positions.contains(&(position as i32))).map(|l| l.layer).collect())
            .unwrap_or_default();
        let mut layers = layers;
        layers.sort_unstable();
        let mut info = HoverInfo { position, text, row: None, score: None, layers, layers_total: self.layers.len() };
        if let Some((layer_row, token)) = row_token {
            let frame = match view.mode {
                ViewMode::Layers => newest,
                ViewMode::Focus(_) => self.frame(token),
            };
            if let (Some(f), Some(&layer)) = (frame, self.layers.get(layer_row)) {
                info.row = Some((layer, f.position));
                if let Some(s) = self.selection(f, layer_row) {
                    info.score = s.positions.iter().position(|&p| p == position as i32).map(|i| (s.scores.get(i).copied().unwrap_or(f32::NAN), i));
                }
            }
        }
        info
    }
}
