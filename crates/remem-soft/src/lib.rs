//! remem's userspace RoCEv2 provider: a software RDMA NIC over UDP that speaks the wire
//! protocol of Linux Soft-RoCE (`rdma_rxe`).
//!
//! A soft device sits on a network interface, as `rdma link add rxe0 type rxe netdev eth0`
//! puts an rxe device on one: its GID table holds the interface's IP addresses and its
//! active MTU follows the interface MTU the way rxe derives it. [`SoftProvider`] lists one
//! device per interface that has an IP address, named `soft-<interface>` (`soft-lo`,
//! `soft-eth0`, …).
//!
//! Besides the interface devices, `soft@<ip>[:<port>]` opens a device bound to any local
//! address, so that several devices can live on one host (127.0.0.1, 127.0.0.2, …).
//!
//! Inside: [`transport`] is the RC/UC/UD transport as a sans-IO state machine, [`engine`] moves
//! packets between it and a UDP socket, [`objects`] holds the verbs objects, [`qp`] the
//! queue pair.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod cm;
mod context;
pub mod driver;
pub mod engine;
pub mod faults;
mod netdev;
pub mod objects;
pub mod pcap;
pub mod qp;
pub mod transport;
pub mod wqe;

pub use context::{SoftContext, SoftOptions};
pub use faults::FaultConfig;
pub use netdev::{Netdev, list_netdevs};

use remem_verbs::{Context, DeviceInfo, Error, Provider, Result};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

/// The UDP port of RoCEv2 (IANA-assigned), on which soft devices listen by default.
pub use remem_verbs::ROCEV2_UDP_PORT;

/// The address a soft device named `soft@<ip>[:<port>]` binds (UDP port
/// [`ROCEV2_UDP_PORT`] when the port is omitted), as [`SoftProvider`] opens it: `None` if
/// `name` is not of that form, [`Error::NoSuchDevice`] if its address does not parse.
pub fn soft_device_addr(name: &str) -> Option<Result<SocketAddr>> {
    let addr = name.strip_prefix("soft@")?;
    Some(
        addr.parse()
            .or_else(|_| {
                addr.parse::<IpAddr>()
                    .map(|ip| SocketAddr::new(ip, ROCEV2_UDP_PORT))
            })
            .map_err(|_| Error::NoSuchDevice(name.to_string())),
    )
}

/// The soft provider: lists and opens soft devices.
#[derive(Debug, Default, Clone)]
pub struct SoftProvider {
    _private: (),
}

impl SoftProvider {
    /// The provider.
    pub fn new() -> Self {
        SoftProvider { _private: () }
    }
}

impl Provider for SoftProvider {
    fn name(&self) -> &'static str {
        "soft"
    }

    fn devices(&self) -> Result<Vec<DeviceInfo>> {
        Ok(list_netdevs()?
            .iter()
            .map(|n| n.device_info(ROCEV2_UDP_PORT))
            .collect())
    }

    /// Opens `soft-<interface>` (bound to the interface's primary address, UDP 4791) or
    /// `soft@<ip>[:<port>]` (bound to that address; port 4791 when omitted).
    fn open(&self, name: &str) -> Result<Arc<dyn Context>> {
        if let Some(addr) = soft_device_addr(name) {
            return Ok(Arc::new(SoftContext::bind(addr?)?));
        }
        let netdev = list_netdevs()?
            .into_iter()
            .find(|n| n.device_name() == name)
            .ok_or_else(|| Error::NoSuchDevice(name.to_string()))?;
        Ok(Arc::new(SoftContext::new(netdev, ROCEV2_UDP_PORT)?))
    }
}
