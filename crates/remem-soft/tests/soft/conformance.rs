//! The provider conformance suite on two soft devices in one process, over real UDP
//! sockets on loopback (127.0.4.1 and 127.0.4.2, one port picked at run time): each case's
//! two sides run on two threads (`two_process.rs` runs them in two processes).

use remem_conformance::{CASES, Case, Pair, Role, Side, TIMEOUT, run_pair};
use remem_soft::SoftContext;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

fn pair() -> &'static Pair {
    static PAIR: OnceLock<Pair> = OnceLock::new();
    PAIR.get_or_init(|| {
        let a = SoftContext::bind("127.0.4.1:0".parse().unwrap()).expect("device a");
        let port = a.local_addr().port();
        let b = SoftContext::bind(format!("127.0.4.2:{port}").parse().unwrap()).expect("device b");
        Pair::new(Arc::new(a), Arc::new(b))
    })
}

fn run(name: &str) {
    let case = Case::named(name).unwrap_or_else(|| panic!("no case {name}"));
    if let Err(e) = run_pair(case, pair()) {
        panic!("{name}: {e}");
    }
}

macro_rules! cases {
    ($($name:ident),* $(,)?) => {
        $( #[test] fn $name() { run(stringify!($name)); } )*

        #[test]
        fn every_case_has_a_test() {
            let listed = [$(stringify!($name)),*];
            for c in CASES {
                assert!(listed.contains(&c.name), "case {} has no test here", c.name);
            }
        }
    };
}

cases!(
    device_attributes,
    qp_state_machine,
    send_recv_multi_packet_multi_sge,
    send_longer_than_receive,
    rdma_write_and_write_with_imm,
    rdma_read_multi_packet,
    atomics_return_original_values,
    remote_access_errors,
    deregistration_revokes_access,
    rnr_retry_exhausted_and_recovered,
    unsignaled_and_post_lists,
    inline_send,
    local_post_errors,
    flush_and_atomic_write,
    ud_send_recv_with_grh_and_qkey,
    uc_send_and_write,
    uc_lost_messages_vanish,
    cm_connect_disconnect,
    cm_disconnect_by_listener,
    cm_reject_with_private_data,
    cm_no_listener,
    cm_ud_service_resolution,
);

/// Runs `side` as a case on both sides and returns its error, which must come at once (a
/// side waiting for a message that never comes is woken by the peer's end of the case).
fn failure_of(side: fn(&mut Side<'_>) -> Result<(), String>) -> String {
    let case = Case {
        name: "harness",
        about: "a test of the harness",
        side,
        run: |_| Ok(()),
    };
    let start = Instant::now();
    let err = run_pair(&case, pair()).expect_err("the case must fail");
    assert!(
        start.elapsed() < TIMEOUT,
        "the waiting side waited too long"
    );
    err
}

#[test]
fn a_failing_side_ends_its_peers_wait_at_once() {
    let err = failure_of(|s| match s.role {
        Role::A => s.wait_for("never sent"),
        Role::B => Err("failed on purpose".into()),
    });
    assert_eq!(err, "B: failed on purpose");
}

#[test]
fn a_panicking_side_ends_its_peers_wait_at_once() {
    let err = failure_of(|s| match s.role {
        Role::A => s.wait_for("never sent"),
        Role::B => panic!("panicked on purpose"),
    });
    assert!(
        err.starts_with("B panicked: panicked on purpose; A: "),
        "{err}"
    );
}

#[test]
fn a_side_that_finishes_early_fails_its_waiting_peer() {
    let err = failure_of(|s| match s.role {
        Role::A => s.wait_for("never sent"),
        Role::B => Ok(()),
    });
    assert!(err.starts_with("A: the peer finished the case"), "{err}");
}
