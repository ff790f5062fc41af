//! Nothing posted or owed is lost at teardown (tests/c/teardown.c, a C program on the
//! drop-in librdmacm, as a server process and a client process with a soft device each):
//!
//! - a SEND posted just before `rdma_disconnect()` reaches the peer (its receive completes
//!   with success, not `IBV_WC_WR_FLUSH_ERR`): the disconnection sends what was posted
//!   before it moves the QP to ERR, as a NIC or kernel rxe does;
//! - a client that disconnects, destroys its QP and id and exits at once still sent its
//!   DREQ: the server gets `RDMA_CM_EVENT_DISCONNECTED` (`rdma_disconnect` returns once
//!   the DREQ has left).
//!
//! Each is repeated: the DREQ was lost in about one run in four.

use crate::common;
use crate::support;

use common::DropIn;
use std::path::{Path, PathBuf};
use support::{CmSide, Ran};

/// Runs per test: enough to catch a loss that happened one run in four.
const RUNS: usize = 20;
/// The server's port (each run has addresses of its own).
const PORT: &str = "20081";

/// Builds tests/c/teardown.c against rdma-core's headers, linked with the drop-in.
fn build(d: &DropIn) -> Option<PathBuf> {
    if !support::have_timeout() {
        return None;
    }
    common::compile_c(
        d,
        "teardown",
        "/usr/include/rdma/rdma_cma.h",
        "librdmacm-dev",
        &["-lrdmacm", "-libverbs"],
    )
}

/// One run of the pair with the client in `mode`: the server's and the client's output.
fn pair(d: &DropIn, exe: &Path, mode: &str) -> (Ran, Ran) {
    let (s, c) = support::cm_addrs();
    let server = CmSide {
        prog: exe,
        args: vec!["server".into(), s.to_string(), PORT.into(), mode.into()],
        ip: s,
    };
    let client = CmSide {
        prog: exe,
        args: vec!["client".into(), s.to_string(), PORT.into(), mode.into()],
        ip: c,
    };
    support::run_cm_pair(d, &server, &client, &|_| false)
}

fn check(run: usize, server: &Ran, client: &Ran, want: &[&str]) {
    let ok = server.code == Some(0)
        && client.code == Some(0)
        && want.iter().all(|w| server.out.contains(w));
    assert!(
        ok,
        "run {run}: the server should have printed {want:?}\n--- server ({:?}) ---\n{}\n\
         --- client ({:?}) ---\n{}",
        server.code, server.out, client.code, client.out
    );
}

/// `RUNS` runs of the pair with the client in `mode` (serially, in a drop-in directory
/// named `dir`), each checked for `want` in the server's output.
fn runs(dir: &str, mode: &str, want: &[&str]) {
    let _serial = support::serial();
    let d = DropIn::new(dir);
    let Some(exe) = build(&d) else {
        return;
    };
    for run in 0..RUNS {
        let (server, client) = pair(&d, &exe, mode);
        check(run, &server, &client, want);
    }
}

#[test]
fn a_send_posted_before_rdma_disconnect_reaches_the_peer() {
    runs(
        "c-teardown-send",
        "send",
        &[
            "first receive: success, 42 bytes, \"the last message before the disconnection\"",
            "event: RDMA_CM_EVENT_DISCONNECTED",
        ],
    );
}

#[test]
fn a_client_that_disconnects_and_exits_at_once_has_sent_its_dreq() {
    runs(
        "c-teardown-quiet",
        "quiet",
        &["event: RDMA_CM_EVENT_DISCONNECTED"],
    );
}

/// A client that exits while connected, closing nothing: its connection is closed at exit
/// (a DREQ, as kernel rdma_cm sends when it destroys a dying process's ids), so the server
/// gets DISCONNECTED instead of waiting for ever. Each process is alone on its device, so
/// no other member of the host's device could do it.
#[test]
fn a_client_that_exits_connected_has_its_connection_closed() {
    runs(
        "c-teardown-exit",
        "exit",
        &["event: RDMA_CM_EVENT_DISCONNECTED"],
    );
}

#[test]
fn a_server_that_exits_once_disconnected_has_sent_its_drep() {
    runs(
        "c-teardown-drep",
        "drep",
        &["event: RDMA_CM_EVENT_DISCONNECTED"],
    );
}
