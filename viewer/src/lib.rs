//! The selection viewer (issue 8): draws, per global layer, which cache positions the
//! lightning indexer selected for the token being generated. This crate is a skeleton
//! until the DSA selection sink exists; it only pins the dependencies the window needs.

/// Name shown in the window title once the viewer exists.
pub const WINDOW_TITLE: &str = "k31 selection viewer";
