//! The drop-in libibverbs' device configuration (`REMEM_IBV_DEVICES`) and the names its
//! devices carry: shared by `remem-ibv` (which lists and opens the devices) and `remem run`
//! (which describes them under `/dev/infiniband` and `/sys/class/infiniband`), so that the
//! two agree. Pure functions: nothing here opens a device.

#![forbid(unsafe_code)]

use crate::device::netdev::{Netdev, gid_table_for};
use remem_verbs::{GidEntry, GidType};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

/// Room for a device name in `struct ibv_device` (`IBV_SYSFS_NAME_MAX`, with its NUL).
pub const NAME_MAX: usize = 64;

/// The environment variable that configures the devices.
pub const DEVICES_ENV: &str = "REMEM_IBV_DEVICES";

/// The name of the default device.
pub const DEFAULT_NAME: &str = "rxe0";

/// What a configured device is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Spec {
    /// The default: the host's soft device on `127.0.0.1`, UDP port 4791, which every
    /// process of the user shares (`io::host`), as every process shares a kernel rxe
    /// device.
    Loopback,
    /// `private`: a soft device on a loopback address of this process's own
    /// (`127.a.b.c`, [`loopback_candidate`]): the default before the host's device.
    PrivateLoopback,
    /// `soft@IP[:PORT]`: a soft device bound to that address.
    Soft(SocketAddr),
    /// An interface name: the soft device on that interface.
    Netdev(String),
}

/// One configured device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceConfig {
    /// The name programs see (`ibv_get_device_name`).
    pub name: String,
    /// What it is.
    pub spec: Spec,
}

/// The devices when `REMEM_IBV_DEVICES` is unset: the host's NIC on each of its addresses,
/// as a host with kernel rxe has a device per interface — `rxe0` on `127.0.0.1`, then
/// `rxe1`, `rxe2`, … on each interface that is up and has an IPv4 address (its primary
/// address; interface index order). Every process lists the same ones.
pub fn default_devices() -> Vec<DeviceConfig> {
    let mut out = vec![DeviceConfig {
        name: DEFAULT_NAME.into(),
        spec: Spec::Loopback,
    }];
    let mut netdevs = crate::device::netdev::list_netdevs().unwrap_or_default();
    netdevs.sort_by_key(|n| n.index);
    for n in netdevs {
        let v4 = n.addrs.iter().any(|a| a.is_ipv4() && !a.is_loopback());
        if n.up && v4 {
            out.push(DeviceConfig {
                name: format!("rxe{}", out.len()),
                spec: Spec::Netdev(n.name),
            });
        }
    }
    out
}

/// Parses the value of `REMEM_IBV_DEVICES` (`None`: unset, [`default_devices`]).
pub fn parse_devices(value: Option<&str>) -> Result<Vec<DeviceConfig>, String> {
    let Some(value) = value else {
        return Ok(default_devices());
    };
    let mut out: Vec<DeviceConfig> = Vec::new();
    for item in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (name, spec) = item
            .split_once('=')
            .ok_or_else(|| format!("`{item}` is not name=spec"))?;
        let (name, spec) = (name.trim(), spec.trim());
        if name.is_empty() || name.len() >= NAME_MAX {
            return Err(format!("`{item}`: a device name has 1 to 63 bytes"));
        }
        if !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b))
        {
            return Err(format!(
                "`{name}`: a device name is letters, digits, `_`, `-`, `.`"
            ));
        }
        if out.iter().any(|d| d.name == name) {
            return Err(format!("device `{name}` named twice"));
        }
        let spec = match crate::soft_device_addr(spec) {
            Some(Ok(addr)) if addr.ip().is_unspecified() => {
                return Err(format!("`{spec}`: a soft device needs a specific address"));
            }
            Some(Ok(addr)) => Spec::Soft(addr),
            Some(Err(_)) => return Err(format!("`{spec}` is not soft@IP or soft@IP:PORT")),
            None if spec.is_empty() || spec.contains(['@', '=', ' ', '/']) => {
                return Err(format!(
                    "`{spec}` is neither soft@IP[:PORT] nor an interface name"
                ));
            }
            None if spec == "private" => Spec::PrivateLoopback,
            None => Spec::Netdev(spec.to_string()),
        };
        out.push(DeviceConfig {
            name: name.to_string(),
            spec,
        });
    }
    Ok(out)
}

/// The `attempt`-th loopback address for process `pid`: `127.a.b.c` with `c` in 1..=254,
/// never `127.0.0.1`; distinct for distinct `pid + attempt` below 2^24 - 2^17.
pub fn loopback_candidate(pid: u32, attempt: u32) -> Ipv4Addr {
    const SLOTS: u64 = 256 * 256 * 254;
    let mut n = u64::from(pid) + u64::from(attempt);
    loop {
        let idx = n % SLOTS;
        let (a, b, c) = (idx / (256 * 254), (idx / 254) % 256, idx % 254 + 1);
        if (a, b, c) != (0, 0, 1) {
            return Ipv4Addr::new(127, a as u8, b as u8, c as u8);
        }
        n += 1;
    }
}

/// The node GUID of a soft device bound to `addr` (host order): `02` (locally
/// administered) `00`, the port, then the IPv4 address (a hash of the IPv6 address).
pub fn guid_for_addr(addr: SocketAddr) -> u64 {
    let low = match addr.ip().to_canonical() {
        IpAddr::V4(v4) => u64::from(u32::from(v4)),
        IpAddr::V6(v6) => {
            let mut h: u64 = 0xcbf2_9ce4_8422_2325;
            for b in v6.octets() {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
            h & 0xffff_ffff
        }
    };
    0x0200_0000_0000_0000 | u64::from(addr.port()) << 32 | low
}

/// `ibv_device.dev_name` of the device at `index` of the list: `uverbs<index>`, the
/// character device a kernel provider opens, `/dev/infiniband/<dev_name>`.
pub fn dev_name(index: usize) -> String {
    format!("uverbs{index}")
}

/// `ibv_device.dev_path` of the device at `index`: its `infiniband_verbs` class directory.
pub fn dev_path(index: usize) -> String {
    format!("/sys/class/infiniband_verbs/{}", dev_name(index))
}

/// `ibv_device.ibdev_path` of the device named `name`: its `infiniband` class directory.
pub fn ibdev_path(name: &str) -> String {
    format!("/sys/class/infiniband/{name}")
}

/// The GID table the drop-in shows programs for a soft device bound to `ip`: the RoCE v2
/// entries of the soft device's table (`SoftContext::bind_with`'s: on the interface that
/// holds the address, `lo` for any loopback address; [`crate::device::netdev::netdev_of`]), indexed from 0 (soft devices speak RoCE v2 only).
/// Lists the host's interfaces.
pub fn program_gid_table(ip: IpAddr) -> Vec<GidEntry> {
    let ip = ip.to_canonical();
    let netdev = crate::device::netdev::list_netdevs()
        .ok()
        .and_then(|l| crate::device::netdev::netdev_of(l, ip));
    roce_v2_view(gid_table_for(Some(ip), netdev.as_ref()))
}

/// The GID table the drop-in shows programs for the soft device on `netdev`.
pub fn program_gid_table_of(netdev: &Netdev) -> Vec<GidEntry> {
    roce_v2_view(netdev.gid_table())
}

/// The RoCE v2 entries of `table`, indexed from 0.
fn roce_v2_view(table: Vec<GidEntry>) -> Vec<GidEntry> {
    table
        .into_iter()
        .filter(|e| e.gid_type == GidType::RoceV2)
        .enumerate()
        .map(|(i, mut e)| {
            e.index = i as u32;
            e
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(name: &str, spec: Spec) -> Vec<DeviceConfig> {
        vec![DeviceConfig {
            name: name.into(),
            spec,
        }]
    }

    #[test]
    fn unset_is_rxe0_on_127_0_0_1_then_each_interface() {
        let d = parse_devices(None).unwrap();
        assert_eq!(d[..1], one("rxe0", Spec::Loopback)[..]);
        let netdevs = crate::device::netdev::list_netdevs().unwrap();
        for (i, c) in d.iter().enumerate().skip(1) {
            assert_eq!(c.name, format!("rxe{i}"));
            let Spec::Netdev(name) = &c.spec else {
                panic!("{c:?}")
            };
            let n = netdevs.iter().find(|n| &n.name == name).unwrap();
            assert!(n.up && n.addrs.iter().any(|a| a.is_ipv4() && !a.is_loopback()));
        }
        // Every interface that is up with an IPv4 address has its device.
        let with_v4 = (netdevs.iter())
            .filter(|n| n.up && n.addrs.iter().any(|a| a.is_ipv4() && !a.is_loopback()))
            .count();
        assert_eq!(d.len(), 1 + with_v4);
    }

    #[test]
    fn empty_is_no_devices() {
        assert_eq!(parse_devices(Some("")).unwrap(), vec![]);
        assert_eq!(parse_devices(Some(" , ")).unwrap(), vec![]);
    }

    #[test]
    fn soft_and_interface_specs() {
        let d =
            parse_devices(Some("rxe0=soft@10.77.0.1, rxe1=eth0,x=soft@127.0.0.2:5000")).unwrap();
        assert_eq!(d.len(), 3);
        assert_eq!(d[0].spec, Spec::Soft("10.77.0.1:4791".parse().unwrap()));
        assert_eq!(d[1], one("rxe1", Spec::Netdev("eth0".into()))[0]);
        assert_eq!(d[2].spec, Spec::Soft("127.0.0.2:5000".parse().unwrap()));
        let v6 = parse_devices(Some("r=soft@[::1]:4791")).unwrap();
        assert_eq!(v6[0].spec, Spec::Soft("[::1]:4791".parse().unwrap()));
    }

    #[test]
    fn bad_values_are_refused() {
        for bad in [
            "rxe0",
            "=soft@1.2.3.4",
            "rxe0=",
            "rxe0=soft@nonsense",
            "rxe0=soft@0.0.0.0",
            "a=lo,a=lo",
            "bad name=lo",
            "x=a@b",
            &format!("{}=lo", "n".repeat(64)),
        ] {
            assert!(parse_devices(Some(bad)).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn loopback_candidates_are_distinct_and_never_127_0_0_1() {
        let mut seen = std::collections::HashSet::new();
        for pid in 0..5000 {
            let a = loopback_candidate(pid, 0);
            assert_ne!(a, Ipv4Addr::new(127, 0, 0, 1));
            assert!(a.is_loopback());
            assert!(a.octets()[3] != 0 && a.octets()[3] != 255);
            seen.insert(a);
        }
        assert_eq!(seen.len(), 4999, "pids 0 and 1 share 127.0.0.2");
        // The largest pid Linux hands out (2^22) is still distinct from small ones.
        assert_ne!(loopback_candidate(1 << 22, 0), loopback_candidate(100, 0));
        assert_ne!(loopback_candidate(7, 1), loopback_candidate(7, 0));
    }

    #[test]
    fn guid_shows_port_and_address() {
        let g = guid_for_addr("127.0.0.101:4791".parse().unwrap());
        assert_eq!(g, 0x0200_12b7_7f00_0065);
        let v6a = guid_for_addr("[fd00::1]:4791".parse().unwrap());
        let v6b = guid_for_addr("[fd00::2]:4791".parse().unwrap());
        assert_ne!(v6a, v6b);
    }

    #[test]
    fn device_paths_name_the_sysfs_classes() {
        assert_eq!(dev_name(2), "uverbs2");
        assert_eq!(dev_path(2), "/sys/class/infiniband_verbs/uverbs2");
        assert_eq!(ibdev_path("rxe0"), "/sys/class/infiniband/rxe0");
    }

    #[test]
    fn the_program_table_is_the_roce_v2_entries_from_index_0() {
        let ip: IpAddr = "127.0.0.9".parse().unwrap();
        let t = program_gid_table(ip);
        assert!(!t.is_empty());
        for (i, e) in t.iter().enumerate() {
            assert_eq!(e.index, i as u32);
            assert_eq!(e.gid_type, GidType::RoceV2);
        }
        assert!(t.iter().any(|e| e.gid.to_ip() == ip));
        // An IPv4-mapped address is its IPv4 address.
        let mapped: IpAddr = "::ffff:127.0.0.9".parse().unwrap();
        assert_eq!(program_gid_table(mapped), t);
    }
}
