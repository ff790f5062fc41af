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
//! address, so that several devices can live on one host (127.0.0.1, 127.0.0.2, …, or one
//! address at several UDP ports: each path names its peer's port in its address vector,
//! `AhAttr::udp_port`, or each device is told the others' ports with
//! `Context::set_peer_udp_port`).
//!
//! Inside, lowest layer first (each folder uses only the ones before it, but for the
//! few upward edges `tests/layers.rs` allows and explains):
//!
//! - `mem`: grants of registered memory and their revocation, key generators;
//! - `transport`: the RC/UC/UD transport as a sans-IO state machine, its packets and work
//!   requests (`transport::wqe`), the `Env` trait it reaches memory and queues through,
//!   the deterministic simulation;
//! - `cm`: the RDMA connection manager (the pure agent in `cm::agent`, the CM ids);
//! - `engine`: the sans-IO device engine: QP registry, dispatch of received packets,
//!   transmit scheduling, timers, the GSI QP, multicast groups;
//! - `io`: the only IO: the UDP socket driver (batched `sendmmsg`/`recvmmsg`, the progress
//!   thread), `sys` (the scatter/gather `sendmsg`), fault injection, packet capture;
//! - `device`: what a device is (`DeviceShared`), its options, netdev and quotas;
//! - `verbs`: the `remem-verbs` trait implementations (context, PD, MR, CQ, SRQ, AH, QP).
//!
//! # The `internals` feature
//!
//! Those modules (`cm`, `device`, `engine`, `io`, `mem`, `transport`, `verbs`) are
//! private: a program uses the soft provider through [`SoftProvider`], [`SoftContext`] and
//! the `remem-verbs` traits. The `internals` feature makes them public, for what drives the
//! provider's insides by hand — this crate's integration tests, benchmarks and fuzzing
//! (the crate is its own dev-dependency with the feature, so `cargo test` and `cargo bench`
//! need no flag). They are not a stable API.

// One module, `io::sys` (the scatter/gather `sendmsg`), allows unsafe code; every other
// folder forbids it (`#![forbid(unsafe_code)]` at its top, which nothing below can lift).
#![deny(unsafe_code)]
#![warn(missing_docs)]

/// Declares modules that are public with the `internals` feature and private without.
macro_rules! internal_modules {
    ($($name:ident),* $(,)?) => {$(
        #[cfg(feature = "internals")]
        pub mod $name;
        #[cfg(not(feature = "internals"))]
        mod $name;
    )*};
}

internal_modules!(cm, device, engine, io, mem, transport, verbs);

pub mod dropin;
#[cfg(any(test, feature = "internals"))]
pub mod testing;

pub use cm::CmConfig;
pub use device::MAX_UNACKED_PSNS;
pub use device::netdev::{self, Netdev, list_netdevs};
pub use device::options::SoftOptions;
pub use engine::PEER_PORT_BUDGET;
pub use io::faults::{self, FaultConfig};
pub use io::pcap;
pub use verbs::context::SoftContext;

use remem_verbs::{Context, DeviceInfo, Error, Provider, Result};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

/// The UDP port of RoCEv2 (IANA-assigned), on which soft devices listen by default.
pub use remem_verbs::ROCEV2_UDP_PORT;

/// A soft device's name, parsed: the one reader of `soft@<ip>[:<port>]` and
/// `soft-<interface>` names (the provider, the CLI and the drop-in library all read names
/// through it). [`Display`](std::fmt::Display) writes the name back
/// (`soft@<ip>:<port>`, IPv6 addresses in brackets).
///
/// ```
/// use remem_soft::{SoftDeviceName, SoftNameError};
/// let n: SoftDeviceName = "soft@127.0.0.2".parse().unwrap();
/// assert_eq!(n, SoftDeviceName::Addr("127.0.0.2:4791".parse().unwrap()));
/// assert_eq!(n.to_string(), "soft@127.0.0.2:4791");
/// assert_eq!(
///     "soft@[::1]:7000".parse::<SoftDeviceName>().unwrap().addr(),
///     Some("[::1]:7000".parse().unwrap())
/// );
/// assert_eq!(
///     "soft-lo".parse::<SoftDeviceName>().unwrap(),
///     SoftDeviceName::Interface("lo".into())
/// );
/// assert!(matches!("soft@nope".parse::<SoftDeviceName>(), Err(SoftNameError::BadAddress { .. })));
/// assert!(matches!("rxe0".parse::<SoftDeviceName>(), Err(SoftNameError::NotSoft(_))));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SoftDeviceName {
    /// `soft@<ip>[:<port>]`: a device bound to that address (UDP port
    /// [`ROCEV2_UDP_PORT`] when the name has none; port 0 picks a free one).
    Addr(SocketAddr),
    /// `soft-<interface>`: the device on that network interface's primary address, UDP port
    /// [`ROCEV2_UDP_PORT`].
    Interface(String),
}

/// Why a name is not a soft device's ([`SoftDeviceName`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SoftNameError {
    /// The name is neither `soft@…` nor `soft-…` (another provider's device, perhaps).
    #[error("`{0}` is not a soft device name (soft@<ip>[:<port>] or soft-<interface>)")]
    NotSoft(String),
    /// A `soft@` name whose address does not parse.
    #[error(
        "`{name}`: expected soft@<ip>[:<port>] (an IPv6 address with a port in brackets: \
         soft@[::1]:4791)"
    )]
    BadAddress {
        /// The whole name.
        name: String,
    },
    /// `soft-` with no interface after it.
    #[error("`{0}`: expected soft-<interface>")]
    NoInterface(String),
}

impl From<SoftNameError> for Error {
    /// Every bad name is [`Error::NoSuchDevice`], as the provider reports names it does
    /// not know.
    fn from(e: SoftNameError) -> Self {
        match e {
            SoftNameError::NotSoft(name)
            | SoftNameError::BadAddress { name }
            | SoftNameError::NoInterface(name) => Error::NoSuchDevice(name),
        }
    }
}

impl std::str::FromStr for SoftDeviceName {
    type Err = SoftNameError;

    fn from_str(name: &str) -> std::result::Result<Self, SoftNameError> {
        if let Some(addr) = name.strip_prefix("soft@") {
            return addr
                .parse()
                .or_else(|_| {
                    addr.parse::<IpAddr>()
                        .map(|ip| SocketAddr::new(ip, ROCEV2_UDP_PORT))
                })
                .map(SoftDeviceName::Addr)
                .map_err(|_| SoftNameError::BadAddress {
                    name: name.to_string(),
                });
        }
        match name.strip_prefix("soft-") {
            Some("") => Err(SoftNameError::NoInterface(name.to_string())),
            Some(interface) => Ok(SoftDeviceName::Interface(interface.to_string())),
            None => Err(SoftNameError::NotSoft(name.to_string())),
        }
    }
}

impl std::fmt::Display for SoftDeviceName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SoftDeviceName::Addr(addr) => write!(f, "soft@{addr}"),
            SoftDeviceName::Interface(interface) => write!(f, "soft-{interface}"),
        }
    }
}

impl SoftDeviceName {
    /// The address of a `soft@` name; `None` for an interface's device.
    ///
    /// ```
    /// use remem_soft::SoftDeviceName;
    /// let n: SoftDeviceName = "soft@10.0.0.1:7000".parse().unwrap();
    /// assert_eq!(n.addr(), Some("10.0.0.1:7000".parse().unwrap()));
    /// ```
    pub fn addr(&self) -> Option<SocketAddr> {
        match self {
            SoftDeviceName::Addr(addr) => Some(*addr),
            SoftDeviceName::Interface(_) => None,
        }
    }

    /// The address of `name` if it is a `soft@<ip>[:<port>]` name: `None` for any other
    /// name (an interface's soft device, another provider's device), an error if its
    /// address does not parse — the question a program that opens bound soft devices
    /// itself asks.
    ///
    /// ```
    /// use remem_soft::SoftDeviceName;
    /// assert_eq!(
    ///     SoftDeviceName::bound_addr("soft@10.0.0.1").unwrap(),
    ///     Some("10.0.0.1:4791".parse().unwrap())
    /// );
    /// assert_eq!(SoftDeviceName::bound_addr("mlx5_0").unwrap(), None);
    /// assert!(SoftDeviceName::bound_addr("soft@10.0.0").is_err());
    /// ```
    pub fn bound_addr(name: &str) -> std::result::Result<Option<SocketAddr>, SoftNameError> {
        match name.parse::<SoftDeviceName>() {
            Ok(n) => Ok(n.addr()),
            Err(SoftNameError::NotSoft(_) | SoftNameError::NoInterface(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// The address a soft device named `soft@<ip>[:<port>]` binds (UDP port
/// [`ROCEV2_UDP_PORT`] when the port is omitted): `None` if `name` is not of that form,
/// [`Error::NoSuchDevice`] if its address does not parse. A shorthand of
/// [`SoftDeviceName::bound_addr`] kept for its callers.
///
/// ```
/// assert_eq!(
///     remem_soft::soft_device_addr("soft@127.0.0.2").unwrap().unwrap(),
///     "127.0.0.2:4791".parse().unwrap()
/// );
/// ```
pub fn soft_device_addr(name: &str) -> Option<Result<SocketAddr>> {
    SoftDeviceName::bound_addr(name)
        .map_err(Error::from)
        .transpose()
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
        let interface = match name.parse::<SoftDeviceName>()? {
            SoftDeviceName::Addr(addr) => return Ok(Arc::new(SoftContext::bind(addr)?)),
            SoftDeviceName::Interface(interface) => interface,
        };
        let netdev = list_netdevs()?
            .into_iter()
            .find(|n| n.name == interface)
            .ok_or_else(|| Error::NoSuchDevice(name.to_string()))?;
        Ok(Arc::new(SoftContext::new(netdev, ROCEV2_UDP_PORT)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn soft_device_names_parse_print_and_fail_typed() {
        for name in [
            "soft@127.0.0.2:4791",
            "soft@[::1]:7000",
            "soft-lo",
            "soft-eth0.5",
        ] {
            let parsed: SoftDeviceName = name.parse().unwrap();
            assert_eq!(parsed.to_string(), name, "round trip");
        }
        assert_eq!(
            "soft@::1".parse::<SoftDeviceName>().unwrap().to_string(),
            "soft@[::1]:4791"
        );
        assert_eq!(
            "soft-".parse::<SoftDeviceName>(),
            Err(SoftNameError::NoInterface("soft-".into()))
        );
        for bad in [
            "soft@",
            "soft@1.2.3",
            "soft@::1:x",
            "soft@[::1]",
            "soft@host:1",
        ] {
            assert_eq!(
                bad.parse::<SoftDeviceName>(),
                Err(SoftNameError::BadAddress { name: bad.into() }),
                "{bad}"
            );
            assert!(matches!(
                soft_device_addr(bad),
                Some(Err(Error::NoSuchDevice(n))) if n == bad
            ));
        }
        assert!(soft_device_addr("mlx5_0").is_none());
        assert!(soft_device_addr("soft-lo").is_none());
        assert!(matches!(
            SoftProvider::new().open("soft@nope"),
            Err(Error::NoSuchDevice(_))
        ));
        assert!(matches!(
            SoftProvider::new().open("soft-no-such-interface"),
            Err(Error::NoSuchDevice(_))
        ));
    }
}
