//! A C program compiled against rdma-core's `rdma_cma.h` and linked with the drop-in
//! (`-lrdmacm -libverbs`: one library): what the rdmacm-utils do not exercise, on the soft
//! provider's CM — a QP the program manages itself (CONNECT_RESPONSE, `rdma_init_qp_attr`,
//! `rdma_establish`), data over it, a reject with private data, errno values
//! (tests/c/cm.c).

use crate::common;
use crate::support;

use common::{DropIn, run, text};
use std::time::Duration;

#[test]
fn a_c_program_connects_its_own_qp_and_is_rejected_with_private_data() {
    let d = DropIn::new("c-cm");
    let Some(exe) = common::compile_c(
        &d,
        "cm",
        "/usr/include/rdma/rdma_cma.h",
        "librdmacm-dev",
        &["-lrdmacm", "-libverbs"],
    ) else {
        return;
    };
    let (s, c) = support::cm_addrs();
    let out = run(
        d.command(&exe)
            .arg(s.to_string())
            .arg(c.to_string())
            .env("REMEM_IBV_DEVICES", format!("srv=soft@{s},cli=soft@{c}")),
        Duration::from_secs(60),
    );
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\nstderr:\n{}",
        text(&out.stderr)
    );
    assert!(stdout.contains("0 failures"), "{stdout}");
    assert!(!stdout.contains("FAIL"), "{stdout}");
}
