//! CLOCK session tracker (being written).
