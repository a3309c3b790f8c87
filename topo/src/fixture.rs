//! Builds a sysfs-like tree from a compact text layout: the fixtures under
//! `topo/fixtures/` are made with it (and checked against it by a test),
//! and tests build small trees of their own.
//!
//! One device a line, `#` starts a comment:
//!
//! ```text
//! nodes 0=0-47 1=48-95                        # sys/devices/system/node/node0/cpulist ...
//! gpu   -      0000:00:01.0/0000:01:00.0 numa=0 speed=16.0 width=16
//! ib    mlx5_0 0000:00:02.0/0000:02:00.0 numa=0 speed=16.0 width=16 net=ibp2s0
//! net   eth0   0000:00:03.0 numa=-1
//! hl    hl0    0000:00:04.0/0000:04:00.0 numa=0
//! accel accel0 0000:00:05.0/0000:05:00.0
//! soft  lo     net                             # a class entry with no PCI device
//! ```
//!
//! The path lists the PCI functions from the root port down to the device;
//! the host bridge `pciDDDD:BB` comes from the first one. Bridges on the
//! way are made as PCI bridges (class 0x060400) on the device's node.
//!
//! ```
//! let dir = std::env::temp_dir().join(format!("uct-topo-doc-{}", std::process::id()));
//! uct_topo::fixture::build("ib mlx5_0 0000:00:02.0/0000:02:00.0 numa=0", &dir).unwrap();
//! let topo = uct_topo::Topology::from_root(&dir, None).unwrap();
//! assert_eq!(topo.nics()[0].pci.bus_id, "0000:02:00.0");
//! std::fs::remove_dir_all(&dir).unwrap();
//! ```

use std::fs;
use std::path::Path;

/// Writes the tree that `layout` describes under `root` (which holds
/// `sys/` afterwards). An error names the line that is wrong or the file
/// that could not be written.
pub fn build(layout: &str, root: &Path) -> Result<(), String> {
    for (n, raw) in layout.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let at = |e: String| format!("layout line {}: {e}: {raw}", n + 1);
        let words: Vec<&str> = line.split_whitespace().collect();
        match words[0] {
            "nodes" => {
                for w in &words[1..] {
                    let (id, cpus) = w.split_once('=').unwrap_or((w, ""));
                    let id: u32 = id.parse().map_err(|_| at(format!("{id} is not a node")))?;
                    let dir = root.join(format!("sys/devices/system/node/node{id}"));
                    mkdir(&dir).map_err(at)?;
                    write_new(&dir.join("cpulist"), cpus).map_err(at)?;
                }
            }
            "soft" => {
                let [_, name, class] = words[..] else {
                    return Err(at("expected: soft NAME CLASS".into()));
                };
                let dir = root.join(format!("sys/class/{class}/{name}"));
                mkdir(&dir).map_err(at)?;
                // A file, so that git keeps the folder.
                write_new(&dir.join("uevent"), &format!("NAME={name}")).map_err(at)?;
            }
            kind @ ("gpu" | "hl" | "accel" | "ib" | "net") => {
                if words.len() < 3 {
                    return Err(at(format!("expected: {kind} NAME PATH [key=value...]")));
                }
                device(root, kind, words[1], words[2], &words[3..]).map_err(at)?;
            }
            other => return Err(at(format!("unknown kind {other}"))),
        }
    }
    Ok(())
}

fn device(root: &Path, kind: &str, name: &str, path: &str, opts: &[&str]) -> Result<(), String> {
    let mut numa = "-1".to_string();
    let (mut speed, mut width, mut netdev) = (None, None, None);
    for o in opts {
        match o.split_once('=') {
            Some(("numa", v)) => numa = v.to_string(),
            Some(("speed", v)) => speed = Some(v.to_string()),
            Some(("width", v)) => width = Some(v.to_string()),
            Some(("net", v)) => netdev = Some(v.to_string()),
            _ => return Err(format!("unknown option {o}")),
        }
    }
    let funcs: Vec<&str> = path.split('/').collect();
    let first = funcs[0];
    let Some((dom_bus, _)) = first.rsplit_once(':') else {
        return Err(format!("{first} is not a PCI address"));
    };
    let mut rel = format!("devices/pci{dom_bus}");
    let (vendor, class) = match kind {
        "gpu" => ("0x10de", "0x030200"),
        "hl" | "accel" => ("0x1da3", "0x120000"),
        "ib" => ("0x15b3", "0x020700"),
        _ => ("0x15b3", "0x020000"),
    };
    for (i, f) in funcs.iter().enumerate() {
        rel.push('/');
        rel.push_str(f);
        let dir = root.join("sys").join(&rel);
        mkdir(&dir)?;
        let last = i + 1 == funcs.len();
        let (v, c) = if last {
            (vendor, class)
        } else {
            ("0x1000", "0x060400")
        };
        write_new(&dir.join("vendor"), v)?;
        write_new(&dir.join("class"), c)?;
        write_new(&dir.join("numa_node"), &numa)?;
        if last {
            if let Some(s) = &speed {
                write_new(&dir.join("current_link_speed"), &format!("{s} GT/s PCIe"))?;
            }
            if let Some(w) = &width {
                write_new(&dir.join("current_link_width"), w)?;
            }
        }
        let bus = root.join("sys/bus/pci/devices");
        mkdir(&bus)?;
        link(&bus.join(f), &format!("../../../{rel}"))?;
    }
    let class_dir = match kind {
        "gpu" => return Ok(()),
        "hl" => "habanalabs",
        "accel" => "accel",
        "ib" => "infiniband",
        _ => "net",
    };
    let entry = root.join(format!("sys/class/{class_dir}/{name}"));
    mkdir(&entry)?;
    link(&entry.join("device"), &format!("../../../{rel}"))?;
    if let Some(n) = netdev {
        let entry = root.join(format!("sys/class/net/{n}"));
        mkdir(&entry)?;
        link(&entry.join("device"), &format!("../../../{rel}"))?;
    }
    Ok(())
}

fn mkdir(p: &Path) -> Result<(), String> {
    fs::create_dir_all(p).map_err(|e| format!("cannot create {}: {e}", p.display()))
}

/// Writes `p` unless a line before made it (a bridge shared by devices).
fn write_new(p: &Path, content: &str) -> Result<(), String> {
    if p.exists() {
        return Ok(());
    }
    fs::write(p, format!("{content}\n")).map_err(|e| format!("cannot write {}: {e}", p.display()))
}

fn link(p: &Path, target: &str) -> Result<(), String> {
    if fs::symlink_metadata(p).is_ok() {
        return Ok(());
    }
    std::os::unix::fs::symlink(target, p)
        .map_err(|e| format!("cannot link {} -> {target}: {e}", p.display()))
}

/// Every entry under `root/sys`, one a line, sorted: folders end in `/`,
/// links show their target, files their content. Two trees are the same
/// fixture when their listings are equal.
pub fn listing(root: &Path) -> String {
    let mut out = Vec::new();
    walk(root, &root.join("sys"), &mut out);
    out.sort();
    out.join("\n")
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
    let Ok(rd) = fs::read_dir(dir) else {
        return;
    };
    for e in rd.filter_map(|e| e.ok()) {
        let p = e.path();
        let rel = p.strip_prefix(root).unwrap_or(&p).display().to_string();
        let Ok(meta) = fs::symlink_metadata(&p) else {
            continue;
        };
        if meta.file_type().is_symlink() {
            let t = fs::read_link(&p).map(|t| t.display().to_string());
            out.push(format!("{rel} -> {}", t.unwrap_or_else(|e| e.to_string())));
        } else if meta.is_dir() {
            out.push(format!("{rel}/"));
            walk(root, &p, out);
        } else {
            // Bounded, regular files only: a FIFO in a tree must not hang it.
            let c = crate::sysfs::read_attr(&p).unwrap_or_else(|why| Some(format!("<{why}>")));
            out.push(format!("{rel} = {}", c.unwrap_or_default()));
        }
    }
}
