//! Network interfaces a soft device can sit on, and the GID table rxe would build for them.

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

    /// The GID table of a soft device on this interface: its bound address as a RoCE v1
    /// entry followed by a RoCE v2 entry, as the kernel lays out a RoCE GID table (so the
    /// IPv4 RoCE v2 GID is index 1, as on an rxe device whose interface has one IPv4 address
    /// and no IPv6). Soft devices speak RoCE v2 only; the v1 entry keeps the indices, and
    /// using it is an error.
    pub fn gid_table(&self) -> Vec<GidEntry> {
        gid_table_for(self.primary(), Some(&self.name))
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

/// The two GID entries (RoCE v1, RoCE v2) of one address.
pub fn gid_table_for(addr: Option<IpAddr>, netdev: Option<&str>) -> Vec<GidEntry> {
    let Some(addr) = addr else {
        return Vec::new();
    };
    [GidType::RoceV1, GidType::RoceV2]
        .into_iter()
        .enumerate()
        .map(|(index, gid_type)| GidEntry {
            index: index as u32,
            gid: Gid::from(addr),
            gid_type,
            port_num: 1,
            netdev: netdev.map(str::to_string),
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
            Netdev {
                name: iface.name.clone(),
                index: iface.index.unwrap_or(0),
                addrs: Vec::new(),
                mtu,
                up,
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
        }
    }

    #[test]
    fn gid_table_pairs_v1_and_v2_of_the_bound_address() {
        let t = lo().gid_table();
        assert_eq!(t.len(), 2);
        assert_eq!(t[1].gid_type, GidType::RoceV2);
        assert_eq!(
            t[1].gid.to_string(),
            "0000:0000:0000:0000:0000:ffff:7f00:0001"
        );
        assert_eq!(t[0].gid, t[1].gid);
        assert_eq!(t[0].gid_type, GidType::RoceV1);
        assert!(t.iter().enumerate().all(|(i, e)| e.index == i as u32));
        let v6only = Netdev {
            addrs: vec!["::1".parse().unwrap()],
            ..lo()
        };
        assert_eq!(
            v6only.gid_table()[1].gid.to_ip(),
            "::1".parse::<IpAddr>().unwrap()
        );
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
