//! The only IO of the crate: the socket trait the driver sends and receives through
//! ([`socket`]: what the driver needs from a datagram socket, and the real UDP one), the
//! driver ([`driver`]: batched sends and receives, receive sizing, the progress thread and
//! the inline driver), the system calls beneath it (`sys`: the scatter/gather `sendmsg`,
//! the crate's one unsafe module), and two decorators of the socket trait: fault injection
//! ([`faulty`], with the fates of [`faults`]) and packet capture ([`capture`], into a
//! [`pcap`] file); and the host's shared device ([`host`]: many processes on one address
//! and port).

pub mod capture;
pub mod driver;
pub mod faults;
pub mod faulty;
pub mod host;
pub mod pcap;
pub mod socket;
pub(crate) mod sys;
