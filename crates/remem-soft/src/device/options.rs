//! A soft device's options ([`SoftOptions`]) and the environment variables that set them.

use std::time::Duration;

/// Options of a soft device.
#[derive(Debug, Clone, Default)]
pub struct SoftOptions {
    /// Capture every packet to this pcap file (`REMEM_PCAP`).
    pub pcap: Option<std::path::PathBuf>,
    /// Pin the device's progress thread to this CPU (`REMEM_SOFT_CPU`).
    pub cpu: Option<usize>,
    /// No progress thread: the application drives the device with
    /// [`SoftContext::progress`](crate::SoftContext::progress) (single-threaded programs, deterministic tests).
    pub inline: bool,
    /// How long the progress thread keeps polling its socket before it sleeps
    /// (`REMEM_SOFT_BUSY_POLL_US`, microseconds; default 0). Spinning trades a CPU for
    /// latency: a sleeping thread needs a wake-up per packet. [`Duration::MAX`]
    /// (`REMEM_SOFT_BUSY_POLL_US=always`) is busy polling: the thread never sleeps (a
    /// nonblocking receive per pass, no timer syscalls, and posts from other threads cost
    /// no wake-up). A sleeping thread is woken by a post at once (an eventfd write).
    pub busy_poll: Duration,
    /// The UDP port this device sends to by default (default: its own). RoCEv2 devices all
    /// use 4791, so peers share a port; a peer on another port is named per path in its
    /// address vector (`AhAttr::udp_port`) or per peer with [`Context::set_peer_udp_port`](remem_verbs::Context::set_peer_udp_port)
    /// (two soft devices on one address, e.g. `::1`, the only IPv6 loopback address, need
    /// distinct ports).
    pub peer_port: Option<u16>,
    /// Leave out the RoCEv2 memory placement extensions (FLUSH, ATOMIC WRITE), as kernel
    /// Soft-RoCE before Linux 6.2 does: the device does not report them and refuses to
    /// post them. (It still answers them as a responder.) For testing code that must work
    /// on such devices.
    pub no_placement: bool,
    /// Faults to inject into every packet the device sends (testing; also from
    /// `REMEM_SOFT_FAULTS`, see [`crate::io::faults`]).
    pub faults: Option<crate::io::faults::FaultConfig>,
    /// The connection manager's settings (timeouts, retries, budgets); `None`: the
    /// defaults with `REMEM_SOFT_CM_TIMEOUT` / `REMEM_SOFT_CM_RETRIES` applied
    /// ([`crate::CmConfig::from_env`]).
    pub cm: Option<crate::cm::CmConfig>,
    /// Inline devices driven in a spin (`progress(Duration::ZERO)` in a loop): what the
    /// packets a call receives produce (ACKs, READ and atomic responses) leaves with the
    /// next call's sends instead of in a send of its own before the call returns
    /// (`REMEM_SOFT_DEFER_RESPONSES=1`). The application sees a WRITE land, posts its
    /// reply, and the ACK and the reply leave in one `sendmmsg`, the ACK first: a ping-pong
    /// saves a syscall per message on each side (on loopback the send also runs the
    /// receiver's network stack). The price: until the next call the peer waits for its
    /// ACK, like a NIC that coalesces ACKs, so a program that stops driving must call
    /// `progress` once more (closing the device does: it sends what it owes). Calls that
    /// may wait (`progress` with a timeout) still send at once; ignored with a progress
    /// thread, which sends on its next pass anyway.
    pub defer_responses: bool,
    /// Own the address's UDP port alone instead of sharing the device with the host's
    /// other processes (`REMEM_SOFT_PRIVATE=1`): the port is then this device's, and a
    /// second device on it fails to open. A device on port 0 (any free port) is always
    /// private (remem-soft's `io::host`: the host's NIC).
    pub private: bool,
}

/// The environment variable that pins progress threads to a CPU.
pub const CPU_ENV: &str = "REMEM_SOFT_CPU";
/// The environment variable that sets [`SoftOptions::busy_poll`] (microseconds).
pub const BUSY_POLL_ENV: &str = "REMEM_SOFT_BUSY_POLL_US";
/// The environment variable that sets [`SoftOptions::defer_responses`] (`1`).
pub const DEFER_RESPONSES_ENV: &str = "REMEM_SOFT_DEFER_RESPONSES";
/// The environment variable that sets [`SoftOptions::private`] (`1`).
pub const PRIVATE_ENV: &str = "REMEM_SOFT_PRIVATE";

/// [`SoftOptions::busy_poll`] from the value of [`BUSY_POLL_ENV`]: microseconds, or
/// `always` (never sleep: [`Duration::MAX`]); unset or unreadable: 0.
pub(crate) fn busy_poll_from(value: Option<&str>) -> Duration {
    match value.map(str::trim) {
        Some("always") => Duration::MAX,
        Some(us) => Duration::from_micros(us.parse().unwrap_or(0)),
        None => Duration::ZERO,
    }
}

impl SoftOptions {
    /// Options from the environment: `REMEM_PCAP`, `REMEM_SOFT_CPU`,
    /// `REMEM_SOFT_BUSY_POLL_US`, `REMEM_SOFT_DEFER_RESPONSES`, `REMEM_SOFT_PRIVATE`.
    pub fn from_env() -> Self {
        fn num<T: std::str::FromStr>(name: &str) -> Option<T> {
            std::env::var(name).ok().and_then(|s| s.trim().parse().ok())
        }
        SoftOptions {
            pcap: std::env::var_os(crate::io::pcap::PCAP_ENV).map(Into::into),
            cpu: num(CPU_ENV),
            inline: false,
            busy_poll: busy_poll_from(std::env::var(BUSY_POLL_ENV).ok().as_deref()),
            peer_port: None,
            no_placement: false,
            faults: None,
            cm: None,
            defer_responses: std::env::var(DEFER_RESPONSES_ENV)
                .is_ok_and(|v| matches!(v.trim(), "1" | "true" | "yes")),
            private: std::env::var(PRIVATE_ENV)
                .is_ok_and(|v| matches!(v.trim(), "1" | "true" | "yes")),
        }
    }
}
