//! Logging: `log` records, printed by `env_logger` at `UCT_LOG_LEVEL`.
//! Loaded modules log through the host's logger (see `module_abi`).

/// Installs the logger at the level `UCT_LOG_LEVEL` names (default warn).
/// Calling it again, or after the application set its own logger, is a
/// no-op.
pub fn init() {
    let level = std::env::var("UCT_LOG_LEVEL")
        .ok()
        .and_then(|v| v.parse::<log::LevelFilter>().ok())
        .unwrap_or(log::LevelFilter::Warn);
    let _ = env_logger::Builder::new()
        .filter_level(level)
        .format_timestamp(None)
        .target(env_logger::Target::Stderr)
        .try_init();
}
