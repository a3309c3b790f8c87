//! Attacks on the posix transport.

use super::Attack;

/// The posix attacks, in the order the suite runs them.
pub fn attacks() -> Vec<Attack> {
    vec![]
}
