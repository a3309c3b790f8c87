//! Shared code of the uct-rs command-line tools.

pub mod info;
pub mod text;
