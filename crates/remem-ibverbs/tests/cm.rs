//! The conformance suite's RDMA CM cases (connect, disconnect either way, reject with
//! private data, no listener, UD service resolution) on the first rdma-core device, both
//! sides on two contexts of it — on kernel Soft-RoCE, `cargo xtask rxe conformance` runs
//! them in its guest. Skipped (visibly) where there is no RDMA device.

use remem_conformance::{Case, Pair};
use remem_verbs::{CmChannel, CmEvent, Error, PortSpace, Provider};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;

/// A CM channel of some other provider.
struct Foreign(std::fs::File);

impl CmChannel for Foreign {
    fn fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }

    fn get_event(&self) -> Option<CmEvent> {
        None
    }
}

fn device() -> Option<String> {
    let devices = remem_ibverbs::IbverbsProvider::new().devices().ok()?;
    devices.into_iter().next().map(|d| d.name)
}

#[test]
fn the_cm_cases_pass_on_an_rdma_core_device() {
    let Some(dev) = device() else {
        eprintln!("skipped: no RDMA device (rdma-core lists none)");
        return;
    };
    let p = remem_ibverbs::IbverbsProvider::new();
    let pair = Pair::new(p.open(&dev).unwrap(), p.open(&dev).unwrap());
    let mut failed = Vec::new();
    for name in [
        "cm_connect_disconnect",
        "cm_disconnect_by_listener",
        "cm_reject_with_private_data",
        "cm_no_listener",
        "cm_ud_service_resolution",
    ] {
        let case = Case::named(name).expect("a conformance case");
        if let Err(e) = (case.run)(&pair) {
            failed.push(format!("{name}: {e}"));
        }
    }
    assert!(failed.is_empty(), "{failed:#?}");
}

#[test]
fn a_cm_id_refuses_another_providers_channel_and_foreign_addresses() {
    let Some(dev) = device() else {
        eprintln!("skipped: no RDMA device (rdma-core lists none)");
        return;
    };
    let ctx = remem_ibverbs::IbverbsProvider::new().open(&dev).unwrap();
    let foreign: Arc<dyn CmChannel> = Arc::new(Foreign(std::fs::File::open("/dev/null").unwrap()));
    assert!(matches!(
        ctx.create_cm_id(&foreign, PortSpace::Tcp),
        Err(Error::InvalidArgument(_))
    ));
    let ch = ctx.create_cm_channel().unwrap();
    let id = ctx.create_cm_id(&ch, PortSpace::Tcp).unwrap();
    // 192.0.2.1 (TEST-NET-1) is no device's address.
    assert!(id.bind("192.0.2.1:7471".parse().unwrap()).is_err());
    assert!(id.local_addr().is_none());
    // More private data than a REQ carries is refused before anything is sent.
    let long = remem_verbs::ConnParam {
        private_data: vec![0; remem_verbs::PrivateDataLimit::REQ + 1],
        ..Default::default()
    };
    assert!(matches!(id.connect(&long), Err(Error::InvalidArgument(_))));
}
