//! Where everything goes in a frame of a given size, and the pixel <-> (row, position)
//! mapping the shader uses (kept identical here for hover and tests).

use crate::font::{CELL_H, CELL_W};
use crate::heatmap::{Heatmap, ViewMode, ViewState};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Rect {
    pub x: u32,
    pub y: u32,
    pub w: u32,
    pub h: u32,
}

impl Rect {
    pub fn contains(&self, x: f32, y: f32) -> bool {
        x >= self.x as f32 && y >= self.y as f32 && x < (self.x + self.w) as f32 && y < (self.y + self.h) as f32
    }
}

/// Pixels of one token row in layer focus.
pub const FOCUS_ROW_PX: u32 = 4;

#[derive(Clone, Debug, PartialEq)]
pub struct Layout {
    pub width: u32,
    pub height: u32,
    /// Font scale (1 or 2): characters are 6*scale x 10*scale pixels.
    pub scale: u32,
    pub heat: Rect,
    pub strip: Rect,
    /// Tick labels under the strip.
    pub axis_y: u32,
    pub legend_y: u32,
    pub hover_y: u32,
    pub figures: Option<Rect>,
    /// Visible rows; in layer focus rows are token numbers first_token.. .
    pub rows: usize,
    pub first_token: usize,
    /// Visible positions [x0, x1).
    pub x0: f64,
    pub x1: f64,
}

impl Layout {
    pub fn new(width: u32, height: u32, hm: &Heatmap, view: &ViewState) -> Layout {
        let scale = if width >= 900 && height >= 520 { 2 } else { 1 };
        let (cw, lh) = (CELL_W * scale, CELL_H * scale);
        let left = 7 * cw + 6;
        let figures_on = view.figures && view.mode == ViewMode::Layers;
        let right = if figures_on { 34 * cw + 8 } else { 8 };
        let top = 4 + 2 * lh + 4;
        let strip_h = lh;
        let bottom = 3 + strip_h + 3 + lh + 6 + 2 * lh + 4 + 2 * lh + 2;
        let hw = width.saturating_sub(left + right).max(1);
        let hh = height.saturating_sub(top + bottom).max(1);
        let heat = Rect { x: left, y: top, w: hw, h: hh };
        let strip = Rect { x: left, y: top + hh + 3, w: hw, h: strip_h };
        let axis_y = strip.y + strip_h + 3;
        let legend_y = axis_y + lh + 6;
        let hover_y = legend_y + 2 * lh + 4;
        let figures = figures_on.then(|| Rect { x: left + hw + 8, y: top, w: right - 8, h: hh });
        let (rows, first_token) = match view.mode {
            ViewMode::Layers => (hm.layers().len(), 0),
            ViewMode::Focus(_) => {
                let fit = ((hh / FOCUS_ROW_PX) as usize).min(hm.history_cap());
                let (first, n) = hm.focus_rows(fit, view.scroll);
                (n, first)
            }
        };
        let (x0, x1) = view.x_range(hm.context());
        Layout { width, height, scale, heat, strip, axis_y, legend_y, hover_y, figures, rows, first_token, x0, x1 }
    }

    pub fn char_w(&self) -> u32 {
        CELL_W * self.scale
    }
    pub fn line_h(&self) -> u32 {
        CELL_H * self.scale
    }

    /// Row under pixel row `y` (pixel centre y + 0.5, as the shader computes it).
    pub fn row_at(&self, y: f32) -> Option<usize> {
        let h = self.heat;
        if self.rows == 0 || y < h.y as f32 || y >= (h.y + h.h) as f32 {
            return None;
        }
        let py = y.floor() + 0.5;
        Some((((py - h.y as f32) * self.rows as f32 / h.h as f32) as usize).min(self.rows - 1))
    }

    /// First position shown in pixel column `x` (the shader shows the max over the bin).
    pub fn position_at(&self, x: f32) -> Option<usize> {
        let h = self.heat;
        if x < h.x as f32 || x >= (h.x + h.w) as f32 {
            return None;
        }
        let px = x.floor() as f64;
        let a = self.x0 + (px - h.x as f64) / h.w as f64 * (self.x1 - self.x0);
        Some(a.max(0.0).floor() as usize)
    }

    /// Pixel centre of the cell (row, position), for tests and markers.
    pub fn cell_center(&self, row: usize, position: usize) -> (u32, u32) {
        let h = self.heat;
        let x = h.x as f64 + (position as f64 + 0.5 - self.x0) / (self.x1 - self.x0) * h.w as f64;
        let y = h.y as f64 + (row as f64 + 0.5) * h.h as f64 / self.rows.max(1) as f64;
        (x as u32, y as u32)
    }

    /// Pixel column centre of a position (for the strip and the axis).
    pub fn x_of(&self, position: f64) -> f64 {
        self.heat.x as f64 + (position - self.x0) / (self.x1 - self.x0) * self.heat.w as f64
    }

    /// Row pixels are tall enough to leave a one-pixel gap between rows.
    pub fn row_gap(&self) -> bool {
        self.rows > 0 && self.heat.h as usize / self.rows >= 6
    }
}

/// A round tick step (1, 2, 5 x 10^n, at least 1) for at least `min_gap` positions apart.
pub fn tick_step(min_gap: f64) -> usize {
    let raw = min_gap.max(1.0);
    let e = 10f64.powf(raw.log10().floor());
    let m = [1.0, 2.0, 5.0, 10.0].into_iter().find(|m| m * e >= raw).unwrap_or(10.0);
    (m * e).round().max(1.0) as usize
}
