//! Odd UCT_NIC_AFFINITY values: a huge one is refused at once (not after
//! minutes of pairwise comparisons) with a short message, an empty one
//! says what to do, and a device or NIC named twice by two of its names is
//! refused by name.

use std::time::{Duration, Instant};

use uct_topo::{Affinity, Topology};

fn dgx() -> Topology {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/dgx-a800");
    Topology::from_root(root, None).unwrap()
}

#[test]
fn a_huge_value_is_refused_at_once_with_a_short_message() {
    // 200k NIC names in one rule: pairwise duplicate checks take minutes.
    let nics: Vec<String> = (0..200_000).map(|i| format!("n{i}")).collect();
    let text = format!("cuda0={}", nics.join(","));
    let t = Instant::now();
    let e = Affinity::parse(&text).unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    let msg = e.to_string();
    assert!(msg.len() < 1024, "a message of {} bytes", msg.len());
    assert!(msg.contains("more than"), "{msg}");
    // Many short rules, each for another device: the same.
    let rules: Vec<String> = (0..20_000).map(|i| format!("d{i}=n")).collect();
    let t = Instant::now();
    assert!(Affinity::parse(&rules.join(";")).is_err());
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
}

#[test]
fn an_empty_value_says_what_to_do() {
    for text in ["", "  "] {
        let msg = Affinity::parse(text).unwrap_err().to_string();
        assert!(msg.contains("unset UCT_NIC_AFFINITY"), "{text:?}: {msg}");
    }
    // ';' alone and '=' alone are named as what they are.
    let msg = Affinity::parse(";").unwrap_err().to_string();
    assert!(msg.contains("empty rule"), "{msg}");
    let msg = Affinity::parse("=").unwrap_err().to_string();
    assert!(msg.contains("no device"), "{msg}");
}

#[test]
fn one_device_or_nic_under_two_names_is_refused() {
    let t = dgx();
    let cuda0 = t.accelerators().iter().find(|a| a.name == "cuda0").unwrap();
    let bus = cuda0.pci.bus_id.to_ascii_uppercase();
    // cuda0 and its bus id: which rule wins would depend on their order.
    let rules = Affinity::parse(&format!("cuda0=mlx5_1;{bus}=mlx5_2")).unwrap();
    let msg = t
        .clone()
        .with_affinity(Some(rules))
        .expect_err("two rules for cuda0 are refused")
        .to_string();
    assert!(msg.contains(&bus) && msg.contains("cuda0"), "{msg}");
    // mlx5_4 and its interface ibp52s0 are one NIC.
    let rules = Affinity::parse("cuda0=mlx5_4,mlx5_1,ibp52s0").unwrap();
    let msg = t
        .clone()
        .with_affinity(Some(rules))
        .expect_err("mlx5_4 twice is refused")
        .to_string();
    assert!(msg.contains("ibp52s0 is NIC mlx5_4"), "{msg}");
    // Distinct devices and NICs still apply.
    let rules = Affinity::parse("cuda0=mlx5_4,mlx5_1;cuda1=ibp52s0").unwrap();
    let t = t.with_affinity(Some(rules)).unwrap();
    assert_eq!(t.nics_for("cuda0").unwrap()[0].name, "mlx5_4");
}
