//! Shared helpers of the uct-rs tools.
