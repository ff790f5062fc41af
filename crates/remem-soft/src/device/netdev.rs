//! Network interfaces a soft device can sit on, and the GID table rxe would build for them.
//!
//! # The GID table
//!
//! Kernel rxe lists RoCE v2 GIDs only (its port supports no RoCE v1), in the order the
//! kernel's `roce_gid_mgmt` adds them: the netdev's default GID first (index 0:
//! `fe80::/64` and the modified EUI-64 of the netdev's MAC, `make_default_gid`), then the
//! netdev's IPv4 addresses as IPv4-mapped GIDs (`::ffff:a.b.c.d`), then its other IPv6
//! addresses. A soft device binds one address, so [`gid_table_for`] lists:
//!
//! | index | GID | sends from |
//! |---|---|---|
//! | 0 | the link-local default GID ([`link_local_gid`]) | the bound address |
//! | 1 | the bound address (`::ffff:a.b.c.d` for IPv4) | the bound address |
//! | 2.. | the netdev's other IPv6 addresses | — (refused as a source: not bound) |
//!
//! so programs written for rxe's indexes (`-x 1`, `-g 1`, and UCX, which takes the first
//! RoCE v2 IPv4 GID: [`first_roce_v2_ipv4`]) work unchanged. Every entry is RoCE v2.
//!
//! Every packet leaves from the bound address: index 0 is another name of the device, as
//! the default GID is of an rxe port. On `lo` (MAC 00:00:00:00:00:00) rxe's default GID is
//! `fe80::200:ff:fe00:0`, one name for the one rxe device every process shares; soft devices
//! are one per process (each on its own `127.a.b.c`), so a device on a loopback address
//! takes `a.b.c` as the last three bytes of lo's all-zero MAC: its link-local GID is
//! `fe80::200:ff:fe{a}:{b}{c}` (rxe's exactly for `127.0.0.0`), distinct per device, and
//! [`wire_gid`] maps it back to `127.a.b.c`, so a peer that names a device by its index-0
//! GID reaches it. A link-local GID of a device on another interface names an address
//! only on that link's IPv6, which soft devices do not speak: such a destination is refused
//! (use index 1).

pub use remem_verbs::first_roce_v2_ipv4;
use remem_verbs::{DeviceInfo, Gid, GidEntry, GidType, Mtu, PortState, Result};
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

/// A network interface with its addresses, MTU and state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Netdev {
    /// Interface name (`lo`, `eth0`).
    pub name: String,
    /// Interface index.
    pub index: u32,
    /// Its IP addresses, in GID table order (see [`Netdev::gid_table`]).
    pub addrs: Vec<IpAddr>,
    /// The interface MTU (bytes of IP packet).
    pub mtu: u32,
    /// Whether the interface is up (`operstate` `up`, or `unknown` as loopback reports).
    pub up: bool,
    /// Its hardware address (`/sys/class/net/<name>/address`), where it has a 6-byte one
    /// (`lo`: all zero).
    pub mac: Option<[u8; 6]>,
}

impl Netdev {
    /// The soft device name for this interface: `soft-<name>`.
    pub fn device_name(&self) -> String {
        format!("soft-{}", self.name)
    }

    /// The active MTU of a device on this interface (as rxe: the largest IB MTU that fits
    /// the interface MTU minus 80 bytes of headers).
    pub fn active_mtu(&self) -> Mtu {
        Mtu::for_netdev_mtu(self.mtu)
    }

    /// The port state a device on this interface reports.
    pub fn port_state(&self) -> PortState {
        if self.up {
            PortState::Active
        } else {
            PortState::Down
        }
    }

    /// The node GUID: derived from the interface index and name, stable across runs.
    pub fn node_guid(&self) -> u64 {
        // FNV-1a over the name, mixed with the index; the top byte marks a soft device.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in self.name.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        (h ^ u64::from(self.index)) & 0x00ff_ffff_ffff_ffff | 0x0200_0000_0000_0000
    }

    /// The address a soft device on this interface binds: its first IPv4 address, else its
    /// first IPv6 address.
    pub fn primary(&self) -> Option<IpAddr> {
        self.addrs
            .iter()
            .find(|a| a.is_ipv4())
            .or(self.addrs.first())
            .copied()
    }

    /// The GID table of a soft device on this interface bound to its primary address
    /// ([`gid_table_for`]).
    pub fn gid_table(&self) -> Vec<GidEntry> {
        gid_table_for(self.primary(), Some(self))
    }

    /// What [`Provider::devices`](remem_verbs::Provider::devices) reports for a soft
    /// device on this interface listening on `port`.
    pub fn device_info(&self, port: u16) -> DeviceInfo {
        DeviceInfo {
            name: self.device_name(),
            provider: "soft",
            node_guid: self.node_guid(),
            netdev: Some(self.name.clone()),
            gids: self.gid_table(),
            udp_addr: self.primary().map(|ip| SocketAddr::new(ip, port)),
        }
    }
}

/// The default GID the kernel gives a RoCE port on a netdev with hardware address `mac`
/// (`make_default_gid`): `fe80::/64` and the modified EUI-64 of the MAC (`ff:fe` in the
/// middle, the universal/local bit flipped). For `lo`'s all-zero MAC: `fe80::200:ff:fe00:0`.
pub fn default_gid(mac: [u8; 6]) -> Gid {
    let mut raw = [0u8; 16];
    raw[0] = 0xfe;
    raw[1] = 0x80;
    raw[8] = mac[0] ^ 0x02;
    raw[9] = mac[1];
    raw[10] = mac[2];
    raw[11] = 0xff;
    raw[12] = 0xfe;
    raw[13..16].copy_from_slice(&mac[3..6]);
    Gid(raw)
}

/// The link-local GID (index 0) of a soft device bound to `addr` on a netdev with hardware
/// address `mac` (`None`: no netdev or no 6-byte address, taken as all zero): the
/// [`default_gid`] of the MAC; on an all-zero MAC with a loopback IPv4 address `127.a.b.c`,
/// that of `00:00:00:a:b:c`, so each process's loopback device has its own (see the
/// module docs; [`wire_gid`] maps it back).
pub fn link_local_gid(addr: IpAddr, mac: Option<[u8; 6]>) -> Gid {
    let mac = mac.unwrap_or([0; 6]);
    match addr.to_canonical() {
        IpAddr::V4(v4) if mac == [0; 6] && v4.is_loopback() => {
            let o = v4.octets();
            default_gid([0, 0, 0, o[1], o[2], o[3]])
        }
        _ => default_gid(mac),
    }
}

/// The GID whose address packets to `gid` go to: a loopback device's link-local GID
/// ([`link_local_gid`], `fe80::200:ff:fe{a}:{b}{c}`) stands for `::ffff:127.a.b.c`; every
/// other GID for itself.
pub fn wire_gid(gid: Gid) -> Gid {
    let r = gid.0;
    let prefix = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x02, 0, 0, 0xff, 0xfe];
    if r[..13] == prefix {
        return Gid::from(std::net::Ipv4Addr::new(127, r[13], r[14], r[15]));
    }
    gid
}

/// Whether `gid` is an IPv6 link-local address (`fe80::/10`).
pub fn is_link_local(gid: &Gid) -> bool {
    gid.0[0] == 0xfe && gid.0[1] & 0xc0 == 0x80
}

/// The GID table (port 1) of a soft device bound to `addr` on `netdev` (`None`: no
/// interface has the address): rxe's layout, RoCE v2 only — index 0 the link-local GID
/// ([`link_local_gid`]), index 1 the bound address, then the netdev's other IPv6
/// addresses (see the module docs). Empty without an address. Pure: what `remem run`
/// writes into its sysfs tree and what the device reports agree.
pub fn gid_table_for(addr: Option<IpAddr>, netdev: Option<&Netdev>) -> Vec<GidEntry> {
    let Some(addr) = addr.map(|a| a.to_canonical()) else {
        return Vec::new();
    };
    let mut gids = vec![
        link_local_gid(addr, netdev.and_then(|n| n.mac)),
        Gid::from(addr),
    ];
    for a in netdev.map_or(&[][..], |n| &n.addrs[..]) {
        if let IpAddr::V6(v6) = a.to_canonical() {
            let g = Gid::from(v6);
            if !gids.contains(&g) {
                gids.push(g);
            }
        }
    }
    gids.into_iter()
        .enumerate()
        .map(|(index, gid)| GidEntry {
            index: index as u32,
            gid,
            gid_type: GidType::RoceV2,
            port_num: 1,
            netdev: netdev.map(|n| n.name.clone()),
        })
        .collect()
}

/// Orders addresses as the kernel fills a RoCE GID table: IPv6 link-local first (the
/// default GID), then IPv4, then the other IPv6 addresses.
fn gid_order(ip: &IpAddr) -> u8 {
    match ip {
        IpAddr::V6(v6) if v6.is_unicast_link_local() => 0,
        IpAddr::V4(_) => 1,
        IpAddr::V6(_) => 2,
    }
}

/// A 6-byte hardware address `aa:bb:cc:dd:ee:ff`.
fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = s.split(':');
    for b in &mut mac {
        *b = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

/// The netdev a soft device bound to `ip` sits on: the one that has the address, else for a
/// loopback address (a process's own `127.a.b.c`) the loopback interface.
pub fn netdev_of(list: Vec<Netdev>, ip: IpAddr) -> Option<Netdev> {
    let ip = ip.to_canonical();
    let exact = list.iter().position(|n| n.addrs.contains(&ip));
    let lo = || {
        list.iter().position(|n| {
            ip.is_loopback()
                && n.addrs
                    .iter()
                    .any(|a| a.is_loopback() && a.is_ipv4() == ip.is_ipv4())
        })
    };
    let i = exact.or_else(lo)?;
    list.into_iter().nth(i)
}

fn read_sys(netdev: &str, attr: &str) -> Option<String> {
    std::fs::read_to_string(format!("/sys/class/net/{netdev}/{attr}"))
        .ok()
        .map(|s| s.trim().to_string())
}

/// The host's network interfaces that have at least one IP address, sorted by index.
pub fn list_netdevs() -> Result<Vec<Netdev>> {
    let mut by_name: BTreeMap<String, Netdev> = BTreeMap::new();
    for iface in if_addrs::get_if_addrs()? {
        let ip = iface.ip();
        let entry = by_name.entry(iface.name.clone()).or_insert_with(|| {
            let mtu = read_sys(&iface.name, "mtu")
                .and_then(|s| s.parse().ok())
                .unwrap_or(1500);
            let up = read_sys(&iface.name, "operstate")
                .map(|s| s == "up" || s == "unknown")
                .unwrap_or(true);
            let mac = read_sys(&iface.name, "address").and_then(|s| parse_mac(&s));
            Netdev {
                name: iface.name.clone(),
                index: iface.index.unwrap_or(0),
                addrs: Vec::new(),
                mtu,
                up,
                mac,
            }
        });
        if !entry.addrs.contains(&ip) {
            entry.addrs.push(ip);
        }
    }
    let mut list: Vec<Netdev> = by_name.into_values().collect();
    for n in &mut list {
        n.addrs.sort_by_key(gid_order);
    }
    list.sort_by_key(|n| (n.index, n.name.clone()));
    Ok(list)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lo() -> Netdev {
        Netdev {
            name: "lo".into(),
            index: 1,
            addrs: vec!["127.0.0.1".parse().unwrap(), "::1".parse().unwrap()],
            mtu: 65536,
            up: true,
            mac: Some([0; 6]),
        }
    }

    #[test]
    fn gid_table_is_rxes_layout() {
        let t = lo().gid_table();
        let shown: Vec<String> = t.iter().map(|e| e.gid.to_string()).collect();
        // rxe on lo: the default GID of the all-zero MAC, then 127.0.0.1, then ::1.
        assert_eq!(
            shown,
            [
                "fe80:0000:0000:0000:0200:00ff:fe00:0001",
                "0000:0000:0000:0000:0000:ffff:7f00:0001",
                "0000:0000:0000:0000:0000:0000:0000:0001",
            ]
        );
        assert!(t.iter().all(|e| e.gid_type == GidType::RoceV2
            && e.port_num == 1
            && e.netdev.as_deref() == Some("lo")));
        assert!(t.iter().enumerate().all(|(i, e)| e.index == i as u32));
        assert_eq!(first_roce_v2_ipv4(&t).map(|e| e.index), Some(1));
        // A process's own loopback address: its a.b.c in the link-local GID, and back.
        let t = gid_table_for(Some("127.3.4.5".parse().unwrap()), Some(&lo()));
        assert_eq!(
            t[0].gid.to_string(),
            "fe80:0000:0000:0000:0200:00ff:fe03:0405"
        );
        assert_eq!(wire_gid(t[0].gid), t[1].gid);
        assert_eq!(wire_gid(t[1].gid), t[1].gid);
        assert!(is_link_local(&t[0].gid) && !is_link_local(&t[1].gid));
        // An interface with a real MAC: the kernel's EUI-64 default GID, not reversible.
        let eth = Netdev {
            name: "eth0".into(),
            index: 2,
            addrs: vec![
                "fe80::5054:ff:fe28:c219".parse().unwrap(),
                "10.1.2.3".parse().unwrap(),
                "2001:db8::7".parse().unwrap(),
            ],
            mtu: 1500,
            up: true,
            mac: parse_mac("52:54:00:28:c2:19"),
        };
        let t = eth.gid_table();
        assert_eq!(
            t.len(),
            3,
            "the link-local address is the default GID: once"
        );
        assert_eq!(
            t[0].gid.to_ipv6(),
            "fe80::5054:ff:fe28:c219"
                .parse::<std::net::Ipv6Addr>()
                .unwrap()
        );
        assert_eq!(t[1].gid.to_ip(), "10.1.2.3".parse::<IpAddr>().unwrap());
        assert_eq!(t[2].gid.to_ip(), "2001:db8::7".parse::<IpAddr>().unwrap());
        assert_eq!(wire_gid(t[0].gid), t[0].gid);
        assert!(gid_table_for(None, Some(&eth)).is_empty());
        // An IPv6-only device: its address at index 1.
        let v6only = gid_table_for(Some("::1".parse().unwrap()), None);
        assert_eq!(v6only[1].gid.to_ip(), "::1".parse::<IpAddr>().unwrap());
        assert_eq!(first_roce_v2_ipv4(&v6only), None);
    }

    #[test]
    fn netdev_of_a_loopback_address_is_lo() {
        let list = vec![lo()];
        assert_eq!(
            netdev_of(list.clone(), "127.0.0.1".parse().unwrap())
                .unwrap()
                .name,
            "lo"
        );
        assert_eq!(
            netdev_of(list.clone(), "127.9.8.7".parse().unwrap())
                .unwrap()
                .name,
            "lo"
        );
        assert!(netdev_of(list, "10.0.0.1".parse().unwrap()).is_none());
        assert_eq!(parse_mac("00:00:00:00:00:00"), Some([0; 6]));
        assert_eq!(parse_mac("00:00"), None);
    }

    #[test]
    fn loopback_mtu_is_4096() {
        assert_eq!(lo().active_mtu(), Mtu::Mtu4096);
        let mut eth = lo();
        eth.mtu = 1500;
        assert_eq!(eth.active_mtu(), Mtu::Mtu1024);
    }

    #[test]
    fn link_local_first_then_v4() {
        let mut addrs: Vec<IpAddr> = vec![
            "2001:db8::1".parse().unwrap(),
            "10.0.0.1".parse().unwrap(),
            "fe80::1".parse().unwrap(),
        ];
        addrs.sort_by_key(gid_order);
        assert_eq!(addrs[0], "fe80::1".parse::<IpAddr>().unwrap());
        assert_eq!(addrs[1], "10.0.0.1".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn host_has_loopback() {
        // Every Linux host has `lo` with 127.0.0.1.
        let list = list_netdevs().unwrap();
        let lo = list.iter().find(|n| n.name == "lo").expect("no lo");
        assert!(lo.addrs.contains(&"127.0.0.1".parse().unwrap()));
        assert_eq!(lo.device_name(), "soft-lo");
        let info = lo.device_info(4791);
        assert_eq!(info.provider, "soft");
        assert!(info.gids.iter().any(|g| g.gid_type == GidType::RoceV2));
    }
}
