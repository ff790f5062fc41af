//! Asynchronous events (`struct ibv_async_event`).

#![forbid(unsafe_code)]

use std::fmt;

/// What happened (`enum ibv_event_type`; values are rdma-core's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum AsyncEventType {
    /// `IBV_EVENT_CQ_ERR`: a CQ overran; completions were lost, the CQ is unusable.
    CqErr = 0,
    /// `IBV_EVENT_QP_FATAL`: the QP hit an error that is not tied to a work request.
    QpFatal = 1,
    /// `IBV_EVENT_QP_REQ_ERR`: invalid request local work queue error.
    QpReqErr = 2,
    /// `IBV_EVENT_QP_ACCESS_ERR`: local access violation error.
    QpAccessErr = 3,
    /// `IBV_EVENT_COMM_EST`: first packet received on a QP in RTR.
    CommEst = 4,
    /// `IBV_EVENT_SQ_DRAINED`: the send queue of a QP in SQD is drained.
    SqDrained = 5,
    /// `IBV_EVENT_PATH_MIG`: path migrated.
    PathMig = 6,
    /// `IBV_EVENT_PATH_MIG_ERR`: path migration failed.
    PathMigErr = 7,
    /// `IBV_EVENT_DEVICE_FATAL`: the device is unusable.
    DeviceFatal = 8,
    /// `IBV_EVENT_PORT_ACTIVE`: the port went active.
    PortActive = 9,
    /// `IBV_EVENT_PORT_ERR`: the port went down.
    PortErr = 10,
    /// `IBV_EVENT_LID_CHANGE`
    LidChange = 11,
    /// `IBV_EVENT_PKEY_CHANGE`
    PkeyChange = 12,
    /// `IBV_EVENT_SM_CHANGE`
    SmChange = 13,
    /// `IBV_EVENT_SRQ_ERR`: the shared receive queue failed.
    SrqErr = 14,
    /// `IBV_EVENT_SRQ_LIMIT_REACHED`: an armed SRQ fell below its limit.
    SrqLimitReached = 15,
    /// `IBV_EVENT_QP_LAST_WQE_REACHED`: a QP on an SRQ will consume no more receives.
    QpLastWqeReached = 16,
    /// `IBV_EVENT_CLIENT_REREGISTER`
    ClientReregister = 17,
    /// `IBV_EVENT_GID_CHANGE`: the GID table changed.
    GidChange = 18,
    /// `IBV_EVENT_WQ_FATAL`
    WqFatal = 19,
}

/// The object an event is about (the union `ibv_async_event.element`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AsyncEventElement {
    /// A queue pair, by QP number.
    Qp(u32),
    /// A completion queue, by its [`CqId`](crate::CqId).
    Cq(crate::CqId),
    /// A shared receive queue, by SRQ number.
    Srq(u32),
    /// A port, by number (1-based).
    Port(u8),
    /// The device itself.
    Device,
}

/// One asynchronous event (`struct ibv_async_event`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AsyncEvent {
    /// What happened.
    pub event_type: AsyncEventType,
    /// To what.
    pub element: AsyncEventElement,
}

impl fmt::Display for AsyncEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} on {:?}", self.event_type, self.element)
    }
}
