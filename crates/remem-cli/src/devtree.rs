//! What `remem run` puts under `/dev/infiniband` and `/sys/class` for the drop-in's devices:
//! the files a kernel rxe device has there, with the values the drop-in reports, and only
//! values that are exact for every process the tree is shown to.
//!
//! For each device of `REMEM_IBV_DEVICES` (the drop-in's configuration, read with the
//! drop-in's own parser, `remem_soft::dropin`), at list index `i`, named `N`:
//!
//! - `/dev/infiniband/uverbs<i>` (the device's `ibv_device.dev_name`), and
//!   `/dev/infiniband/rdma_cm`: character devices programs may open for reading and
//!   writing, as UCX checks before it lists a device (`stat` says a character device,
//!   `access(R_OK|W_OK)` succeeds). They are `/dev/null` under another name: the drop-in
//!   never opens them (its verbs are in the library).
//! - `/sys/class/infiniband/N/`: `node_type` (`1: CA`), `node_guid` and `sys_image_guid`
//!   (`ibv_get_device_guid`'s), `parent` (the interface, as rxe's attribute), and
//!   `ports/1/`: `state`, `phys_state`, `link_layer` (`Ethernet`), `lid`, `sm_lid`,
//!   `lid_mask_count`, `sm_sl` (0 on RoCE), `gids/K`, `gid_attrs/types/K` (`RoCE v2`)
//!   and `gid_attrs/ndevs/K` (the interface) for each entry `K` of the drop-in's GID table
//!   (`remem_soft::dropin::program_gid_table`, the table `ibv_query_gid` reads).
//! - `/sys/class/infiniband_verbs/uverbs<i>/ibdev` (`N`): the device's `dev_path`.
//!
//! Not there: `device` (the PCI device of a hardware NIC; a soft device has none, as rxe on
//! `lo`), `fw_ver`, `rate`, `cap_mask`, counters.
//!
//! The default devices (`REMEM_IBV_DEVICES` unset: the host's, `rxe0` on `127.0.0.1`,
//! then one per interface) and named ones have every file. A `private` device (a
//! loopback address each process picks for itself, `127.a.b.c`) has what is the same in
//! every process: its state, its GID types and interfaces, and the GIDs that do not depend
//! on the address; the GID of the process's own address and the node GUID (made from the
//! address) are left out, since one tree serves every process of the run: a program
//! reading them gets ENOENT, and `ibv_query_gid` still answers.

use remem::verbs::{GidEntry, GidType, PortState};
use remem_soft::dropin::{self, DeviceConfig, Spec};
use std::fmt::Write as _;
use std::net::IpAddr;
use std::path::PathBuf;

/// One thing the tree holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    /// A directory.
    Dir,
    /// A read-only file with this content.
    File(String),
    /// A character device programs can open for reading and writing (`/dev/null`, bound
    /// under the device's name).
    CharDev,
}

/// The tree: absolute paths, each directory before what it holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tree {
    /// What goes under `/dev`.
    pub dev: Vec<(PathBuf, Node)>,
    /// What goes under `/sys/class`.
    pub sys: Vec<(PathBuf, Node)>,
}

/// The directories of `/dev` the tree replaces (everything else stays as it is).
pub const DEV_OWN: &[&str] = &["infiniband"];
/// The directories of `/sys/class` the tree replaces.
pub const SYS_OWN: &[&str] = &["infiniband", "infiniband_verbs"];

/// What the tree knows of one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceFacts {
    /// The device's name.
    pub name: String,
    /// Its node GUID (host order), when the same for every process.
    pub guid: Option<u64>,
    /// Its interface, when it has one.
    pub netdev: Option<String>,
    /// The port's state.
    pub state: PortState,
    /// The GID table: per index, the type, the interface and the GID (`None` where it
    /// differs between processes).
    pub gids: Vec<GidFacts>,
}

/// One GID table entry as the tree shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GidFacts {
    /// RoCE v1 or v2.
    pub gid_type: GidType,
    /// The interface the entry belongs to.
    pub netdev: Option<String>,
    /// The GID, when the same for every process.
    pub gid: Option<[u8; 16]>,
}

impl GidFacts {
    fn exact(e: &GidEntry) -> GidFacts {
        GidFacts {
            gid_type: e.gid_type,
            netdev: e.netdev.clone(),
            gid: Some(e.gid.0),
        }
    }
}

/// The facts of each configured device, as the drop-in will list them; `Err` names the
/// device the drop-in will refuse (an interface that is not there).
pub fn facts(configs: &[DeviceConfig]) -> Result<Vec<DeviceFacts>, String> {
    configs.iter().map(device_facts).collect()
}

fn device_facts(c: &DeviceConfig) -> Result<DeviceFacts, String> {
    let name = c.name.clone();
    let host = std::net::SocketAddr::new(
        std::net::Ipv4Addr::LOCALHOST.into(),
        remem_soft::ROCEV2_UDP_PORT,
    );
    let spec = match &c.spec {
        Spec::Loopback => Spec::Soft(host),
        s => s.clone(),
    };
    Ok(match &spec {
        Spec::Soft(addr) => {
            let table = dropin::program_gid_table(addr.ip());
            DeviceFacts {
                name,
                guid: Some(dropin::guid_for_addr(*addr)),
                netdev: table.iter().find_map(|e| e.netdev.clone()),
                state: PortState::Active,
                gids: table.iter().map(GidFacts::exact).collect(),
            }
        }
        Spec::Netdev(ifname) => {
            let netdev = remem_soft::list_netdevs()
                .map_err(|e| format!("cannot list interfaces: {e}"))?
                .into_iter()
                .find(|n| &n.name == ifname)
                .ok_or_else(|| format!("{name}: no interface `{ifname}` with an IP address"))?;
            DeviceFacts {
                name,
                guid: Some(netdev.node_guid()),
                netdev: Some(netdev.name.clone()),
                state: netdev.port_state(),
                gids: dropin::program_gid_table_of(&netdev)
                    .iter()
                    .map(GidFacts::exact)
                    .collect(),
            }
        }
        Spec::Loopback | Spec::PrivateLoopback => {
            // Two processes' tables: what they share is what every process has.
            let a = dropin::program_gid_table(IpAddr::V4(dropin::loopback_candidate(1000, 0)));
            let b = dropin::program_gid_table(IpAddr::V4(dropin::loopback_candidate(2000, 0)));
            DeviceFacts {
                name,
                guid: None,
                netdev: a.iter().find_map(|e| e.netdev.clone()),
                state: PortState::Active,
                gids: common_entries(&a, &b),
            }
        }
    })
}

/// The entries of two processes' tables, index by index, with the GIDs they do not share
/// left out; the table ends where the types or interfaces differ.
fn common_entries(a: &[GidEntry], b: &[GidEntry]) -> Vec<GidFacts> {
    a.iter()
        .zip(b)
        .take_while(|(x, y)| x.gid_type == y.gid_type && x.netdev == y.netdev)
        .map(|(x, y)| GidFacts {
            gid_type: x.gid_type,
            netdev: x.netdev.clone(),
            gid: (x.gid == y.gid).then_some(x.gid.0),
        })
        .collect()
}

/// A GUID as sysfs writes it: four groups of four hex digits.
pub fn guid_text(guid: u64) -> String {
    let b = guid.to_be_bytes();
    format!(
        "{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}",
        b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]
    )
}

/// A GID as sysfs writes it (`%pI6`): eight groups of four hex digits.
pub fn gid_text(gid: &[u8; 16]) -> String {
    let mut s = String::with_capacity(39);
    for (i, pair) in gid.chunks(2).enumerate() {
        if i > 0 {
            s.push(':');
        }
        let _ = write!(s, "{:02x}{:02x}", pair[0], pair[1]);
    }
    s
}

/// A GID type as `gid_attrs/types/K` writes it.
pub fn gid_type_text(t: GidType) -> &'static str {
    match t {
        GidType::Ib | GidType::RoceV1 => "IB/RoCE v1",
        GidType::RoceV2 => "RoCE v2",
    }
}

/// `ports/1/state` and `ports/1/phys_state` of a port in `state` (as the kernel writes
/// them; rxe's physical state is LinkUp when the interface is up, Disabled otherwise).
pub fn state_texts(state: PortState) -> (String, &'static str) {
    let name = match state {
        PortState::Nop => "NOP",
        PortState::Down => "DOWN",
        PortState::Init => "INIT",
        PortState::Armed => "ARMED",
        PortState::Active => "ACTIVE",
        PortState::ActiveDefer => "ACTIVE_DEFER",
    };
    let phys = if state == PortState::Active {
        "5: LinkUp"
    } else {
        "3: Disabled"
    };
    (format!("{}: {name}", state as u32), phys)
}

/// The tree for `devices` (in list order).
pub fn tree(devices: &[DeviceFacts]) -> Tree {
    let mut t = Tree::default();
    let dev = PathBuf::from("/dev/infiniband");
    t.dev.push((dev.clone(), Node::Dir));
    for i in 0..devices.len() {
        t.dev.push((dev.join(dropin::dev_name(i)), Node::CharDev));
    }
    if !devices.is_empty() {
        t.dev.push((dev.join("rdma_cm"), Node::CharDev));
    }
    let file = |s: &str| Node::File(format!("{s}\n"));
    let ib = PathBuf::from("/sys/class/infiniband");
    let verbs = PathBuf::from("/sys/class/infiniband_verbs");
    t.sys.push((ib.clone(), Node::Dir));
    t.sys.push((verbs.clone(), Node::Dir));
    for (i, d) in devices.iter().enumerate() {
        let top = PathBuf::from(dropin::ibdev_path(&d.name));
        t.sys.push((top.clone(), Node::Dir));
        t.sys.push((top.join("node_type"), file("1: CA")));
        if let Some(g) = d.guid {
            t.sys.push((top.join("node_guid"), file(&guid_text(g))));
            t.sys
                .push((top.join("sys_image_guid"), file(&guid_text(g))));
        }
        if let Some(n) = &d.netdev {
            t.sys.push((top.join("parent"), file(n)));
        }
        let port = top.join("ports/1");
        t.sys.push((top.join("ports"), Node::Dir));
        t.sys.push((port.clone(), Node::Dir));
        let (state, phys) = state_texts(d.state);
        for (name, value) in [
            ("state", state.as_str()),
            ("phys_state", phys),
            ("link_layer", "Ethernet"),
            ("lid", "0x0"),
            ("sm_lid", "0x0"),
            ("lid_mask_count", "0"),
            ("sm_sl", "0"),
        ] {
            t.sys.push((port.join(name), file(value)));
        }
        for dir in ["gids", "gid_attrs", "gid_attrs/types", "gid_attrs/ndevs"] {
            t.sys.push((port.join(dir), Node::Dir));
        }
        for (k, g) in d.gids.iter().enumerate() {
            if let Some(gid) = &g.gid {
                t.sys
                    .push((port.join(format!("gids/{k}")), file(&gid_text(gid))));
            }
            t.sys.push((
                port.join(format!("gid_attrs/types/{k}")),
                file(gid_type_text(g.gid_type)),
            ));
            if let Some(n) = &g.netdev {
                t.sys
                    .push((port.join(format!("gid_attrs/ndevs/{k}")), file(n)));
            }
        }
        let uverbs = PathBuf::from(dropin::dev_path(i));
        t.sys.push((uverbs.clone(), Node::Dir));
        t.sys.push((uverbs.join("ibdev"), file(&d.name)));
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use remem::verbs::Gid;

    fn content<'a>(t: &'a [(PathBuf, Node)], path: &str) -> Option<&'a str> {
        t.iter().find_map(|(p, n)| match n {
            Node::File(s) if p == &PathBuf::from(path) => Some(s.as_str()),
            _ => None,
        })
    }

    fn entry(gid: &str, gid_type: GidType, netdev: Option<&str>) -> GidEntry {
        let ip: IpAddr = gid.parse().unwrap();
        GidEntry {
            index: 0,
            gid: Gid::from(ip),
            gid_type,
            port_num: 1,
            netdev: netdev.map(str::to_string),
        }
    }

    #[test]
    fn texts_are_the_kernel_s() {
        assert_eq!(guid_text(0x0200_12b7_7f00_0065), "0200:12b7:7f00:0065");
        let ip: IpAddr = "127.0.0.9".parse().unwrap();
        assert_eq!(
            gid_text(&Gid::from(ip).0),
            "0000:0000:0000:0000:0000:ffff:7f00:0009"
        );
        assert_eq!(gid_type_text(GidType::RoceV2), "RoCE v2");
        assert_eq!(gid_type_text(GidType::RoceV1), "IB/RoCE v1");
        assert_eq!(
            state_texts(PortState::Active),
            ("4: ACTIVE".into(), "5: LinkUp")
        );
        assert_eq!(
            state_texts(PortState::Down),
            ("1: DOWN".into(), "3: Disabled")
        );
    }

    #[test]
    fn a_soft_device_is_described_in_full_from_the_drop_in_s_table() {
        let configs = dropin::parse_devices(Some("rxe0=soft@127.0.0.9,x=soft@127.0.0.10"))
            .expect("valid configuration");
        let f = facts(&configs).unwrap();
        let t = tree(&f);
        let table = dropin::program_gid_table("127.0.0.9".parse().unwrap());
        assert!(!table.is_empty());
        let port = "/sys/class/infiniband/rxe0/ports/1";
        for e in &table {
            let k = e.index;
            assert_eq!(
                content(&t.sys, &format!("{port}/gids/{k}")),
                Some(format!("{}\n", gid_text(&e.gid.0)).as_str())
            );
            assert_eq!(
                content(&t.sys, &format!("{port}/gid_attrs/types/{k}")),
                Some("RoCE v2\n")
            );
            let ndev = e.netdev.as_ref().map(|n| format!("{n}\n"));
            assert_eq!(
                content(&t.sys, &format!("{port}/gid_attrs/ndevs/{k}")),
                ndev.as_deref()
            );
        }
        // No entry past the table.
        let past = table.len();
        assert_eq!(content(&t.sys, &format!("{port}/gids/{past}")), None);
        // The IPv4 GID of the configured address is there.
        assert!(
            table
                .iter()
                .any(|e| e.gid.to_ip() == "127.0.0.9".parse::<IpAddr>().unwrap())
        );
        assert_eq!(
            content(&t.sys, "/sys/class/infiniband/rxe0/node_guid"),
            Some("0200:12b7:7f00:0009\n")
        );
        assert_eq!(
            content(&t.sys, "/sys/class/infiniband/rxe0/node_type"),
            Some("1: CA\n")
        );
        assert_eq!(
            content(&t.sys, &format!("{port}/state")),
            Some("4: ACTIVE\n")
        );
        assert_eq!(
            content(&t.sys, &format!("{port}/link_layer")),
            Some("Ethernet\n")
        );
        // The second device: uverbs1, its own class directories.
        assert_eq!(
            content(&t.sys, "/sys/class/infiniband_verbs/uverbs1/ibdev"),
            Some("x\n")
        );
        let devs: Vec<_> = t.dev.iter().map(|(p, _)| p.clone()).collect();
        assert_eq!(
            devs,
            [
                "/dev/infiniband",
                "/dev/infiniband/uverbs0",
                "/dev/infiniband/uverbs1",
                "/dev/infiniband/rdma_cm"
            ]
            .map(PathBuf::from)
        );
        // Every file's directory comes before it.
        for (i, (p, _)) in t.sys.iter().enumerate().skip(2) {
            let parent = p.parent().unwrap();
            assert!(
                t.sys[..i]
                    .iter()
                    .any(|(q, n)| q == parent && *n == Node::Dir),
                "{} before its directory",
                p.display()
            );
        }
    }

    #[test]
    fn a_private_device_shows_only_what_every_process_shares() {
        // Two processes' tables: the address GID differs, the link-local one does not.
        let a = [
            entry("fe80::200:ff:fe00:0", GidType::RoceV2, Some("lo")),
            entry("127.0.0.2", GidType::RoceV2, Some("lo")),
        ];
        let b = [
            entry("fe80::200:ff:fe00:0", GidType::RoceV2, Some("lo")),
            entry("127.0.0.3", GidType::RoceV2, Some("lo")),
        ];
        let c = common_entries(&a, &b);
        assert_eq!(c.len(), 2);
        assert_eq!(c[0].gid, Some(a[0].gid.0));
        assert_eq!(c[1].gid, None);
        assert_eq!(c[1].gid_type, GidType::RoceV2);
        assert_eq!(c[1].netdev.as_deref(), Some("lo"));
        // A private device as `remem run` describes it: no GUID, no address GID.
        let f = facts(&dropin::parse_devices(Some("rxe0=private")).unwrap()).unwrap();
        assert_eq!(f[0].name, "rxe0");
        assert_eq!(f[0].guid, None);
        let t = tree(&f);
        assert_eq!(
            content(&t.sys, "/sys/class/infiniband/rxe0/node_guid"),
            None
        );
        let mine = dropin::program_gid_table(IpAddr::V4(dropin::loopback_candidate(
            std::process::id(),
            0,
        )));
        let other = dropin::program_gid_table(IpAddr::V4(dropin::loopback_candidate(
            std::process::id() + 1,
            0,
        )));
        for (k, e) in mine.iter().enumerate() {
            assert_eq!(
                content(
                    &t.sys,
                    &format!("/sys/class/infiniband/rxe0/ports/1/gid_attrs/types/{k}")
                ),
                Some(format!("{}\n", gid_type_text(e.gid_type)).as_str())
            );
            // A GID made from the process's own address (the IPv4 one, and the link-local
            // one made from it) is absent; one every process has (lo's ::1) is there.
            let path = format!("/sys/class/infiniband/rxe0/ports/1/gids/{k}");
            if other[k].gid == e.gid {
                assert_eq!(
                    content(&t.sys, &path),
                    Some(format!("{}\n", gid_text(&e.gid.0)).as_str()),
                    "{path}"
                );
            } else {
                assert_eq!(content(&t.sys, &path), None, "{path}");
            }
        }
    }

    #[test]
    fn the_default_device_is_the_hosts_on_127_0_0_1() {
        // Every process shares it: its GUID and GIDs are the same in all of them.
        let f = facts(&dropin::parse_devices(None).unwrap()).unwrap();
        let host: std::net::SocketAddr = "127.0.0.1:4791".parse().unwrap();
        assert_eq!(f[0].name, "rxe0");
        assert_eq!(f[0].guid, Some(dropin::guid_for_addr(host)));
        let t = tree(&f);
        let table = dropin::program_gid_table(host.ip());
        let v4 = table
            .iter()
            .position(|e| e.gid.0 == remem::verbs::Gid::from(host.ip()).0)
            .expect("127.0.0.1's GID");
        assert_eq!(
            content(
                &t.sys,
                &format!("/sys/class/infiniband/rxe0/ports/1/gids/{v4}")
            ),
            Some(format!("{}\n", gid_text(&table[v4].gid.0)).as_str())
        );
    }

    #[test]
    fn a_missing_interface_is_named() {
        let c = dropin::parse_devices(Some("r=no-such-if0")).unwrap();
        let err = facts(&c).unwrap_err();
        assert!(err.contains("no-such-if0"), "{err}");
    }
}
