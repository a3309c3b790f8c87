//! Attacks on the cma transport.

use super::Attack;

/// The cma attacks, in the order the suite runs them.
pub fn attacks() -> Vec<Attack> {
    vec![]
}
