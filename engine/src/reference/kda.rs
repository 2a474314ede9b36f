//! CPU reference of the kda ops (being written: see the open issue).
