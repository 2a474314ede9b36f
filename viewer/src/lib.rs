//! The selection viewer (issue 8): draws, per global layer, which cache positions the
//! lightning indexer selected for the token being generated.
//!
//! Data flow: the engine reports selections to a [`SelectionSink`](k31_engine::trace::SelectionSink);
//! [`FrameSink`] groups them into one [`TokenFrame`] per token and sends it on a channel to
//! the window ([`run_window`], main thread) and/or the PNG exporter ([`spawn_png_export`]);
//! [`TraceWriter`] writes the raw selections as JSON lines. Keys in the window come back to
//! the generating loop through [`GenControl`]. Both outputs share [`Renderer`]: a heatmap
//! model ([`Heatmap`] + [`ViewState`]) uploaded as small per-token rows and drawn by one
//! fragment shader, with text from an embedded bitmap font.

pub mod export;
pub mod font;
pub mod frame;
pub mod heatmap;
pub mod keys;
pub mod layout;
pub mod overlay;
pub mod palette;
pub mod render;
pub mod sink;
pub mod trace_file;
pub mod window;

use std::path::PathBuf;

pub use export::{ExportSummary, PngExportOptions, export_pngs, numbered, read_png, render_png, spawn_png_export, write_png};
pub use frame::{Control, LayerFigures, LayerSelection, TokenFrame, TokenText, ViewerMsg};
pub use heatmap::{ColourMode, Heatmap, ViewMode, ViewState};
pub use layout::Layout;
pub use render::Renderer;
pub use sink::{Flow, FrameSink, GenControl};
pub use trace_file::{Trace, TraceWriter, read_trace};
pub use window::{CloseReason, ViewerOptions, WindowSummary, run_window};

/// Title of the window.
pub const WINDOW_TITLE: &str = "k31 selection viewer";

#[derive(Debug, thiserror::Error)]
pub enum ViewerError {
    #[error("no GPU adapter for the viewer: {0}")]
    NoAdapter(String),
    #[error("viewer device: {0}")]
    Device(String),
    #[error("window surface: {0}")]
    Surface(String),
    #[error("cannot open a window: {0} (is DISPLAY or WAYLAND_DISPLAY set? try xvfb-run)")]
    EventLoop(String),
    #[error("{0}: {1}")]
    Io(PathBuf, std::io::Error),
    #[error("PNG: {0}")]
    Png(String),
    #[error("selection trace: {0}")]
    Trace(String),
    #[error("reading the rendered frame back: {0}")]
    Readback(String),
    #[error("viewer data too large: {0}")]
    TooLarge(String),
}
