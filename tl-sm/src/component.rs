//! The sm component: one component for both intra-node transports, with
//! memory domains `posix` and `cma` and one transport on each. What is
//! particular to a transport (its device, its iface, its rkeys) is in its
//! own `component.rs`, which this one dispatches to by name.

use std::sync::{Arc, OnceLock};

use uct_core::config::ConfigVar;
use uct_core::{
    BuiltinComponent, Component, Iface, IfaceParams, MemoryDomain, RemoteKey, Result, RkeyEntry,
    TlResource, UctError,
};

use crate::cma::{self, CmaMd};
use crate::posix::{self, PosixMd};

/// The component's name.
const NAME: &str = "sm";

/// The variables of both transports.
const SM_CONFIG: &[ConfigVar] = &[
    cma::component::PEER_TIMEOUT_VAR,
    posix::component::PEER_TIMEOUT_VAR,
];

/// The sm component: memory domains posix and cma, one transport each.
pub struct SmComponent {
    posix: OnceLock<Arc<PosixMd>>,
    cma: OnceLock<Arc<CmaMd>>,
}

impl Component for SmComponent {
    fn name(&self) -> &str {
        NAME
    }

    fn description(&self) -> &str {
        "shared memory on this host: posix segments, cma (process_vm_readv/writev)"
    }

    fn config_table(&self) -> &'static [ConfigVar] {
        SM_CONFIG
    }

    fn transport_names(&self) -> Vec<String> {
        vec![
            posix::component::TRANSPORT_NAME.into(),
            cma::component::TRANSPORT_NAME.into(),
        ]
    }

    fn md_names(&self) -> Result<Vec<String>> {
        Ok(vec![posix::MD_NAME.into(), cma::MD_NAME.into()])
    }

    fn open_md(&self, name: &str) -> Result<Arc<dyn MemoryDomain>> {
        match name {
            posix::MD_NAME => Ok(self
                .posix
                .get_or_init(|| Arc::new(PosixMd::new(NAME)))
                .clone()),
            cma::MD_NAME => Ok(self.cma.get_or_init(|| Arc::new(CmaMd::new(NAME))).clone()),
            other => Err(UctError::NoDevice(format!(
                "component sm has memory domains posix and cma, not {other}"
            ))),
        }
    }

    fn tl_resources(&self, md: &Arc<dyn MemoryDomain>) -> Result<Vec<TlResource>> {
        if md.component() != NAME {
            return Ok(vec![]);
        }
        Ok(match md.name() {
            posix::MD_NAME => posix::component::tl_resources(),
            cma::MD_NAME => cma::component::tl_resources(),
            _ => vec![],
        })
    }

    fn open_iface(
        &self,
        md: &Arc<dyn MemoryDomain>,
        resource: &TlResource,
        _params: &IfaceParams,
    ) -> Result<Box<dyn Iface>> {
        // Each transport runs on the MD of its own name.
        if md.component() != NAME || md.name() != resource.transport {
            return Err(UctError::InvalidParam(format!(
                "transport {} needs memory domain {}, got {}",
                resource.transport,
                resource.transport,
                md.name()
            )));
        }
        match resource.transport.as_str() {
            posix::component::TRANSPORT_NAME => posix::component::open_iface(md),
            cma::component::TRANSPORT_NAME => cma::component::open_iface(md),
            other => Err(UctError::NoTransport(other.into())),
        }
    }

    fn unpack_rkey(&self, entry: &RkeyEntry) -> Result<RemoteKey> {
        match entry.md.as_str() {
            posix::MD_NAME => posix::component::unpack_rkey(NAME, entry),
            cma::MD_NAME => cma::component::unpack_rkey(NAME, entry),
            other => Err(UctError::RkeyMismatch {
                expected: "memory domain posix or cma".into(),
                found: format!("memory domain {other}"),
            }),
        }
    }
}

fn create() -> Arc<dyn Component> {
    Arc::new(SmComponent {
        posix: OnceLock::new(),
        cma: OnceLock::new(),
    })
}

inventory::submit! {
    BuiltinComponent { create }
}
