//! Attacks on the tcp transport.

use super::Attack;

/// The tcp attacks, in the order the suite runs them.
pub fn attacks() -> Vec<Attack> {
    vec![]
}
