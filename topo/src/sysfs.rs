//! Reading the PCIe facts out of a sysfs tree: every device's ancestor
//! chain, NUMA node and link. Missing or garbled files give "unknown" and
//! a note, never an error or a panic.

use std::fs;
use std::path::{Path, PathBuf};

/// Where a device sits on the PCIe fabric.
#[derive(Debug, Clone, PartialEq)]
pub struct PciLocation {
    /// Its PCI address, `DDDD:BB:DD.F`.
    pub bus_id: String,
    /// The root (`pciDDDD:BB`) then every bridge down to the device itself.
    pub chain: Vec<String>,
    /// Its NUMA node; None where sysfs says -1 or cannot tell.
    pub numa_node: Option<u32>,
    /// Its PCIe link.
    pub link: Link,
}

/// A PCIe link as `current_link_speed` and `current_link_width` give it.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Link {
    /// Transfers per second per lane, in GT/s (2.5, 5, 8, 16, 32, 64).
    pub speed_gts: Option<f64>,
    /// Lanes.
    pub width: Option<u32>,
}

impl Link {
    /// Usable bandwidth in Mb/s: speed x width, less the line code (8b/10b
    /// up to 5 GT/s, 128b/130b above). None if either is unknown.
    pub fn bandwidth_mbps(&self) -> Option<u64> {
        let (s, w) = (self.speed_gts?, self.width?);
        let code = if s <= 5.0 { 0.8 } else { 128.0 / 130.0 };
        Some((s * 1000.0 * f64::from(w) * code) as u64)
    }
}

/// A sysfs tree: `root` holds `sys/`.
pub(crate) struct Sysfs {
    pub root: PathBuf,
    pub notes: Vec<String>,
}

impl Sysfs {
    pub fn new(root: PathBuf) -> Sysfs {
        Sysfs {
            root,
            notes: Vec::new(),
        }
    }

    pub fn sys(&self, rel: &str) -> PathBuf {
        self.root.join("sys").join(rel)
    }

    /// Entry names of a sysfs folder, sorted; an absent folder is empty.
    pub fn list(&self, rel: &str) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(self.sys(rel))
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .filter_map(|e| e.file_name().into_string().ok())
                    .collect()
            })
            .unwrap_or_default();
        names.sort_by_key(|a| natural(a));
        names
    }

    /// The PCI device that sysfs entry `rel` (a `device` link, or a
    /// `bus/pci/devices/*` link) leads to. Ok(None): it has no PCI
    /// device (a software device). Err: why it cannot be followed.
    pub fn pci_of(&mut self, rel: &str) -> Result<Option<PciLocation>, String> {
        let link = self.sys(rel);
        if fs::symlink_metadata(&link).is_err() {
            return Ok(None);
        }
        let real = fs::canonicalize(&link)
            .map_err(|e| format!("{} cannot be followed: {e}", link.display()))?;
        let devices = fs::canonicalize(self.sys("devices"))
            .map_err(|e| format!("{} cannot be read: {e}", self.sys("devices").display()))?;
        let Ok(below) = real.strip_prefix(&devices) else {
            return Ok(None);
        };
        let names: Vec<String> = below
            .components()
            .filter_map(|c| c.as_os_str().to_str().map(String::from))
            .collect();
        let Some(start) = names.iter().position(|n| is_pci_root(n)) else {
            return Ok(None);
        };
        let mut chain: Vec<String> = names[start..]
            .iter()
            .filter(|n| is_pci_root(n) || is_bus_id(n))
            .cloned()
            .collect();
        // Whatever hangs below the deepest PCI function (virtio2, net/eth0)
        // is not on the fabric.
        while chain.last().is_some_and(|n| !is_bus_id(n)) {
            chain.pop();
        }
        let Some(bus_id) = chain.last().cloned() else {
            return Ok(None);
        };
        let mut dir = devices.clone();
        for n in &names[..] {
            dir.push(n);
            if *n == bus_id {
                break;
            }
        }
        let numa_node = self.numa(&dir);
        let link = self.link(&dir);
        Ok(Some(PciLocation {
            bus_id,
            chain,
            numa_node,
            link,
        }))
    }

    /// A small text file's trimmed content; None when absent (common: not
    /// every device has every file), or when it is not a sysfs attribute
    /// (a FIFO, a device, a huge file, not UTF-8): then with a note.
    pub fn read(&mut self, path: &Path) -> Option<String> {
        match read_attr(path) {
            Ok(v) => v,
            Err(why) => {
                self.notes
                    .push(format!("{} {why}: taken as unknown", path.display()));
                None
            }
        }
    }

    fn note_garbled(&mut self, path: &Path, value: &str) {
        self.notes.push(format!(
            "{} holds {value:?}, which does not parse: taken as unknown",
            path.display()
        ));
    }

    fn numa(&mut self, dir: &Path) -> Option<u32> {
        let p = dir.join("numa_node");
        let v = self.read(&p)?;
        match v.parse::<i64>() {
            Ok(n) if n >= 0 => u32::try_from(n).ok(),
            Ok(_) => None,
            Err(_) => {
                self.note_garbled(&p, &v);
                None
            }
        }
    }

    fn link(&mut self, dir: &Path) -> Link {
        let mut link = Link::default();
        let p = dir.join("current_link_speed");
        if let Some(v) = self.read(&p) {
            // "16.0 GT/s PCIe", "2.5 GT/s"; "Unknown" when the link is down.
            let first = v.split_whitespace().next().unwrap_or("");
            match first.parse::<f64>() {
                Ok(s) if s.is_finite() && s > 0.0 => link.speed_gts = Some(s),
                _ if v.starts_with("Unknown") => {}
                _ => self.note_garbled(&p, &v),
            }
        }
        let p = dir.join("current_link_width");
        if let Some(v) = self.read(&p) {
            match v.parse::<u32>() {
                Ok(0) => {}
                Ok(w) => link.width = Some(w),
                Err(_) => self.note_garbled(&p, &v),
            }
        }
        link
    }

    /// `vendor` and `class` of the PCI device `bus_id`, as numbers.
    pub fn ids(&mut self, bus_id: &str) -> Option<(u32, u32)> {
        let dir = self.sys(&format!("bus/pci/devices/{bus_id}"));
        let hex = |s: String| u32::from_str_radix(s.trim_start_matches("0x"), 16).ok();
        let vendor = hex(self.read(&dir.join("vendor"))?)?;
        let class = hex(self.read(&dir.join("class"))?)?;
        Some((vendor, class))
    }
}

/// The most a sysfs attribute holds: a page on most kernels, a few on
/// some. A larger file is not an attribute, and is not read whole.
pub(crate) const MAX_ATTR: usize = 64 * 1024;

/// The trimmed content of the attribute file at `path`: Ok(None) when it
/// is absent; Err(why) when it is there but not a small regular UTF-8
/// file. A FIFO would block the read for ever and /dev/zero never ends,
/// so only regular files are opened, and at most [`MAX_ATTR`] bytes read.
pub(crate) fn read_attr(path: &Path) -> Result<Option<String>, String> {
    use std::io::Read;
    let meta = match fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot be read ({e})")),
    };
    if !meta.is_file() {
        return Err("is not a regular file (a FIFO, a device or a folder)".into());
    }
    let file = fs::File::open(path).map_err(|e| format!("cannot be opened ({e})"))?;
    // Checked again on the file opened, in case it was swapped meanwhile.
    if !file.metadata().is_ok_and(|m| m.is_file()) {
        return Err("is not a regular file (a FIFO, a device or a folder)".into());
    }
    let mut bytes = Vec::new();
    file.take(MAX_ATTR as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot be read ({e})"))?;
    if bytes.len() > MAX_ATTR {
        return Err(format!(
            "holds more than {MAX_ATTR} bytes, which no sysfs attribute does"
        ));
    }
    let text = String::from_utf8(bytes).map_err(|_| "is not UTF-8 text".to_string())?;
    Ok(Some(text.trim().to_string()))
}

/// `pciDDDD:BB`, a host bridge's folder.
pub(crate) fn is_pci_root(n: &str) -> bool {
    n.strip_prefix("pci").is_some_and(|r| {
        let mut p = r.split(':');
        matches!((p.next(), p.next(), p.next()), (Some(d), Some(b), None)
            if is_hex(d) && is_hex(b))
    })
}

/// `DDDD:BB:DD.F`, a PCI function's address.
pub(crate) fn is_bus_id(n: &str) -> bool {
    let mut p = n.split(':');
    match (p.next(), p.next(), p.next(), p.next()) {
        (Some(d), Some(b), Some(df), None) => {
            is_hex(d)
                && is_hex(b)
                && df
                    .split_once('.')
                    .is_some_and(|(dev, f)| is_hex(dev) && is_hex(f))
        }
        _ => false,
    }
}

fn is_hex(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_hexdigit())
}

/// Sort key that puts mlx5_2 before mlx5_10 and hl2 before hl10.
pub(crate) fn natural(s: &str) -> (String, u64, String) {
    let digits_at = s
        .char_indices()
        .rev()
        .take_while(|(_, c)| c.is_ascii_digit())
        .last()
        .map(|(i, _)| i);
    match digits_at {
        Some(i) => (
            s[..i].to_string(),
            s[i..].parse().unwrap_or(u64::MAX),
            s.to_string(),
        ),
        None => (s.to_string(), 0, s.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_recognised() {
        assert!(is_pci_root("pci0000:00"));
        assert!(is_pci_root("pci10000:e0"));
        assert!(!is_pci_root("pci_bus"));
        assert!(is_bus_id("0000:1a:00.1"));
        assert!(!is_bus_id("virtio2"));
        assert!(!is_bus_id("0000:1a:00"));
    }

    #[test]
    fn link_bandwidth_counts_the_line_code() {
        let gen4 = Link {
            speed_gts: Some(16.0),
            width: Some(16),
        };
        assert_eq!(gen4.bandwidth_mbps(), Some(252_061));
        let gen2 = Link {
            speed_gts: Some(5.0),
            width: Some(8),
        };
        assert_eq!(gen2.bandwidth_mbps(), Some(32_000));
        assert_eq!(Link::default().bandwidth_mbps(), None);
    }

    #[test]
    fn natural_order_sorts_numbers_as_numbers() {
        let mut v = vec!["mlx5_10", "mlx5_2", "hl1", "mlx5_0"];
        v.sort_by_key(|a| natural(a));
        assert_eq!(v, ["hl1", "mlx5_0", "mlx5_2", "mlx5_10"]);
    }
}
