//! The per-model scheduler: a sans-IO state machine implementing SPEC section 3.

pub mod tracker;
pub mod wheel;
