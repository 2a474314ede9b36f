//! What the keys do, apart from the window (so it can be tested without a display).

use crate::frame::Control;
use crate::heatmap::{Heatmap, ViewMode, ViewState};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    TogglePause,
    Step,
    SwitchView,
    NextLayer,
    PrevLayer,
    Colour,
    Figures,
    Help,
    ZoomIn,
    ZoomOut,
    PanLeft,
    PanRight,
    ResetZoom,
    ScrollBack,
    ScrollForward,
    Follow,
    Quit,
}

/// Applies `a` to the view; returns the message for the generating thread, if any.
/// `at`: the position under the cursor (zoom centre), if any.
pub fn apply(view: &mut ViewState, hm: &Heatmap, a: Action, at: Option<f64>) -> Option<Control> {
    let ctx = hm.context();
    let n_layers = hm.layers().len().max(1);
    let (x0, x1) = view.x_range(ctx);
    let centre = at.unwrap_or((x0 + x1) / 2.0);
    match a {
        Action::TogglePause => {
            view.paused = !view.paused;
            return Some(if view.paused { Control::Pause } else { Control::Resume });
        }
        Action::Step => {
            view.paused = true;
            return Some(Control::Step);
        }
        Action::Quit => return Some(Control::Stop),
        Action::SwitchView => {
            view.mode = match view.mode {
                ViewMode::Layers => ViewMode::Focus(0),
                ViewMode::Focus(_) => ViewMode::Layers,
            };
            view.scroll = 0;
        }
        Action::NextLayer | Action::PrevLayer => {
            if let ViewMode::Focus(l) = view.mode {
                let d = if a == Action::NextLayer { 1 } else { n_layers - 1 };
                view.mode = ViewMode::Focus((l + d) % n_layers);
            }
        }
        Action::Colour => view.colour = view.colour.next(),
        Action::Figures => view.figures = !view.figures,
        Action::Help => view.help = !view.help,
        Action::ZoomIn => view.zoom_by(0.5, centre, ctx),
        Action::ZoomOut => view.zoom_by(2.0, centre, ctx),
        Action::PanLeft => view.pan(-0.25, ctx),
        Action::PanRight => view.pan(0.25, ctx),
        Action::ResetZoom => view.zoom = None,
        Action::ScrollBack => {
            let (h0, h1) = hm.history_range();
            view.scroll = (view.scroll + 16).min((h1 - h0).saturating_sub(1));
        }
        Action::ScrollForward => view.scroll = view.scroll.saturating_sub(16),
        Action::Follow => view.scroll = 0,
    }
    None
}
