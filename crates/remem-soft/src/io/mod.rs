//! The only IO of the crate: the UDP socket a device's packets go through ([`driver`]:
//! batched sends and receives, receive sizing, the progress thread and the inline driver),
//! the system calls beneath it (`sys`: the scatter/gather `sendmsg`, the crate's one
//! unsafe module), fault injection ([`faults`]) and packet capture ([`pcap`]).

pub mod driver;
pub mod faults;
pub mod pcap;
pub(crate) mod sys;
