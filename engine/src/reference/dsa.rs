//! CPU reference of the dsa ops (being written: see the open issue).
