//! `UCT_NIC_AFFINITY`: the user's NIC order for a device, which overrides
//! the ranking. A rule that names a device or a NIC that is not here is an
//! error at start, never a silent fallback.

use std::collections::HashSet;

use crate::error::TopoError;

/// The environment variable holding the rules.
pub const AFFINITY_VAR: &str = "UCT_NIC_AFFINITY";

/// Parsed `UCT_NIC_AFFINITY` rules: `DEVICE=NIC[,NIC...]` separated by
/// `;`, where DEVICE is an accelerator name (`gaudi0`, `cuda1`), a PCI bus
/// id, `host` or `numa:N`.
///
/// ```
/// use uct_topo::Affinity;
/// let a = Affinity::parse("gaudi0=mlx5_0,mlx5_1; gaudi1=mlx5_2").unwrap();
/// assert_eq!(a.nics_for("gaudi0"), Some(&["mlx5_0".to_string(), "mlx5_1".to_string()][..]));
/// assert!(Affinity::parse("gaudi0").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Affinity {
    rules: Vec<Rule>,
}

/// One rule: a device and its NICs, best first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// The device, as written.
    pub device: String,
    /// Its NICs, as written, best first.
    pub nics: Vec<String>,
    /// The rule's text, for messages.
    pub text: String,
}

impl Affinity {
    /// Reads `UCT_NIC_AFFINITY`: Ok(None) when unset or empty, an error
    /// naming the rule when one is malformed.
    ///
    /// ```
    /// // Unset here: no override.
    /// # std::env::remove_var("UCT_NIC_AFFINITY");
    /// assert!(uct_topo::Affinity::from_env().unwrap().is_none());
    /// ```
    pub fn from_env() -> Result<Option<Affinity>, TopoError> {
        match std::env::var(AFFINITY_VAR) {
            Ok(v) if !v.trim().is_empty() => Affinity::parse(&v).map(Some),
            Ok(_) => Ok(None),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(v)) => Err(TopoError::AffinitySyntax {
                rule: shown(&v.to_string_lossy()),
                reason: "it is not UTF-8".into(),
            }),
        }
    }

    /// Parses rules as `UCT_NIC_AFFINITY` holds them. A trailing `;` is
    /// allowed; anything else malformed is an error naming the rule.
    pub fn parse(text: &str) -> Result<Affinity, TopoError> {
        if text.len() > MAX_TEXT {
            return Err(bad(
                text,
                &format!(
                    "the rules are {} bytes, more than the {MAX_TEXT} read (a host has tens of devices)",
                    text.len()
                ),
            ));
        }
        if text.trim().is_empty() {
            return Err(bad(
                text,
                "there is no rule; unset UCT_NIC_AFFINITY for the ranking by topology",
            ));
        }
        let mut rules: Vec<Rule> = Vec::new();
        let mut devices = HashSet::new();
        let parts: Vec<&str> = text.split(';').map(str::trim).collect();
        let last = parts.len() - 1;
        for (i, part) in parts.iter().enumerate() {
            if part.is_empty() {
                if i == last && i > 0 {
                    continue;
                }
                return Err(bad(part, "an empty rule (two ';' in a row, or ';' first)"));
            }
            let Some((device, nics)) = part.split_once('=') else {
                return Err(bad(part, "no '=' between the device and its NICs"));
            };
            let device = device.trim();
            if device.is_empty() {
                return Err(bad(part, "no device before '='"));
            }
            if nics.contains('=') {
                return Err(bad(part, "more than one '=' (rules are separated by ';')"));
            }
            let nics: Vec<String> = nics.split(',').map(|n| n.trim().to_string()).collect();
            if nics.iter().any(|n| n.is_empty()) {
                return Err(bad(part, "an empty NIC name (nothing after '=', or ',,')"));
            }
            // Sets, not pairwise scans: a long value must not take minutes.
            let mut seen = HashSet::new();
            if let Some(d) = nics.iter().find(|n| !seen.insert(n.as_str())) {
                return Err(bad(part, &format!("NIC {d} is listed twice")));
            }
            if !devices.insert(device.to_string()) {
                return Err(bad(part, &format!("a second rule for {device}")));
            }
            rules.push(Rule {
                device: device.to_string(),
                nics,
                text: part.to_string(),
            });
        }
        Ok(Affinity { rules })
    }

    /// The NICs a rule gives `device`, best first; None without a rule.
    pub fn nics_for(&self, device: &str) -> Option<&[String]> {
        self.rules
            .iter()
            .find(|r| r.device == device)
            .map(|r| r.nics.as_slice())
    }

    /// Every rule, in the order written.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }
}

/// The longest `UCT_NIC_AFFINITY` read: tens of devices with a few NICs
/// each take a few hundred bytes.
const MAX_TEXT: usize = 64 * 1024;

fn bad(rule: &str, reason: &str) -> TopoError {
    TopoError::AffinitySyntax {
        rule: shown(rule),
        reason: reason.to_string(),
    }
}

/// A rule as messages quote it: cut short past 200 characters, so that a
/// runaway value does not flood the log.
pub(crate) fn shown(rule: &str) -> String {
    const SHOWN: usize = 200;
    match rule.char_indices().nth(SHOWN) {
        Some((at, _)) => format!("{}... ({} bytes)", &rule[..at], rule.len()),
        None => rule.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(text: &str) -> String {
        match Affinity::parse(text) {
            Err(TopoError::AffinitySyntax { reason, .. }) => reason,
            other => panic!("{text:?}: expected a syntax error, got {other:?}"),
        }
    }

    #[test]
    fn rules_parse_with_spaces_and_a_trailing_semicolon() {
        let a = Affinity::parse(" gaudi0 = mlx5_0 , mlx5_1 ;gaudi1=mlx5_2;").unwrap();
        assert_eq!(a.rules().len(), 2);
        assert_eq!(a.nics_for("gaudi0").unwrap(), ["mlx5_0", "mlx5_1"]);
        assert_eq!(a.nics_for("gaudi1").unwrap(), ["mlx5_2"]);
        assert_eq!(a.nics_for("gaudi2"), None);
        let a = Affinity::parse("numa:1=eth0;0000:1a:00.0=mlx5_3").unwrap();
        assert_eq!(a.nics_for("numa:1").unwrap(), ["eth0"]);
        assert_eq!(a.nics_for("0000:1a:00.0").unwrap(), ["mlx5_3"]);
    }

    #[test]
    fn malformed_rules_are_errors_that_name_the_rule() {
        assert!(reason("gaudi0").contains("no '='"));
        assert!(reason("=mlx5_0").contains("no device"));
        assert!(reason("gaudi0=").contains("empty NIC"));
        assert!(reason("gaudi0=mlx5_0,,mlx5_1").contains("empty NIC"));
        assert!(reason("gaudi0=mlx5_0;;gaudi1=mlx5_1").contains("empty rule"));
        assert!(reason(";gaudi0=mlx5_0").contains("empty rule"));
        assert!(reason("gaudi0=mlx5_0=mlx5_1").contains("more than one '='"));
        assert!(reason("gaudi0=mlx5_0,mlx5_0").contains("listed twice"));
        assert!(reason("gaudi0=mlx5_0;gaudi0=mlx5_1").contains("second rule"));
        let msg = Affinity::parse("gaudi0;gaudi1=mlx5_1")
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("\"gaudi0\"") && msg.contains("UCT_NIC_AFFINITY"),
            "{msg}"
        );
    }
}
