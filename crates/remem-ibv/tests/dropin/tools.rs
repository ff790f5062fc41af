//! rdma-core's own tools (Debian `ibverbs-utils`) on the drop-in library: what they print
//! must be the soft device, real values included.

use crate::common;

use common::{DropIn, run, text, tool};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);

#[test]
fn ibv_devices_lists_the_default_rxe0() {
    let Some(ibv_devices) = tool("ibv_devices", "ibverbs-utils") else {
        return;
    };
    let d = DropIn::new("devices");
    let out = run(&mut d.command(&ibv_devices), LIMIT);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    let line = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("rxe0"))
        .unwrap_or_else(|| panic!("no rxe0 in:\n{stdout}"));
    // The GUID: 02 00, UDP port 4791 (0x12b7), then the IPv4 loopback address 127.x.y.z.
    let guid = line.split_whitespace().nth(1).unwrap();
    assert_eq!(guid.len(), 16, "{line}");
    assert!(guid.starts_with("020012b77f"), "{line}");
    // Then one device per interface with an IPv4 address, named in order.
    let names: Vec<&str> = (stdout.lines())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with("rxe"))
        .collect();
    assert_eq!(names[0], "rxe0", "{stdout}");
    for (i, n) in names.iter().enumerate() {
        assert_eq!(*n, format!("rxe{i}"), "{stdout}");
    }
}

#[test]
fn ibv_devices_shows_the_configured_devices() {
    let Some(ibv_devices) = tool("ibv_devices", "ibverbs-utils") else {
        return;
    };
    let d = DropIn::new("devices-env");
    let out = run(
        d.command(&ibv_devices).env(
            "REMEM_IBV_DEVICES",
            "mine=soft@127.0.0.9, other=soft@127.0.0.10:5000",
        ),
        LIMIT,
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        stdout.contains("mine") && stdout.contains("020012b77f000009"),
        "{stdout}"
    );
    assert!(
        stdout.contains("other") && stdout.contains("020013887f00000a"),
        "{stdout}"
    );
}

#[test]
fn a_bad_device_variable_fails_the_list_and_says_so() {
    let Some(ibv_devices) = tool("ibv_devices", "ibverbs-utils") else {
        return;
    };
    let d = DropIn::new("devices-bad");
    let out = run(
        d.command(&ibv_devices)
            .env("REMEM_IBV_DEVICES", "rxe0=soft@not-an-address"),
        LIMIT,
    );
    assert!(!out.status.success(), "{out:?}");
    let stderr = text(&out.stderr);
    assert!(stderr.contains("REMEM_IBV_DEVICES"), "{stderr}");
    assert!(stderr.contains("not-an-address"), "{stderr}");
}

#[test]
fn ibv_devinfo_v_shows_the_port_and_this_process_gid() {
    let Some(ibv_devinfo) = tool("ibv_devinfo", "ibverbs-utils") else {
        return;
    };
    let d = DropIn::new("devinfo");
    let (pid, out) = common::run_pid(d.command(&ibv_devinfo).arg("-v"), LIMIT);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    for want in [
        "hca_id:\trxe0",
        "transport:\t\t\tInfiniBand (0)",
        "fw_ver:\t\t\t\tremem-soft",
        "phys_port_cnt:\t\t\t1",
        "atomic_cap:\t\t\tATOMIC_HCA (1)",
        "state:\t\t\tPORT_ACTIVE (4)",
        "max_mtu:\t\t4096 (5)",
        "active_mtu:\t\t4096 (5)",
        "link_layer:\t\tEthernet",
        "phys_state:\t\tLINK_UP (5)",
    ] {
        assert!(stdout.contains(want), "no {want:?} in:\n{stdout}");
    }
    // The GID table, rxe's layout: the link-local default GID at index 0, this process's
    // own loopback address (unless another process held it, then a later one) at index
    // 1, then lo's IPv6 addresses; all RoCE v2.
    let gid = |i: u32| {
        stdout
            .lines()
            .find(|l| l.contains(&format!("GID[{i:>3}]")))
            .unwrap_or_else(|| panic!("no GID {i} in:\n{stdout}"))
    };
    let (ll, v2) = (gid(0), gid(1));
    assert!(stdout.contains("gid_tbl_len:\t\t"), "{stdout}");
    assert!(
        ll.contains("fe80::200:ff:fe") && ll.ends_with("RoCE v2"),
        "{ll}"
    );
    assert!(!stdout.contains("RoCE v1"), "{stdout}");
    assert!(
        v2.contains("::ffff:127.") && v2.ends_with("RoCE v2"),
        "{v2}"
    );
    let expected = common::loopback_for_pid(pid);
    if !v2.contains(&format!("::ffff:{expected},")) {
        eprintln!("note: {expected} was taken, the device moved on: {v2}");
    }
    // node_guid ends with the same address.
    let guid_line = stdout.lines().find(|l| l.contains("node_guid")).unwrap();
    let ip = v2
        .split("::ffff:")
        .nth(1)
        .unwrap()
        .split(',')
        .next()
        .unwrap();
    let ip: std::net::Ipv4Addr = ip.parse().unwrap();
    let o = ip.octets();
    let tail = format!("{:02x}{:02x}:{:02x}{:02x}", o[0], o[1], o[2], o[3]);
    assert!(guid_line.ends_with(&tail), "{guid_line} vs {ip}");
}

#[test]
fn ibv_devinfo_one_port() {
    let Some(ibv_devinfo) = tool("ibv_devinfo", "ibverbs-utils") else {
        return;
    };
    let d = DropIn::new("devinfo-port");
    let out = run(
        d.command(&ibv_devinfo).args(["-d", "rxe0", "-i", "1"]),
        LIMIT,
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(stdout.contains("port:\t1"), "{stdout}");
    assert!(stdout.contains("PORT_ACTIVE (4)"), "{stdout}");
    assert!(stdout.contains("link_layer:\t\tEthernet"), "{stdout}");

    // A device that does not exist: the tool's own error, not a crash.
    let out = run(d.command(&ibv_devinfo).args(["-d", "rxe9"]), LIMIT);
    assert!(!out.status.success());
    assert!(out.status.code().is_some(), "killed by a signal: {out:?}");
}

#[test]
fn interface_devices_are_listed_and_missing_interfaces_refused() {
    let Some(ibv_devices) = tool("ibv_devices", "ibverbs-utils") else {
        return;
    };
    let d = DropIn::new("devices-if");
    let out = run(
        d.command(&ibv_devices).env("REMEM_IBV_DEVICES", "loop=lo"),
        LIMIT,
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    let line = stdout.lines().find(|l| l.contains("loop")).unwrap();
    // remem-soft's GUID of an interface device: 02 then a hash of its name and index.
    assert!(
        line.split_whitespace().nth(1).unwrap().starts_with("02"),
        "{line}"
    );

    let out = run(
        d.command(&ibv_devices)
            .env("REMEM_IBV_DEVICES", "x=no-such-if0"),
        LIMIT,
    );
    assert!(!out.status.success(), "{out:?}");
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("REMEM_IBV_DEVICES") && stderr.contains("no-such-if0"),
        "{stderr}"
    );
}

/// perftest starts with `-z now` and links libmlx5 and libefa, which reference rdma-core's
/// provider-internal symbols: every one must resolve or the program does not start
/// ("symbol lookup error"). `-h` starts it and prints the usage.
#[test]
fn perftest_starts_on_the_drop_in() {
    let d = DropIn::new("perftest-start");
    for name in ["ib_write_bw", "ib_read_lat", "ib_atomic_bw", "ib_send_lat"] {
        let Some(path) = tool(name, "perftest") else {
            return;
        };
        let out = run(d.command(&path).arg("-h"), LIMIT);
        let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
        assert!(!all.contains("symbol lookup error"), "{name}: {all}");
        assert!(!all.contains("remem-ibv:"), "{name} reached a stub: {all}");
        assert!(all.contains("Usage"), "{name}: {all}");
    }
}
