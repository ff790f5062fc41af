//! The CM agent against the kernel's own MADs: the REQ, REP, RTU, DREQ and DREP that
//! `rping` exchanged through kernel rdma_cm/ib_cm over rxe (`../shared/vectors/rxe/
//! rping.pcap`), replayed into a sans-IO agent playing the other side. The kernel's
//! communication IDs are its own, so where a kernel message names the agent's ID it is
//! patched to the one the agent chose (nothing else is touched).
//!
//! Without `../shared` the test prints "skipped" and passes (`REMEM_REQUIRE_VECTORS=1`
//! makes that a failure).

use remem_soft::cm::CmConfig;
use remem_soft::cm::agent::{Agent, ConnectArgs, Event};
use remem_verbs::Mtu;
use remem_verbs::cm::{ConnParam, PortSpace};
use remem_wire::{CmMad, CmMessage, Packet};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Instant;

const CLIENT: &str = "192.168.77.1";
const SERVER: &str = "192.168.77.2";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn capture() -> Option<Vec<u8>> {
    let dir = std::env::var_os("REMEM_VECTORS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/vectors/rxe")
        });
    match std::fs::read(dir.join("rping.pcap")) {
        Ok(b) => Some(b),
        Err(e) => {
            assert!(
                std::env::var_os("REMEM_REQUIRE_VECTORS").is_none(),
                "REMEM_REQUIRE_VECTORS is set but {}/rping.pcap: {e}",
                dir.display()
            );
            eprintln!(
                "skipped: kernel captures not found ({}: {e})",
                dir.display()
            );
            None
        }
    }
}

/// The CM MADs of the capture, in order: (source IP, MAD bytes).
fn mads(pcap: &[u8]) -> Vec<(IpAddr, Vec<u8>)> {
    let u32_at = |at: usize| u32::from_le_bytes(pcap[at..at + 4].try_into().unwrap());
    assert_eq!(u32_at(0), 0xa1b2_c3d4, "little-endian µs pcap");
    let mut out = Vec::new();
    let mut at = 24;
    while at + 16 <= pcap.len() {
        let len = u32_at(at + 8) as usize;
        let frame = &pcap[at + 16..at + 16 + len];
        at += 16 + len;
        // Ethernet (14) + IPv4 (20, no options) + UDP (8).
        let src = IpAddr::from(<[u8; 4]>::try_from(&frame[26..30]).unwrap());
        let p = Packet::parse(&frame[42..]).unwrap();
        if p.headers.bth.dest_qp == 1 {
            out.push((src, p.payload.to_vec()));
        }
    }
    out
}

fn patch_remote(mad: &[u8], ours: u32) -> Vec<u8> {
    let mut m = CmMad::parse(mad).unwrap();
    match &mut m.message {
        CmMessage::Rep(r) => r.remote_comm_id = ours,
        CmMessage::Rtu(r) => r.remote_comm_id = ours,
        CmMessage::Dreq(r) => r.remote_comm_id = ours,
        CmMessage::Drep(r) => r.remote_comm_id = ours,
        other => panic!("{other:?}"),
    }
    m.emit().unwrap().to_vec()
}

fn sent(agent: &mut Agent) -> Vec<CmMad> {
    std::iter::from_fn(|| agent.poll_transmit())
        .map(|t| CmMad::parse(&t.mad[..]).unwrap())
        .collect()
}

#[test]
fn the_agent_serves_a_kernel_rdma_cm_client() {
    let Some(pcap) = capture() else { return };
    let m = mads(&pcap);
    let names: Vec<&str> = m
        .iter()
        .map(|(_, b)| CmMad::parse(b).unwrap().message.name())
        .collect();
    assert_eq!(names, ["REQ", "REP", "RTU", "DREQ", "DREP"]);
    let now = Instant::now();
    let mut server = Agent::new(CmConfig::default(), 7);
    // rping's port 7174 (0x1c06) on the server's address.
    server.listen(1, PortSpace::Tcp.service_id(7174), Some(ip(SERVER)), 4);
    server.handle_mad(now, ip(CLIENT), &m[0].1);
    let evs: Vec<Event> = std::iter::from_fn(|| server.poll_event()).collect();
    let [
        Event::ConnectRequest {
            conn,
            header,
            req: Some(req),
            private_data,
            ..
        },
    ] = evs.as_slice()
    else {
        panic!("{evs:?}")
    };
    let conn = *conn;
    assert_eq!(
        (header.src, header.dst, header.src_port),
        (ip(CLIENT), ip(SERVER), 0x966d)
    );
    assert_eq!(private_data.len(), 56);
    assert_eq!(req.local_qpn, 0x1a);
    server.limit_mtu(conn, Mtu::Mtu4096);
    let p = server.qp_params(conn).unwrap();
    assert_eq!(p.remote_qpn, 0x1a);
    // The kernel's way (rping.pcap): a side sends from the PSN its peer's message
    // announced — the kernel server sent from the REQ's 0x62bbb4 (frame 6) — and expects
    // the one it announced itself.
    assert_eq!(p.sq_psn, 0x62bbb4);
    assert_ne!(p.rq_psn, 0x62bbb4);
    assert_eq!(p.path_mtu, Mtu::Mtu1024, "the kernel's path MTU");
    assert_eq!(p.timeout, 0x13, "the kernel's local ACK timeout");
    assert_eq!(p.peer, ip(CLIENT));
    server
        .accept(
            now,
            conn,
            0x77,
            &ConnParam::default(),
            0x0200_0000_0000_0001,
        )
        .unwrap();
    let out = sent(&mut server);
    let [
        CmMad {
            header,
            message: CmMessage::Rep(rep),
        },
    ] = out.as_slice()
    else {
        panic!("{out:?}")
    };
    assert_eq!(
        header.transaction_id, 0x0000_0002_ae07_30d1,
        "the REQ's TID"
    );
    assert_eq!(rep.remote_comm_id, 0xd130_07ae, "the kernel's comm ID");
    assert_eq!(rep.local_qpn, 0x77);
    // The kernel's RTU completes it; its DREQ is answered.
    server.handle_mad(now, ip(CLIENT), &patch_remote(&m[2].1, conn));
    assert!(matches!(
        std::iter::from_fn(|| server.poll_event())
            .collect::<Vec<_>>()
            .as_slice(),
        [Event::Established { .. }]
    ));
    server.handle_mad(now, ip(CLIENT), &patch_remote(&m[3].1, conn));
    assert!(matches!(
        std::iter::from_fn(|| server.poll_event())
            .collect::<Vec<_>>()
            .as_slice(),
        [Event::Disconnected { status: 0, .. }]
    ));
    let out = sent(&mut server);
    assert!(
        matches!(out.as_slice(), [CmMad { message: CmMessage::Drep(d), header }]
            if d.remote_comm_id == 0xd130_07ae && header.transaction_id == 0x0000_0002_ae07_30d1),
        "{out:?}"
    );
    let s = server.stats();
    assert_eq!(
        s.drop_malformed + s.drop_unknown_comm_id + s.drop_out_of_state,
        0
    );
}

#[test]
fn the_agent_connects_to_a_kernel_rdma_cm_server() {
    let Some(pcap) = capture() else { return };
    let m = mads(&pcap);
    let now = Instant::now();
    let mut client = Agent::new(CmConfig::default(), 8);
    let param = ConnParam::default();
    let conn = client
        .connect(
            now,
            &ConnectArgs {
                ps: PortSpace::Tcp,
                src: SocketAddr::new(ip(CLIENT), 0x966d),
                dst: SocketAddr::new(ip(SERVER), 7174),
                qpn: 0x1a,
                param: &param,
                mtu: Mtu::Mtu1024,
                ca_guid: 0x04ae_8bff_fe55_d0a6,
            },
        )
        .unwrap();
    let out = sent(&mut client);
    let [
        CmMad {
            message: CmMessage::Req(ours),
            ..
        },
    ] = out.as_slice()
    else {
        panic!("{out:?}")
    };
    // Our REQ carries what the kernel's did where the values are the connection's.
    let CmMessage::Req(kernel) = CmMad::parse(&m[0].1).unwrap().message else {
        panic!()
    };
    assert_eq!(ours.service_id, kernel.service_id);
    assert_eq!(ours.transport_service_type, kernel.transport_service_type);
    assert_eq!(ours.partition_key, kernel.partition_key);
    assert_eq!(ours.path_mtu, kernel.path_mtu);
    assert_eq!(ours.local_qpn, kernel.local_qpn);
    assert_eq!(ours.primary_path.local_gid, kernel.primary_path.local_gid);
    assert_eq!(ours.primary_path.remote_gid, kernel.primary_path.remote_gid);
    assert_eq!(ours.primary_path.local_lid, kernel.primary_path.local_lid);
    assert_eq!(ours.primary_path.hop_limit, kernel.primary_path.hop_limit);
    assert_eq!(
        ours.private_data[..36],
        kernel.private_data[..36],
        "rdma_cm's IP header"
    );
    // The kernel server's REP (naming our comm ID), then our RTU.
    client.handle_mad(now, ip(SERVER), &patch_remote(&m[1].1, conn));
    let evs: Vec<Event> = std::iter::from_fn(|| client.poll_event()).collect();
    assert!(
        matches!(evs.as_slice(), [Event::ConnectReply { .. }]),
        "{evs:?}"
    );
    let p = client.qp_params(conn).unwrap();
    assert_eq!(p.remote_qpn, 0x1a);
    // The kernel client sent from the REP's 0xe9804f (frame 4): so do we.
    assert_eq!(p.sq_psn, 0xe9804f);
    assert_ne!(p.rq_psn, 0xe9804f);
    client.establish(conn, &[]).unwrap();
    let out = sent(&mut client);
    assert!(
        matches!(out.as_slice(), [CmMad { message: CmMessage::Rtu(r), .. }] if r.remote_comm_id == 0xd230_07ae),
        "{out:?}"
    );
    // We disconnect; the kernel's DREP finishes it.
    client.disconnect(now, conn, &[]).unwrap();
    let out = sent(&mut client);
    assert!(
        matches!(out.as_slice(), [CmMad { message: CmMessage::Dreq(d), .. }] if d.remote_qpn_eecn == 0x1a)
    );
    client.handle_mad(now, ip(SERVER), &patch_remote(&m[4].1, conn));
    assert!(matches!(
        std::iter::from_fn(|| client.poll_event())
            .collect::<Vec<_>>()
            .as_slice(),
        [Event::Disconnected { status: 0, .. }]
    ));
}
