//! Hierarchical timer wheel (being written).
