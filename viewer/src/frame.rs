//! The messages between the generating thread and the viewer (window or PNG exporter).

use std::sync::Arc;

/// One global layer's selection for one query token (positions in rank order).
#[derive(Clone, Debug, PartialEq)]
pub struct LayerSelection {
    /// Index of the layer in the model (0-based, as the engine reports it).
    pub layer: usize,
    pub positions: Vec<i32>,
    pub scores: Vec<f32>,
}

/// Everything the viewer learns about one query token: one message per token.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct TokenFrame {
    /// Absolute position of the query token.
    pub position: usize,
    /// Text of the token at `position` (may be empty when unknown).
    pub text: String,
    /// One entry per global layer that reported (any order).
    pub layers: Vec<LayerSelection>,
}

/// Per-layer omitted-mass figures of the DSA diagnostics (means over the tokens so far).
#[derive(Clone, Copy, Debug, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct LayerFigures {
    pub layer: usize,
    /// Mean attention mass the selection left out (epsilon).
    pub epsilon: f32,
    /// Mean relative error of the sparse output against dense attention.
    pub error: f32,
    /// Mean recall of the indexer against the true top-k.
    pub recall: f32,
}

/// Producer -> viewer.
#[derive(Clone, Debug)]
pub enum ViewerMsg {
    Frame(Arc<TokenFrame>),
    /// Replaces the figures panel's data.
    Figures(Vec<LayerFigures>),
    /// Generation ended (the window closes on it with `exit_when_done`).
    Done,
}

/// Viewer -> producer (keys in the window).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Control {
    Pause,
    Resume,
    /// Generate one more token, then stay paused.
    Step,
    /// The user closed the window or pressed Q: stop generating.
    Stop,
}

/// Text of the token at a position, supplied by the caller (prompt tokens have no frame text).
pub type TokenText = Arc<dyn Fn(usize) -> Option<String> + Send + Sync>;
