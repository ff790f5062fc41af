//! Destroying an id (`rdma_destroy_id`, `rdma_destroy_ep`): see the module documentation
//! of [`super`]. The entry points are in `crate::ffi::rdmacm`.

#![forbid(unsafe_code)]

use super::*;

/// Destroys the library's side of an id: stops its events (unregisters its provider ids,
/// drops those still queued, freeing the ids of connection requests not handed out, which
/// rejects them), drops its provider ids, acks its own event and waits until every event
/// handed out for it is acked. Its private channel (address; 0 if none), for the FFI
/// layer to free with the id (`crate::ffi::rdmacm::destroy_id`).
pub(crate) fn stop(shared: &Arc<IdShared>) -> usize {
    let (cms, purged) = {
        let mut routes = router::routes();
        let mut st = shared.state();
        for (_, c) in &st.cm {
            routes.remove(&c.handle());
        }
        let purged = st.channel.take_for(shared);
        // The new ids of connection requests never handed out: unregister them now,
        // free them below.
        for p in &purged {
            if let Some(c) = &p.child {
                for (_, cm) in &c.shared().state().cm {
                    routes.remove(&cm.handle());
                }
            }
        }
        (std::mem::take(&mut st.cm), purged)
    };
    for p in purged {
        if let Some(c) = p.child {
            // Its CONNECT_REQUEST is gone with `purged`.
            crate::ffi::rdmacm::free_unseen(c);
        }
    }
    drop(cms);
    ack_own_event(shared);
    shared.wait_acked();
    std::mem::take(&mut shared.state().private)
}
