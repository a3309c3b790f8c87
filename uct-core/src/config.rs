//! Configuration: typed tables of `UCT_*` environment variables (name,
//! default, documentation), allow-lists such as `UCT_TLS`, and warnings for
//! unknown variables with the closest known name.

use std::collections::BTreeMap;
use std::time::Duration;

/// Variables with this prefix belong to test harnesses (for example
/// `UCT_TEST_EXPECT`, the transports a test run requires) and are never
/// reported as unknown.
pub const TEST_PREFIX: &str = "UCT_TEST_";

/// Errors of the configuration layer.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum ConfigError {
    /// A value that does not parse as the variable's kind.
    #[error("{name}={value} is not valid: expected {expected}; `transport-info -c -f` documents every variable")]
    Invalid {
        /// The variable.
        name: String,
        /// The value found.
        value: String,
        /// What the kind accepts.
        expected: String,
    },
    /// A name no table declares.
    #[error("{0} is not a known configuration variable; `transport-info -c` lists them")]
    Unknown(String),
}

/// Type of a configuration value; values are checked against it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigKind {
    /// Any text.
    String,
    /// `y`/`yes`/`1`/`true`/`on` or `n`/`no`/`0`/`false`/`off`.
    Bool,
    /// `auto`, or one of [`ConfigKind::Bool`]'s words.
    AutoBool,
    /// Unsigned integer, or `auto`.
    Uint,
    /// Byte size with an optional suffix: `64k`, `4M`, `1G`.
    Size,
    /// Duration with a suffix: `500ms`, `10s`, `2m`.
    Duration,
    /// Comma-separated list; `all`, and `^` at the front to negate.
    AllowList,
    /// Colon-separated paths.
    PathList,
    /// One of error, warn, info, debug, trace.
    LogLevel,
}

impl ConfigKind {
    fn expected(self) -> &'static str {
        match self {
            ConfigKind::String | ConfigKind::PathList => "a string",
            ConfigKind::Bool => "y, n, yes, no, 1, 0, true, false, on or off",
            ConfigKind::AutoBool => "auto, y, n, yes, no, 1, 0, true, false, on or off",
            ConfigKind::Uint => "an unsigned integer or auto",
            ConfigKind::Size => "a size such as 4096, 64k, 4M or 1G",
            ConfigKind::Duration => "a duration such as 500ms, 10s or 2m",
            ConfigKind::AllowList => {
                "a comma-separated list, `all`, or `^` followed by names to exclude"
            }
            ConfigKind::LogLevel => "error, warn, info, debug or trace",
        }
    }

    fn validate(self, value: &str) -> bool {
        match self {
            ConfigKind::String | ConfigKind::PathList | ConfigKind::AllowList => true,
            ConfigKind::Bool => parse_bool(value).is_some(),
            ConfigKind::AutoBool => parse_auto_bool(value).is_some(),
            ConfigKind::Uint => value == "auto" || value.parse::<u64>().is_ok(),
            ConfigKind::Size => parse_size(value).is_some(),
            ConfigKind::Duration => parse_duration(value).is_some(),
            ConfigKind::LogLevel => value.parse::<log::LevelFilter>().is_ok(),
        }
    }
}

/// One variable of a table.
#[derive(Debug, Clone, Copy)]
pub struct ConfigVar {
    /// `UCT_...` name.
    pub name: &'static str,
    /// Value used when the environment does not set it.
    pub default: &'static str,
    /// How the value is parsed.
    pub kind: ConfigKind,
    /// What it does, for `transport-info -c -f`.
    pub doc: &'static str,
}

/// The variables of uct-core itself.
pub const CORE_CONFIG: &[ConfigVar] = &[
    ConfigVar {
        name: "UCT_TLS",
        default: "all",
        kind: ConfigKind::AllowList,
        doc: "Transports to use, comma-separated (self, posix, cma, tcp, rc, ...). `all` uses every one; a leading `^` uses all but the ones listed.",
    },
    ConfigVar {
        name: "UCT_NET_DEVICES",
        default: "all",
        kind: ConfigKind::AllowList,
        doc: "Network devices to use, comma-separated (eth0, mlx5_0:1, ...). `all` uses every one; a leading `^` excludes the ones listed.",
    },
    ConfigVar {
        name: "UCT_MODULE_DIR",
        default: "",
        kind: ConfigKind::PathList,
        doc: "Colon-separated folders searched first for loadable modules (libuct_<name>.so); then the executable's folder and <exe>/../lib/uct.",
    },
    ConfigVar {
        name: "UCT_MODULES",
        default: "all",
        kind: ConfigKind::AllowList,
        doc: "Loadable modules to load, comma-separated by name (ib, example, ...). `all` loads every one found; a leading `^` loads all but the ones listed.",
    },
    ConfigVar {
        name: "UCT_LOG_LEVEL",
        default: "warn",
        kind: ConfigKind::LogLevel,
        doc: "Logging threshold: error, warn, info, debug or trace. Modules log through the host's logger.",
    },
    ConfigVar {
        name: "UCT_SPIN_PAUSE",
        default: "auto",
        kind: ConfigKind::AutoBool,
        doc: "Whether busy waits give the CPU's spin hint (PAUSE on x86) on a turn that found nothing: auto keeps it where one costs at most 80 ns (measured once per process; an emulator such as QEMU's TCG makes it dear), yes or no forces it.",
    },
    ConfigVar {
        name: "UCT_TRANSFER_RAILS",
        default: "1",
        kind: ConfigKind::Uint,
        doc: "Rails of a transfer-API Transport built for a named transport (tcp, rc): that many of its devices, each with its own connection; large writes are striped over them. Builder::rails and Builder::devices override it.",
    },
    ConfigVar {
        name: "UCT_TRANSFER_STRIPE_MIN",
        default: "512K",
        kind: ConfigKind::Size,
        doc: "Smallest transfer-API write split over the rails of a multi-rail Transport; smaller writes go whole on one rail.",
    },
    ConfigVar {
        name: "UCT_BOOTSTRAP_TIMEOUT",
        default: "30s",
        kind: ConfigKind::Duration,
        doc: "How long the out-of-band bootstrap channel waits to connect and for each message before giving up.",
    },
    ConfigVar {
        name: "UCT_SYSFS_ROOT",
        default: "/",
        kind: ConfigKind::String,
        doc: "Root of the tree the PCIe topology is read from (<root>/sys/bus/pci, ...). Point it at a saved tree such as topo/fixtures/dgx-a800 to see how NICs would be chosen there.",
    },
    ConfigVar {
        name: "UCT_NIC_AFFINITY",
        default: "",
        kind: ConfigKind::String,
        doc: "NIC order per device, overriding the topology: DEVICE=NIC[,NIC...] separated by `;`, DEVICE an accelerator (gaudi0, cuda1), a PCI bus id, `host` or `numa:N`. Read by transport-info --topo and by the build of a multi-rail transfer-API Transport without explicit devices, which a rule naming a device or NIC that is not there fails.",
    },
];

/// Where a value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueSource {
    /// Nobody set it; the table's default.
    Default,
    /// Set in the process environment.
    Environment,
}

/// A variable with its value in force.
#[derive(Debug, Clone)]
pub struct ConfigEntry {
    /// The variable's declaration.
    pub var: ConfigVar,
    /// Which table it belongs to (`core`, or a component's name).
    pub owner: String,
    /// The value in force.
    pub value: String,
    /// Where the value came from.
    pub source: ValueSource,
}

/// Values of every known variable, read from the environment once.
#[derive(Debug, Clone, Default)]
pub struct Config {
    entries: BTreeMap<String, ConfigEntry>,
}

impl Config {
    /// Reads the core table and `tables` (owner, variables) from the
    /// environment. An invalid value is an error naming the variable.
    pub fn from_env(tables: &[(&str, &'static [ConfigVar])]) -> Result<Config, ConfigError> {
        Self::from_lookup(tables, |n| std::env::var(n).ok())
    }

    /// Like [`from_env`](Self::from_env) with another source of values.
    pub fn from_lookup(
        tables: &[(&str, &'static [ConfigVar])],
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        Self::build(tables, lookup, false).map(|(c, _)| c)
    }

    /// Like [`from_env`](Self::from_env), but an invalid value falls back to
    /// the default and its error is returned beside the configuration.
    pub fn from_env_lenient(tables: &[(&str, &'static [ConfigVar])]) -> (Config, Vec<ConfigError>) {
        match Self::build(tables, |n| std::env::var(n).ok(), true) {
            Ok(r) => r,
            // Unreachable in lenient mode; an empty table set is still usable.
            Err(e) => (Config::default(), vec![e]),
        }
    }

    fn build(
        tables: &[(&str, &'static [ConfigVar])],
        lookup: impl Fn(&str) -> Option<String>,
        lenient: bool,
    ) -> Result<(Config, Vec<ConfigError>), ConfigError> {
        let mut errors = Vec::new();
        let mut entries = BTreeMap::new();
        let all = std::iter::once(("core", CORE_CONFIG)).chain(tables.iter().copied());
        for (owner, vars) in all {
            for var in vars {
                let (mut value, mut source) = match lookup(var.name) {
                    Some(v) => (v, ValueSource::Environment),
                    None => (var.default.to_string(), ValueSource::Default),
                };
                if !var.kind.validate(&value) {
                    let err = ConfigError::Invalid {
                        name: var.name.into(),
                        value,
                        expected: var.kind.expected().into(),
                    };
                    if !lenient {
                        return Err(err);
                    }
                    errors.push(err);
                    value = var.default.to_string();
                    source = ValueSource::Default;
                }
                entries.insert(
                    var.name.to_string(),
                    ConfigEntry {
                        var: *var,
                        owner: owner.to_string(),
                        value,
                        source,
                    },
                );
            }
        }
        Ok((Config { entries }, errors))
    }

    /// Every variable, sorted by name.
    pub fn entries(&self) -> impl Iterator<Item = &ConfigEntry> {
        self.entries.values()
    }

    fn entry(&self, name: &str) -> Result<&ConfigEntry, ConfigError> {
        self.entries
            .get(name)
            .ok_or_else(|| ConfigError::Unknown(name.into()))
    }

    fn invalid(e: &ConfigEntry) -> ConfigError {
        ConfigError::Invalid {
            name: e.var.name.into(),
            value: e.value.clone(),
            expected: e.var.kind.expected().into(),
        }
    }

    /// The value of `name` as text.
    pub fn get_str(&self, name: &str) -> Result<&str, ConfigError> {
        Ok(&self.entry(name)?.value)
    }

    /// The value of `name` as a boolean.
    pub fn get_bool(&self, name: &str) -> Result<bool, ConfigError> {
        let e = self.entry(name)?;
        parse_bool(&e.value).ok_or_else(|| Self::invalid(e))
    }

    /// `None` for `auto`.
    pub fn get_uint(&self, name: &str) -> Result<Option<u64>, ConfigError> {
        let e = self.entry(name)?;
        if e.value == "auto" {
            return Ok(None);
        }
        e.value.parse().map(Some).map_err(|_| Self::invalid(e))
    }

    /// The value of `name` in bytes.
    pub fn get_size(&self, name: &str) -> Result<u64, ConfigError> {
        let e = self.entry(name)?;
        parse_size(&e.value).ok_or_else(|| Self::invalid(e))
    }

    /// The value of `name` as a duration.
    pub fn get_duration(&self, name: &str) -> Result<Duration, ConfigError> {
        let e = self.entry(name)?;
        parse_duration(&e.value).ok_or_else(|| Self::invalid(e))
    }

    /// The value of `name` as an allow-list.
    pub fn get_allow_list(&self, name: &str) -> Result<AllowList, ConfigError> {
        Ok(AllowList::parse(&self.entry(name)?.value))
    }

    /// The value of `name` as a colon-separated list of paths (empty entries dropped).
    pub fn get_paths(&self, name: &str) -> Result<Vec<std::path::PathBuf>, ConfigError> {
        Ok(self
            .entry(name)?
            .value
            .split(':')
            .filter(|s| !s.is_empty())
            .map(std::path::PathBuf::from)
            .collect())
    }

    /// `UCT_*` variables in the environment that no table declares, each
    /// with the closest known name. Variables whose prefix belongs to a
    /// module that was found but not loaded (`UCT_IB_*` when the ib module is
    /// absent) are not reported: their table is unknown, not wrong.
    pub fn unknown_env_vars(&self, foreign_prefixes: &[String]) -> Vec<UnknownVar> {
        let names: Vec<String> = std::env::vars_os()
            .filter_map(|(k, _)| k.into_string().ok())
            .collect();
        self.unknown_vars_in(names.iter().map(String::as_str), foreign_prefixes)
    }

    /// As [`unknown_env_vars`](Self::unknown_env_vars) over given names.
    pub fn unknown_vars_in<'a>(
        &self,
        names: impl Iterator<Item = &'a str>,
        foreign_prefixes: &[String],
    ) -> Vec<UnknownVar> {
        let mut out: Vec<UnknownVar> = names
            .filter(|n| n.starts_with("UCT_") && !self.entries.contains_key(*n))
            // Reserved for test harnesses (UCT_TEST_EXPECT): not ours to read.
            .filter(|n| !n.starts_with(TEST_PREFIX))
            .filter(|n| !foreign_prefixes.iter().any(|p| n.starts_with(p.as_str())))
            .map(|n| UnknownVar {
                name: n.to_string(),
                suggestion: self.closest(n),
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    fn closest(&self, name: &str) -> Option<String> {
        self.entries
            .keys()
            .map(|k| (strsim::damerau_levenshtein(name, k), k))
            .filter(|(d, k)| *d <= 3.max(k.len() / 4))
            .min_by_key(|(d, _)| *d)
            .map(|(_, k)| k.clone())
    }
}

/// A `UCT_*` variable nobody declared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownVar {
    /// Its name as found in the environment.
    pub name: String,
    /// The closest known name, if one is close.
    pub suggestion: Option<String>,
}

impl std::fmt::Display for UnknownVar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "unknown configuration variable {}", self.name)?;
        match &self.suggestion {
            Some(s) => write!(f, "; did you mean {s}?"),
            None => write!(f, "; `transport-info -c` lists the known ones"),
        }
    }
}

/// A list such as `UCT_TLS`: `all`, names, or `^` and names to exclude.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowList {
    negate: bool,
    names: Vec<String>,
}

impl AllowList {
    /// Parses `all`, `a,b` or `^a,b`; an empty list allows everything.
    pub fn parse(s: &str) -> AllowList {
        let s = s.trim();
        let (negate, rest) = match s.strip_prefix('^') {
            Some(r) => (true, r),
            None => (false, s),
        };
        let names: Vec<String> = rest
            .split(',')
            .map(|n| n.trim().to_string())
            .filter(|n| !n.is_empty())
            .collect();
        if !negate && (names.is_empty() || names.iter().any(|n| n == "all")) {
            return AllowList::all();
        }
        AllowList { negate, names }
    }

    /// Allows everything.
    pub fn all() -> AllowList {
        AllowList {
            negate: true,
            names: Vec::new(),
        }
    }

    /// Whether `name` is allowed.
    pub fn allows(&self, name: &str) -> bool {
        self.names.iter().any(|n| n == name) != self.negate
    }

    /// The names listed (to exclude when negated).
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Whether the list names what to exclude (`^`).
    pub fn is_negated(&self) -> bool {
        self.negate
    }
}

/// A setting that is `auto` (or empty) or forced either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AutoBool {
    /// Decided by the code (a measurement, a default).
    Auto,
    /// Forced on.
    Yes,
    /// Forced off.
    No,
}

/// `auto` or empty, else a [`parse_bool`] word; case and surrounding
/// blanks do not matter.
pub fn parse_auto_bool(s: &str) -> Option<AutoBool> {
    let s = s.trim();
    if s.is_empty() || s.eq_ignore_ascii_case("auto") {
        return Some(AutoBool::Auto);
    }
    parse_bool(s).map(|b| if b { AutoBool::Yes } else { AutoBool::No })
}

/// Parses a boolean value; `None` if it is not one.
pub fn parse_bool(s: &str) -> Option<bool> {
    match s.to_ascii_lowercase().as_str() {
        "y" | "yes" | "1" | "true" | "on" => Some(true),
        "n" | "no" | "0" | "false" | "off" => Some(false),
        _ => None,
    }
}

/// Parses a byte size with an optional suffix (`64k`, `4M`, `1G`); `None` on overflow or a bad suffix.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().ok()?;
    let mult: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return None,
    };
    n.checked_mul(mult)
}

/// Parses a duration with a unit (`ns`, `us`, `ms`, `s`, `m`); `None` if it has none.
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit() && c != '.')?;
    let (num, unit) = s.split_at(split);
    let n: f64 = num.parse().ok()?;
    let secs = match unit {
        "ns" => n / 1e9,
        "us" => n / 1e6,
        "ms" => n / 1e3,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return None,
    };
    Duration::try_from_secs_f64(secs).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_list_semantics() {
        let a = AllowList::parse("all");
        assert!(a.allows("tcp"));
        let a = AllowList::parse("tcp,posix");
        assert!(a.allows("tcp") && a.allows("posix") && !a.allows("self"));
        let a = AllowList::parse("^tcp");
        assert!(!a.allows("tcp") && a.allows("self"));
        assert!(AllowList::parse("").allows("x"));
    }

    #[test]
    fn parses_sizes_and_durations() {
        assert_eq!(parse_size("64k"), Some(65536));
        assert_eq!(parse_size("4M"), Some(4 << 20));
        assert_eq!(parse_size("x"), None);
        assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_duration("10s"), Some(Duration::from_secs(10)));
        assert_eq!(parse_duration("10"), None);
    }

    #[test]
    fn env_values_override_defaults_and_are_validated() {
        let cfg = Config::from_lookup(&[], |n| (n == "UCT_TLS").then(|| "^tcp".into())).unwrap();
        assert_eq!(cfg.get_str("UCT_TLS").unwrap(), "^tcp");
        assert_eq!(cfg.get_str("UCT_MODULES").unwrap(), "all");
        let err = Config::from_lookup(&[], |n| (n == "UCT_LOG_LEVEL").then(|| "loud".into()))
            .unwrap_err();
        assert!(err.to_string().contains("UCT_LOG_LEVEL=loud"));
    }

    #[test]
    fn unknown_variable_gets_closest_name() {
        let cfg = Config::from_lookup(&[], |_| None).unwrap();
        let u = cfg.unknown_vars_in(
            ["UCT_TSL", "UCT_IB_FOO", "PATH", "UCT_TEST_EXPECT"].into_iter(),
            &["UCT_IB_".into()],
        );
        assert_eq!(u.len(), 1);
        assert_eq!(u[0].name, "UCT_TSL");
        assert_eq!(u[0].suggestion.as_deref(), Some("UCT_TLS"));
        assert!(u[0].to_string().contains("did you mean UCT_TLS?"));
    }
}
