//! Fault injection for soft devices, as smoltcp's `FaultInjector` does it for its devices:
//! a seeded random fate for every packet a device sends — lost, corrupted (after its ICRC
//! was computed, so the receiver's ICRC check must catch it), duplicated, reordered (sent
//! after the next one) or delayed. The packets still cross a real UDP socket; only their
//! fate is decided here; `io::faulty::Faulty`, a decorator of the driver's socket, applies
//! it. Off unless configured ([`FaultConfig`], `REMEM_SOFT_FAULTS`).

#![forbid(unsafe_code)]

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// The environment variable [`FaultConfig::from_env`] reads, e.g.
/// `REMEM_SOFT_FAULTS=loss=0.01,dup=0.005,reorder=0.01,corrupt=0.001,delay_us=200,seed=7`.
pub const FAULTS_ENV: &str = "REMEM_SOFT_FAULTS";

/// What happens to the packets a soft device sends (probabilities per packet).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct FaultConfig {
    /// Lost.
    pub loss: f64,
    /// A random bit flipped after the ICRC was computed.
    pub corrupt: f64,
    /// Sent twice.
    pub duplicate: f64,
    /// Held back and sent after the next packet (or after 1 ms if none comes).
    pub reorder: f64,
    /// Every packet leaves this much later (in order).
    pub delay: Duration,
    /// Seed of the random fates: the same seed and traffic give the same faults.
    pub seed: u64,
    /// CM MADs to lose once each, deterministically: bit `attr - 0x10` for CM attribute
    /// `attr` (REQ 0x10 … SIDR REP 0x18). The first MAD of each kind named here that the
    /// device sends is lost, later ones go (e.g. a lost REP, then its retransmission) —
    /// so a test shows the CM's retries against any peer, kernel rdma_cm included.
    pub drop_cm: u16,
}

/// The CM message names `drop_cm=` takes, in attribute order from 0x10.
const CM_NAMES: [&str; 9] = [
    "req", "mra", "rej", "rep", "rtu", "dreq", "drep", "sidr_req", "sidr_rep",
];

impl FaultConfig {
    /// Whether any fault is configured.
    pub fn is_active(&self) -> bool {
        self.loss > 0.0
            || self.corrupt > 0.0
            || self.duplicate > 0.0
            || self.reorder > 0.0
            || !self.delay.is_zero()
            || self.drop_cm != 0
    }

    /// Parses `key=value` pairs separated by commas: `loss`, `corrupt`, `dup`, `reorder`
    /// (probabilities in [0, 1]), `delay_us`, `seed`, and `drop_cm` (CM messages joined by
    /// `+`, e.g. `drop_cm=rep+rtu`: [`FaultConfig::drop_cm`]).
    pub fn parse(s: &str) -> Result<FaultConfig, String> {
        let mut c = FaultConfig::default();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| format!("`{part}`: want key=value"))?;
            let p = || -> Result<f64, String> {
                let x: f64 = v.parse().map_err(|_| format!("`{part}`: not a number"))?;
                if (0.0..=1.0).contains(&x) {
                    Ok(x)
                } else {
                    Err(format!("`{part}`: a probability is between 0 and 1"))
                }
            };
            match k {
                "loss" => c.loss = p()?,
                "corrupt" => c.corrupt = p()?,
                "dup" | "duplicate" => c.duplicate = p()?,
                "reorder" => c.reorder = p()?,
                "delay_us" => {
                    c.delay = Duration::from_micros(
                        v.parse().map_err(|_| format!("`{part}`: not a number"))?,
                    )
                }
                "seed" => c.seed = v.parse().map_err(|_| format!("`{part}`: not a number"))?,
                "drop_cm" => {
                    for name in v.split('+') {
                        let bit = CM_NAMES
                            .iter()
                            .position(|n| *n == name)
                            .ok_or_else(|| format!("`{part}`: no CM message `{name}`"))?;
                        c.drop_cm |= 1 << bit;
                    }
                }
                _ => return Err(format!("unknown fault `{k}`")),
            }
        }
        Ok(c)
    }

    /// The configuration `REMEM_SOFT_FAULTS` names, if it is set and valid (an invalid
    /// one is reported on stderr and ignored).
    pub fn from_env() -> Option<FaultConfig> {
        let s = std::env::var(FAULTS_ENV).ok()?;
        match FaultConfig::parse(&s) {
            Ok(c) => Some(c).filter(FaultConfig::is_active),
            Err(e) => {
                eprintln!("remem-soft: ignoring {FAULTS_ENV}: {e}");
                None
            }
        }
    }
}

/// How many packets met each fault.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FaultCounts {
    /// Lost.
    pub dropped: u64,
    /// Corrupted.
    pub corrupted: u64,
    /// Duplicated.
    pub duplicated: u64,
    /// Reordered.
    pub reordered: u64,
}

/// The fate of one packet ([`FaultInjector::fate`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// It goes as it is, now (in its batch).
    Go,
    /// It is lost.
    Lost,
    /// Something else happens to it: [`FaultInjector::apply`] needs its bytes.
    Faulted(Faults),
}

/// What happens to a packet that is neither lost nor sent as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Faults {
    /// This bit (of the packet, from its first byte's least significant) is flipped.
    pub corrupt_bit: Option<usize>,
    /// Sent twice.
    pub duplicate: bool,
    /// Held back until the next packet goes (or 1 ms passes).
    pub reorder: bool,
}

/// The fates of one device's outgoing packets.
#[derive(Debug)]
pub struct FaultInjector {
    cfg: FaultConfig,
    rng: StdRng,
    /// Delayed packets, due in order.
    delayed: VecDeque<(Instant, SocketAddr, Vec<u8>)>,
    /// A packet held back to go after the next one, and when it must go anyway.
    held: Option<(Instant, SocketAddr, Vec<u8>)>,
    /// The kinds of [`FaultConfig::drop_cm`] already lost once.
    cm_lost: u16,
    /// Counts so far.
    pub counts: FaultCounts,
}

/// The CM attribute of a packet that carries a CM MAD to QP 1 (a UD SEND ONLY: BTH,
/// DETH, then the MAD), as a bit of [`FaultConfig::drop_cm`].
fn cm_bit(pkt: &[u8]) -> Option<u16> {
    const UD_SEND_ONLY: u8 = 0x64;
    const MAD: usize = 12 + 8; // BTH + DETH
    let dest_qp = u32::from_be_bytes([0, *pkt.get(5)?, *pkt.get(6)?, *pkt.get(7)?]);
    if *pkt.first()? != UD_SEND_ONLY || dest_qp != 1 || *pkt.get(MAD + 1)? != 0x07 {
        return None;
    }
    let attr = u16::from_be_bytes([*pkt.get(MAD + 16)?, *pkt.get(MAD + 17)?]);
    attr.checked_sub(0x10)
        .filter(|b| usize::from(*b) < CM_NAMES.len())
        .map(|b| 1 << b)
}

/// Longest a reordered packet waits for a packet to overtake it.
const REORDER_WAIT: Duration = Duration::from_millis(1);

impl FaultInjector {
    /// An injector for `cfg`.
    pub fn new(cfg: FaultConfig) -> Self {
        FaultInjector {
            cfg,
            rng: StdRng::seed_from_u64(cfg.seed),
            delayed: VecDeque::new(),
            held: None,
            cm_lost: 0,
            counts: FaultCounts::default(),
        }
    }

    /// Decides the fate of a packet of `len` bytes whose first bytes (its headers, at
    /// least its BTH; the whole packet for a UD one) are `head`, without its bytes: most
    /// packets [`Fate::Go`] as they are (they stay in their GSO batch, their payload where
    /// it lies) or are [`Fate::Lost`] (left out of it); only the rare others need the
    /// packet's bytes, given to [`FaultInjector::apply`]. The same seed and packets give
    /// the same fates as [`FaultInjector::on_send`].
    pub fn fate(&mut self, head: &[u8], len: usize) -> Fate {
        if let Some(bit) = cm_bit(head).filter(|b| self.cfg.drop_cm & b & !self.cm_lost != 0) {
            self.cm_lost |= bit;
            self.counts.dropped += 1;
            return Fate::Lost;
        }
        if self.rng.random_bool(self.cfg.loss) {
            self.counts.dropped += 1;
            return Fate::Lost;
        }
        let corrupt_bit = (len > 0 && self.rng.random_bool(self.cfg.corrupt)).then(|| {
            self.counts.corrupted += 1;
            self.rng.random_range(0..len * 8)
        });
        let duplicate = self.rng.random_bool(self.cfg.duplicate);
        self.counts.duplicated += u64::from(duplicate);
        let reorder = self.held.is_none() && self.rng.random_bool(self.cfg.reorder);
        self.counts.reordered += u64::from(reorder);
        let faults = Faults {
            corrupt_bit,
            duplicate,
            reorder,
        };
        if faults == Faults::default() && self.held.is_none() && self.cfg.delay.is_zero() {
            Fate::Go
        } else {
            Fate::Faulted(faults)
        }
    }

    /// Applies `faults` (a [`Fate::Faulted`]) to the packet `bytes`, leaving for `dst` at
    /// `now`: what must go now is pushed to `out` (nothing, the packet, the packet twice,
    /// or a held one after it).
    pub fn apply(
        &mut self,
        now: Instant,
        dst: SocketAddr,
        faults: Faults,
        mut bytes: Vec<u8>,
        out: &mut Vec<(SocketAddr, Vec<u8>)>,
    ) {
        if let Some(bit) = faults.corrupt_bit.filter(|b| b / 8 < bytes.len()) {
            bytes[bit / 8] ^= 1 << (bit % 8);
        }
        if faults.reorder {
            self.held = Some((now + REORDER_WAIT, dst, bytes));
            return;
        }
        let mut ready = Vec::with_capacity(3);
        if faults.duplicate {
            ready.push((dst, bytes.clone()));
        }
        ready.push((dst, bytes));
        if let Some((_, d, b)) = self.held.take() {
            ready.push((d, b)); // overtaken
        }
        if self.cfg.delay.is_zero() {
            out.extend(ready);
        } else {
            let due = now + self.cfg.delay;
            self.delayed
                .extend(ready.into_iter().map(|(d, b)| (due, d, b)));
        }
    }

    /// Decides the fate of `pkt`, leaving for `dst` at `now`, and applies it: what must go
    /// now is pushed to `out` ([`FaultInjector::fate`], then [`FaultInjector::apply`]).
    pub fn on_send(
        &mut self,
        now: Instant,
        dst: SocketAddr,
        pkt: &[u8],
        out: &mut Vec<(SocketAddr, Vec<u8>)>,
    ) {
        match self.fate(pkt, pkt.len()) {
            Fate::Lost => {}
            Fate::Go => out.push((dst, pkt.to_vec())),
            Fate::Faulted(f) => self.apply(now, dst, f, pkt.to_vec(), out),
        }
    }

    /// Pushes to `out` what is due at `now` (delayed packets, a held packet that waited
    /// long enough).
    pub fn due(&mut self, now: Instant, out: &mut Vec<(SocketAddr, Vec<u8>)>) {
        if self.held.as_ref().is_some_and(|(t, _, _)| *t <= now)
            && let Some((_, d, b)) = self.held.take()
        {
            if self.cfg.delay.is_zero() {
                out.push((d, b));
            } else {
                self.delayed.push_back((now + self.cfg.delay, d, b));
            }
        }
        while self.delayed.front().is_some_and(|(t, _, _)| *t <= now) {
            if let Some((_, d, b)) = self.delayed.pop_front() {
                out.push((d, b));
            }
        }
    }

    /// When something held becomes due.
    pub fn next_due(&self) -> Option<Instant> {
        let held = self.held.as_ref().map(|(t, _, _)| *t);
        let delayed = self.delayed.front().map(|(t, _, _)| *t);
        match (held, delayed) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dst() -> SocketAddr {
        "127.0.0.1:4791".parse().unwrap()
    }

    #[test]
    fn parses_and_rejects() {
        let c = FaultConfig::parse("loss=0.01, dup=0.5,reorder=1,corrupt=0,delay_us=250,seed=9")
            .unwrap();
        assert_eq!(c.loss, 0.01);
        assert_eq!(c.duplicate, 0.5);
        assert_eq!(c.reorder, 1.0);
        assert_eq!(c.delay, Duration::from_micros(250));
        assert_eq!(c.seed, 9);
        assert!(c.is_active());
        assert!(!FaultConfig::parse("").unwrap().is_active());
        for bad in ["loss=2", "loss", "jitter=1", "delay_us=-1", "seed=x"] {
            assert!(FaultConfig::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_first_cm_mad_of_each_named_kind_is_lost() {
        let c = FaultConfig::parse("drop_cm=rep+rtu").unwrap();
        assert_eq!(c.drop_cm, (1 << 3) | (1 << 4));
        assert!(c.is_active());
        assert!(FaultConfig::parse("drop_cm=rep+nope").is_err());
        let mad = |attr: u16| {
            let mut p = vec![0u8; 12 + 8 + 256 + 4];
            p[0] = 0x64; // UD SEND ONLY
            p[7] = 1; // to QP 1
            p[21] = 0x07; // CM class
            p[36..38].copy_from_slice(&attr.to_be_bytes());
            p
        };
        let mut f = FaultInjector::new(c);
        let now = Instant::now();
        let mut out = Vec::new();
        f.on_send(now, dst(), &mad(0x13), &mut out); // REP: lost
        f.on_send(now, dst(), &mad(0x10), &mut out); // REQ: not named
        f.on_send(now, dst(), &mad(0x13), &mut out); // REP again: goes
        f.on_send(now, dst(), &mad(0x14), &mut out); // RTU: lost
        let mut not_cm = mad(0x14);
        not_cm[7] = 2; // to another QP
        f.on_send(now, dst(), &not_cm, &mut out);
        f.on_send(now, dst(), b"short", &mut out);
        assert_eq!(out.len(), 4);
        assert_eq!(f.counts.dropped, 2);
    }

    #[test]
    fn fates_follow_the_configuration() {
        let now = Instant::now();
        let mut out = Vec::new();
        // Everything lost.
        let mut f = FaultInjector::new(FaultConfig {
            loss: 1.0,
            ..FaultConfig::default()
        });
        f.on_send(now, dst(), b"abc", &mut out);
        assert!(out.is_empty());
        assert_eq!(f.counts.dropped, 1);
        // Everything duplicated and corrupted in exactly one bit.
        let mut f = FaultInjector::new(FaultConfig {
            duplicate: 1.0,
            corrupt: 1.0,
            ..FaultConfig::default()
        });
        f.on_send(now, dst(), &[0u8; 16], &mut out);
        assert_eq!(out.len(), 2);
        for (_, b) in &out {
            assert_eq!(b.iter().map(|x| x.count_ones()).sum::<u32>(), 1);
        }
        // Reordered: the first waits for the second and goes after it; a lone one goes
        // after its wait.
        out.clear();
        let mut f = FaultInjector::new(FaultConfig {
            reorder: 1.0,
            ..FaultConfig::default()
        });
        f.on_send(now, dst(), b"first", &mut out);
        assert!(out.is_empty());
        f.on_send(now, dst(), b"second", &mut out);
        let order: Vec<&[u8]> = out.iter().map(|(_, b)| b.as_slice()).collect();
        assert_eq!(order, [&b"second"[..], &b"first"[..]]);
        out.clear();
        f.on_send(now, dst(), b"third", &mut out);
        assert!(out.is_empty());
        f.due(now, &mut out);
        assert!(out.is_empty());
        f.due(f.next_due().unwrap(), &mut out);
        assert_eq!(out.len(), 1);
        // Delayed: nothing before its time, in order after.
        out.clear();
        let mut f = FaultInjector::new(FaultConfig {
            delay: Duration::from_millis(5),
            ..FaultConfig::default()
        });
        f.on_send(now, dst(), b"a", &mut out);
        f.on_send(now, dst(), b"b", &mut out);
        assert!(out.is_empty());
        f.due(now + Duration::from_millis(4), &mut out);
        assert!(out.is_empty());
        f.due(now + Duration::from_millis(5), &mut out);
        let order: Vec<&[u8]> = out.iter().map(|(_, b)| b.as_slice()).collect();
        assert_eq!(order, [&b"a"[..], &b"b"[..]]);
        assert_eq!(f.next_due(), None);
    }

    #[test]
    fn the_same_seed_gives_the_same_fates() {
        let cfg = FaultConfig {
            loss: 0.3,
            duplicate: 0.3,
            seed: 42,
            ..FaultConfig::default()
        };
        let run = || {
            let mut f = FaultInjector::new(cfg);
            let mut out = Vec::new();
            for i in 0..200u32 {
                f.on_send(Instant::now(), dst(), &i.to_be_bytes(), &mut out);
            }
            out.into_iter().map(|(_, b)| b).collect::<Vec<_>>()
        };
        assert_eq!(run(), run());
    }

    #[test]
    fn fates_without_bytes_are_the_fates_of_on_send() {
        // What `fate` says goes or is lost is what `on_send` sends or loses, packet by
        // packet, for the same seed; only the rare faulted ones need the bytes.
        let cfg =
            FaultConfig::parse("loss=0.2,dup=0.05,corrupt=0.05,reorder=0.05,seed=11").unwrap();
        let (mut a, mut b) = (FaultInjector::new(cfg), FaultInjector::new(cfg));
        let now = Instant::now();
        let mut fates = [0usize; 3];
        for i in 0..2000u32 {
            let pkt = [i.to_be_bytes(), [0x5a; 4], [0xa5; 4]].concat();
            let mut out = Vec::new();
            a.on_send(now, dst(), &pkt, &mut out);
            let mut out2 = Vec::new();
            match b.fate(&pkt, pkt.len()) {
                Fate::Go => {
                    fates[0] += 1;
                    out2.push((dst(), pkt.clone()));
                }
                Fate::Lost => fates[1] += 1,
                Fate::Faulted(x) => {
                    fates[2] += 1;
                    b.apply(now, dst(), x, pkt.clone(), &mut out2);
                }
            }
            assert_eq!(out, out2, "packet {i}");
        }
        assert_eq!(a.counts, b.counts);
        assert!(fates.iter().all(|n| *n > 50), "{fates:?}");
        // Without faults other than loss, nothing needs the bytes: go or lost, the same
        // sequence for the same seed.
        let seq = || {
            let mut f = FaultInjector::new(FaultConfig::parse("loss=0.5,seed=3").unwrap());
            (0..32)
                .map(|_| match f.fate(&[0; 12], 12) {
                    Fate::Go => 'g',
                    Fate::Lost => 'l',
                    Fate::Faulted(_) => 'f',
                })
                .collect::<String>()
        };
        let s = seq();
        assert!(
            !s.contains('f') && s.contains('g') && s.contains('l'),
            "{s}"
        );
        assert_eq!(s, seq());
    }
}
