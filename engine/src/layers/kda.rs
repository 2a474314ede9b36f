//! The kda layer (being written: see the open issue).
