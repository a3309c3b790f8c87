//! transport-info: what uct-rs finds on this machine — components, modules,
//! memory domains, transports and their capabilities, configuration.

use clap::Parser;
use serde_json::{json, Map, Value};
use tools::{info, text};
use uct_core::Registry;
use uct_topo::Topology;

// The --topo report; kept out of the shared lib, as only this tool shows it.
#[path = "../topo_view.rs"]
mod topo_view;

#[derive(Parser, Debug)]
#[command(
    name = "transport-info",
    disable_version_flag = true,
    about = "Show the components, modules, memory domains, transports and configuration uct-rs finds on this machine",
    after_help = "Examples:\n  transport-info -d             memory domains and transports, with capabilities\n  transport-info -d -t tcp      only the tcp transport\n  transport-info -a             everything, including modules that did not load and why\n  transport-info -c -f          configuration variables with their documentation\n  transport-info -a --json      the same as JSON, for scripts\n  transport-info --topo         accelerators x NICs by PCIe path (PIX, PXB, PHB, NODE, SYS)\n\nEnvironment: UCT_TLS, UCT_MODULES, UCT_MODULE_DIR, UCT_LOG_LEVEL and the rest are listed by -c."
)]
struct Args {
    /// Print the uct-rs version.
    #[arg(short = 'v', long = "version")]
    version: bool,

    /// Memory domains and transports, one block each, with capabilities
    /// (sizes, atomics, connection modes, memory types they can touch).
    #[arg(short = 'd', long = "devices")]
    devices: bool,

    /// Everything: version, build, components and where they came from,
    /// modules with load status and reasons, devices, absent transports,
    /// configuration.
    #[arg(short = 'a', long = "all")]
    all: bool,

    /// Every UCT_* configuration variable with its value.
    #[arg(short = 'c', long = "config")]
    config: bool,

    /// With -c: also each variable's documentation and default.
    #[arg(short = 'f', long = "full")]
    full: bool,

    /// Only show transport NAME (with -d or -a), e.g. self, posix, tcp.
    #[arg(short = 't', long = "transport", value_name = "NAME")]
    transport: Option<String>,

    /// Build information: version, profile, module ABI fingerprint.
    #[arg(short = 'b', long = "build")]
    build: bool,

    /// The PCIe topology: accelerators (rows) x NICs (columns) by path type
    /// as `nvidia-smi topo -m` shows it, NUMA nodes, and the NICs nearest
    /// each accelerator. Reads /sys, or the tree UCT_SYSFS_ROOT names;
    /// applies UCT_NIC_AFFINITY.
    #[arg(long)]
    topo: bool,

    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

fn main() {
    uct_builtins::link();
    uct_core::logging::init();
    let mut args = Args::parse();
    if args.full && !(args.config || args.all) {
        eprintln!("transport-info: -f adds documentation to -c; use -c -f");
        std::process::exit(2);
    }
    let registry_wanted = args.version
        || args.devices
        || args.all
        || args.config
        || args.build
        || args.transport.is_some();
    if !(registry_wanted || args.topo) {
        eprintln!(
            "transport-info: nothing to show; try -d (devices), -a (everything), --topo or --help"
        );
        std::process::exit(2);
    }
    let topo = args.topo.then(|| match Topology::discover() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("transport-info: {e}");
            std::process::exit(1);
        }
    });
    if !registry_wanted {
        if let Some(t) = &topo {
            if args.json {
                match serde_json::to_string_pretty(&json!({ "topology": topo_view::json(t) })) {
                    Ok(s) => println!("{s}"),
                    Err(e) => {
                        eprintln!("transport-info: cannot encode JSON: {e}");
                        std::process::exit(1);
                    }
                }
            } else {
                print!("{}", topo_view::text(t));
            }
        }
        return;
    }
    if args.transport.is_some() && !args.all {
        args.devices = true;
    }
    let reg = match Registry::from_env() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("transport-info: {e}");
            std::process::exit(1);
        }
    };
    if let Some(t) = &args.transport {
        if !reg.resources().iter().any(|r| &r.tl.transport == t) {
            eprintln!(
                "transport-info: transport {t} is not available: {}",
                reg.explain_absent(t)
            );
            std::process::exit(1);
        }
    }
    if args.json {
        print_json(&args, &reg, topo.as_ref());
    } else {
        print_text(&args, &reg, topo.as_ref());
    }
}

fn print_text(args: &Args, reg: &Registry, topo: Option<&Topology>) {
    let only = args.transport.as_deref();
    let mut out = String::new();
    if args.version && !(args.build || args.all) {
        out.push_str(&format!("# uct-rs version {}\n", uct_core::VERSION));
    }
    if args.build || args.all {
        out.push_str(&text::build(&info::build_info()));
    }
    if args.all {
        out.push_str(&text::components(&info::components(reg)));
        out.push_str(&text::modules(&info::modules(reg)));
    }
    if args.devices || args.all {
        out.push_str(&text::devices(&info::devices(reg, only)));
        if only.is_none() {
            out.push_str(&text::absent(&info::absent(reg)));
            out.push_str(&text::absent_mds(&info::absent_mds(reg)));
        }
    }
    if args.config || args.all {
        if args.all {
            out.push_str("#\n# Configuration\n#\n");
        }
        out.push_str(&text::config(&info::config(reg), args.full));
    }
    if let Some(t) = topo {
        out.push_str(&topo_view::text(t));
    }
    print!("{out}");
}

fn print_json(args: &Args, reg: &Registry, topo: Option<&Topology>) {
    let only = args.transport.as_deref();
    let mut report = Map::new();
    if args.version || args.all {
        report.insert("version".into(), json!(uct_core::VERSION));
    }
    if args.build || args.all {
        report.insert("build".into(), json!(info::build_info()));
    }
    if args.all {
        report.insert("components".into(), json!(info::components(reg)));
        report.insert("modules".into(), json!(info::modules(reg)));
    }
    if args.devices || args.all {
        report.insert("memory_domains".into(), json!(info::devices(reg, only)));
        if only.is_none() {
            report.insert("absent_transports".into(), json!(info::absent(reg)));
            report.insert("absent_memory_domains".into(), json!(info::absent_mds(reg)));
        }
    }
    if args.config || args.all {
        report.insert("config".into(), json!(info::config(reg)));
    }
    if let Some(t) = topo {
        report.insert("topology".into(), topo_view::json(t));
    }
    report.insert(
        "warnings".into(),
        json!(reg
            .unknown_vars()
            .iter()
            .map(|u| u.to_string())
            .collect::<Vec<_>>()),
    );
    match serde_json::to_string_pretty(&Value::Object(report)) {
        Ok(s) => println!("{s}"),
        Err(e) => {
            eprintln!("transport-info: cannot encode JSON: {e}");
            std::process::exit(1);
        }
    }
}
