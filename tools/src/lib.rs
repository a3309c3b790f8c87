//! Shared code of the uct-rs command-line tools. Each binary links the
//! built-in components with `uct_builtins::link()` at the top of `main`.

pub mod ceiling;
pub mod info;
pub mod perf;
pub mod plot;
pub mod scale;
pub mod text;
pub mod transfer_bench;
