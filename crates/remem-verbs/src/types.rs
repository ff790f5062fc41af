//! Small value types shared by the whole model: GIDs, MTUs, port states.

#![forbid(unsafe_code)]

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// A 128-bit global identifier (`union ibv_gid`).
///
/// On RoCEv2 a GID is an IP address: IPv6 as is, IPv4 as an IPv4-mapped IPv6 address
/// (`::ffff:a.b.c.d`), as the kernel's RoCE GID table holds it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The all-zero GID (an empty GID table slot).
    pub const ZERO: Gid = Gid([0; 16]);

    /// Whether this is a multicast GID as the kernel tells one (`rdma_is_multicast_addr`):
    /// an IPv4-mapped GID whose IPv4 address is multicast (224.0.0.0/4, how RoCE maps an
    /// IPv4 group), or an IPv6 multicast address (ff00::/8).
    ///
    /// ```
    /// use remem_verbs::Gid;
    /// let g = |s: &str| Gid(s.parse::<std::net::Ipv6Addr>().unwrap().octets());
    /// assert!(g("::ffff:239.1.1.1").is_multicast());
    /// assert!(g("ff0e::1").is_multicast());
    /// assert!(!g("::ffff:127.0.0.1").is_multicast());
    /// assert!(!g("fe80::1").is_multicast());
    /// ```
    pub fn is_multicast(&self) -> bool {
        let v6 = self.to_ipv6();
        match v6.to_ipv4_mapped() {
            Some(v4) => v4.is_multicast(),
            None => v6.is_multicast(),
        }
    }

    /// The raw 16 bytes, network order.
    pub fn raw(&self) -> &[u8; 16] {
        &self.0
    }

    /// The GID as an IPv6 address.
    pub fn to_ipv6(&self) -> Ipv6Addr {
        Ipv6Addr::from(self.0)
    }

    /// The IP address this RoCEv2 GID stands for: IPv4 for an IPv4-mapped GID, else IPv6.
    pub fn to_ip(&self) -> IpAddr {
        let v6 = self.to_ipv6();
        match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        }
    }

    /// Whether this GID is an IPv4-mapped address (`::ffff:a.b.c.d`).
    pub fn is_ipv4_mapped(&self) -> bool {
        self.to_ipv6().to_ipv4_mapped().is_some()
    }

    /// The subnet prefix (upper 64 bits), as `ibv_gid.global.subnet_prefix`.
    pub fn subnet_prefix(&self) -> u64 {
        u64::from_be_bytes(self.0[..8].try_into().unwrap_or([0; 8]))
    }

    /// The interface id (lower 64 bits), as `ibv_gid.global.interface_id`.
    pub fn interface_id(&self) -> u64 {
        u64::from_be_bytes(self.0[8..].try_into().unwrap_or([0; 8]))
    }
}

impl From<IpAddr> for Gid {
    fn from(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(v4) => v4.into(),
            IpAddr::V6(v6) => v6.into(),
        }
    }
}

impl From<Ipv4Addr> for Gid {
    fn from(ip: Ipv4Addr) -> Self {
        Gid(ip.to_ipv6_mapped().octets())
    }
}

impl From<Ipv6Addr> for Gid {
    fn from(ip: Ipv6Addr) -> Self {
        Gid(ip.octets())
    }
}

impl From<[u8; 16]> for Gid {
    fn from(raw: [u8; 16]) -> Self {
        Gid(raw)
    }
}

impl fmt::Display for Gid {
    /// Formats as `ibv_devinfo -v` and `show_gids` do: eight groups of four hex digits.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, pair) in self.0.chunks_exact(2).enumerate() {
            if i > 0 {
                f.write_str(":")?;
            }
            write!(f, "{:02x}{:02x}", pair[0], pair[1])?;
        }
        Ok(())
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({self})")
    }
}

/// A path MTU (`enum ibv_mtu`): the payload size of one packet, 256 to 4096 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Mtu {
    /// `IBV_MTU_256`
    Mtu256 = 1,
    /// `IBV_MTU_512`
    Mtu512 = 2,
    /// `IBV_MTU_1024`
    Mtu1024 = 3,
    /// `IBV_MTU_2048`
    Mtu2048 = 4,
    /// `IBV_MTU_4096`
    Mtu4096 = 5,
}

impl Mtu {
    /// Every MTU, smallest first.
    pub const ALL: [Mtu; 5] = [
        Mtu::Mtu256,
        Mtu::Mtu512,
        Mtu::Mtu1024,
        Mtu::Mtu2048,
        Mtu::Mtu4096,
    ];

    /// The payload size in bytes.
    pub const fn bytes(self) -> u32 {
        128 << (self as u32)
    }

    /// The MTU of exactly `bytes` bytes, if it is one of the five IB MTUs.
    pub fn from_bytes(bytes: u32) -> Option<Mtu> {
        Self::ALL.into_iter().find(|m| m.bytes() == bytes)
    }

    /// The `enum ibv_mtu` value (1 = 256 … 5 = 4096).
    pub fn from_ibv(value: u8) -> Option<Mtu> {
        Self::ALL.into_iter().find(|m| *m as u8 == value)
    }

    /// The largest IB MTU whose packets fit a network device MTU, as rxe derives its active
    /// MTU: the netdev MTU minus 80 bytes of RoCEv2 headers (Ethernet is not counted in a
    /// netdev MTU; rxe reserves room for IPv6 + UDP + BTH + the largest extension headers +
    /// ICRC), rounded down to an IB MTU. Like rxe, a netdev too small for even 256 bytes
    /// still gets 256.
    pub fn for_netdev_mtu(netdev_mtu: u32) -> Mtu {
        let room = netdev_mtu.saturating_sub(80);
        Self::ALL
            .into_iter()
            .rev()
            .find(|m| m.bytes() <= room)
            .unwrap_or(Mtu::Mtu256)
    }
}

impl fmt::Display for Mtu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.bytes())
    }
}

/// The logical state of a port (`enum ibv_port_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum PortState {
    /// `IBV_PORT_NOP`
    Nop = 0,
    /// `IBV_PORT_DOWN`: the link is down.
    Down = 1,
    /// `IBV_PORT_INIT`
    Init = 2,
    /// `IBV_PORT_ARMED`
    Armed = 3,
    /// `IBV_PORT_ACTIVE`: the port can carry traffic.
    Active = 4,
    /// `IBV_PORT_ACTIVE_DEFER`
    ActiveDefer = 5,
}

impl fmt::Display for PortState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PortState::Nop => "PORT_NOP",
            PortState::Down => "PORT_DOWN",
            PortState::Init => "PORT_INIT",
            PortState::Armed => "PORT_ARMED",
            PortState::Active => "PORT_ACTIVE",
            PortState::ActiveDefer => "PORT_ACTIVE_DEFER",
        })
    }
}

/// The link layer of a port (`IBV_LINK_LAYER_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkLayer {
    /// `IBV_LINK_LAYER_INFINIBAND`
    InfiniBand,
    /// `IBV_LINK_LAYER_ETHERNET` (RoCE)
    Ethernet,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gid_of_ipv4_is_mapped() {
        let gid = Gid::from(Ipv4Addr::new(192, 168, 77, 1));
        assert_eq!(gid.to_string(), "0000:0000:0000:0000:0000:ffff:c0a8:4d01");
        assert!(gid.is_ipv4_mapped());
        assert_eq!(gid.to_ip(), IpAddr::V4(Ipv4Addr::new(192, 168, 77, 1)));
        assert_eq!(gid.subnet_prefix(), 0);
        assert_eq!(gid.interface_id(), 0x0000_ffff_c0a8_4d01);
    }

    #[test]
    fn gid_of_ipv6_is_itself() {
        let ip: Ipv6Addr = "fe80::1".parse().unwrap();
        let gid = Gid::from(ip);
        assert!(!gid.is_ipv4_mapped());
        assert_eq!(gid.to_ip(), IpAddr::V6(ip));
        assert_eq!(gid.subnet_prefix(), 0xfe80_0000_0000_0000);
    }

    #[test]
    fn mtu_sizes() {
        assert_eq!(Mtu::Mtu256.bytes(), 256);
        assert_eq!(Mtu::Mtu4096.bytes(), 4096);
        assert_eq!(Mtu::from_bytes(1024), Some(Mtu::Mtu1024));
        assert_eq!(Mtu::from_bytes(1000), None);
        assert_eq!(Mtu::from_ibv(5), Some(Mtu::Mtu4096));
        assert_eq!(Mtu::from_ibv(0), None);
    }

    #[test]
    fn mtu_from_netdev_as_rxe() {
        // veth 1500 -> 1024 (the captures in shared/vectors were made at this MTU)
        assert_eq!(Mtu::for_netdev_mtu(1500), Mtu::Mtu1024);
        // loopback 65536 -> 4096
        assert_eq!(Mtu::for_netdev_mtu(65536), Mtu::Mtu4096);
        // jumbo 9000 -> 4096; 4176 is exactly 4096 + 80
        assert_eq!(Mtu::for_netdev_mtu(9000), Mtu::Mtu4096);
        assert_eq!(Mtu::for_netdev_mtu(4176), Mtu::Mtu4096);
        assert_eq!(Mtu::for_netdev_mtu(4175), Mtu::Mtu2048);
        assert_eq!(Mtu::for_netdev_mtu(1104), Mtu::Mtu1024);
        assert_eq!(Mtu::for_netdev_mtu(1103), Mtu::Mtu512);
        // too small for anything: rxe still reports 256
        assert_eq!(Mtu::for_netdev_mtu(300), Mtu::Mtu256);
        assert_eq!(Mtu::for_netdev_mtu(0), Mtu::Mtu256);
    }
}
