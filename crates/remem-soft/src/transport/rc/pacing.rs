//! How fast the requester sends: a congestion window in packets and an adaptive retransmit
//! timer. Pure state, no I/O and no packets: the requester asks it how many PSNs it may
//! have unacknowledged ([`Pacing::limit`]) and when to retransmit early
//! ([`Pacing::rto`]), and tells it what happened (ACKs, losses, RTT samples, timeouts).
//!
//! Nothing here changes what goes on the wire, only when: the requester still speaks
//! IBTA go-back-N (it resends from the first PSN the peer has not acknowledged, or from
//! the PSN a sequence NAK names), so any responder — kernel rxe, a RoCE NIC — sees nothing
//! but requests, in order, some of them duplicates.
//!
//! - **Congestion window** (as TCP Reno, RFC 5681, counted in packets): it starts at the
//!   QP's window (a loss-free link is not slowed at all), grows by one packet per packet
//!   acknowledged below `ssthresh` and by one packet per window above it, and halves on a
//!   loss event (a sequence NAK, an out-of-order READ response, an early retransmission) —
//!   once per round trip: the losses of one window of packets show within a round trip of
//!   the first, and go-back-N makes every loss after a retransmission a loss of the new
//!   window, so PSNs cannot tell the events apart (TCP's `recover` point can: it keeps
//!   what it sent beyond a loss). No growth while the cut is less than a round trip old.
//!   Never below [`CWND_FLOOR`], and a cut stops at the go-back-N window (below).
//! - **The go-back-N window.** A responder that loses a packet drops every packet after it
//!   until the resend, so a loss costs about a window of packets, where TCP's costs one.
//!   With a loss rate `p` and a window of `w` packets, about `w·(1 − p·w)` packets of a
//!   round trip's `w` are useful: most at `w = 1/(2p)`. Reno's window for random loss,
//!   about `1.2/√p`, is well below that (at 1 % loss 12 packets against 50, a third of the
//!   goodput); so the requester measures its loss rate (losses per packet sent, first
//!   transmissions and resends alike, over the last few thousand) and cuts no lower than
//!   `1/(2p)`, up to [`GO_BACK_N_MAX`] packets. The ceiling bounds what an estimate from
//!   few losses asks for (two losses in a thousand packets would ask for 250), and is a
//!   compromise between two kinds of path: where the round trip under load is mostly the
//!   ends' processing (loopback, veth: 15 µs idle, 70 µs loaded here) a larger window is
//!   more goodput, but where a link's rate is the bound (the simulation's 10 Gbit/s link) a
//!   window past its bandwidth-delay product only adds packets a loss throws away (an
//!   estimate of that product from the delivery rate and the smallest RTT was tried: on
//!   loopback it reads the processing delay as no capacity and shrinks the window with the
//!   rate it causes).
//!   Loss from congestion still narrows the window: a window that causes more loss
//!   raises `p`.
//! - **Retransmit timer** (RFC 6298): SRTT and RTTVAR from RTT samples of packets sent
//!   once (Karn: a retransmitted packet's ACK is ambiguous, so it gives no sample); the
//!   RTO is `SRTT + 4·RTTVAR`, doubled per early retransmission until forward progress or
//!   a new sample, and clamped to [[`MIN_RTO`], the QP's local ACK timeout]; before the
//!   first sample it is the ACK timeout.
//! - **The pace of READ responses.** A READ is answered by a stream of responses whose
//!   length the round trip does not show: a responder on a slow link, or one that sends in
//!   bursts (kernel rxe under load), may take far longer between two responses than a
//!   small message's round trip, and a timer armed from that round trip would re-request a
//!   READ whose responses are still coming (and a responder such as rxe then sends the
//!   rest of it again, behind which every later request waits). So while the oldest
//!   outstanding request is a READ the timer allows, besides the RTO, twice the time the
//!   next response takes at the slowest pace the responder has answered at lately
//!   ([`Pacing::on_answer_gap`]: time per byte between two responses of one READ, a
//!   maximum that decays with a half-life of [`PACE_HALF_LIFE`]: a responder that sends in
//!   bursts with pauses between them — rxe in an emulated guest pauses for milliseconds
//!   after tens of back-to-back responses — is timed by its pauses, which a decay per
//!   sample would forget within a burst); before any pace is measured, the ACK timeout
//!   (as before the first RTT sample). A READ whose responses keep coming is never
//!   retransmitted early; a lost response still shows at once as a gap in the PSNs.

use std::time::{Duration, Instant};

/// The smallest congestion window, in packets.
pub(super) const CWND_FLOOR: u32 = 8;

/// The go-back-N window's ceiling, in packets (see the module's documentation): about the
/// optimum at 1 % loss (50). Measured in one sitting (`bench/loss.sh`, netns + veth),
/// `write_bw` 64 KiB at 1 % loss got 0.63–0.64 of loss-free with 48 against 0.47–0.57 with
/// 32, the same at 5 %; the simulation's rate-bound link sends 4.1–4.6 packets per packet
/// needed at 5 % with 48 against 3.5–4.0 with 32 (2.9 before the go-back-N window).
pub(super) const GO_BACK_N_MAX: u32 = 48;

/// Packets sent before the loss rate is trusted (and the go-back-N window used).
const LOSS_RATE_MIN_PACKETS: f64 = 256.0;

/// The loss rate covers about this many packets sent: the counts are halved when they
/// reach it.
const LOSS_RATE_SPAN: f64 = 4096.0;

/// The smallest retransmission timeout: several round trips of a loopback or LAN path under
/// load (50–150 µs measured on loopback), so that jitter rarely causes a spurious one.
pub(super) const MIN_RTO: Duration = Duration::from_micros(250);

/// The RTO before the first RTT sample, when the QP has no ACK timeout (RFC 6298's 1 s).
/// With one, the ACK timeout itself: until the path is measured, the requester retransmits
/// no earlier than IBTA's timer says.
const INITIAL_RTO: Duration = Duration::from_secs(1);

/// The half-life of the slowest READ response pace (see the module's documentation): long
/// enough to span the bursts of a responder that pauses between them, short enough that
/// one hiccup does not slow loss detection for long.
pub(super) const PACE_HALF_LIFE: Duration = Duration::from_millis(500);

/// Header bytes counted with each READ response's payload when timing the responder's
/// pace (Ethernet, IPv4, UDP, BTH, AETH, ICRC: what a link carries besides the payload).
const RESPONSE_OVERHEAD: u32 = 14 + 20 + 8 + 12 + 4 + 4;

/// Congestion window and retransmit timer of one requester.
#[derive(Debug, Clone)]
pub(super) struct Pacing {
    /// The most the window may grow to (the QP's window).
    max: u32,
    /// Congestion window, packets.
    cwnd: u32,
    /// Slow-start threshold, packets.
    ssthresh: u32,
    /// Packets acknowledged towards the next additive increase.
    acked: u32,
    /// The loss event in progress: losses until then belong to it and do not cut the
    /// window again.
    recover: Option<Instant>,
    srtt: Option<Duration>,
    rttvar: Duration,
    /// Doublings of the RTO since the last sample.
    backoff: u32,
    /// The QP's local ACK timeout (the RTO's ceiling); `None`: no timeout.
    max_rto: Option<Duration>,
    /// The window (cwnd, ssthresh) before the last early retransmission cut it, until
    /// the next forward progress shows whether that retransmission was needed.
    undo: Option<(u32, u32)>,
    /// Packets sent and losses detected, decayed together (the loss rate).
    sent: f64,
    losses: f64,
    /// The slowest pace READ responses came at lately, nanoseconds per byte (a maximum
    /// decaying with a half-life of [`PACE_HALF_LIFE`]), and when it was last updated;
    /// `None` until a READ's responses were timed.
    answer_pace: Option<(f64, Instant)>,
}

impl Pacing {
    /// Pacing for a QP whose window is `window` PSNs and whose local ACK timeout is
    /// `ack_timeout`.
    pub(super) fn new(window: u32, ack_timeout: Option<Duration>) -> Pacing {
        let max = window.max(1);
        Pacing {
            max,
            cwnd: max,
            ssthresh: u32::MAX,
            acked: 0,
            recover: None,
            srtt: None,
            rttvar: Duration::ZERO,
            backoff: 0,
            max_rto: ack_timeout,
            undo: None,
            sent: 0.0,
            losses: 0.0,
            answer_pace: None,
        }
    }

    /// Applies the QP's window and local ACK timeout (on every state change: a QP in RTS
    /// may be given a new timeout).
    pub(super) fn configure(&mut self, window: u32, ack_timeout: Option<Duration>) {
        self.max = window.max(1);
        self.cwnd = self.cwnd.min(self.max);
        self.max_rto = ack_timeout;
    }

    /// The congestion window, packets.
    pub(super) fn cwnd(&self) -> u32 {
        self.cwnd
    }

    /// The most PSNs the requester may have unacknowledged now.
    pub(super) fn limit(&self) -> u32 {
        self.cwnd.min(self.max).max(1)
    }

    /// The smoothed RTT, once there is a sample.
    pub(super) fn srtt(&self) -> Option<Duration> {
        self.srtt
    }

    /// `n` packets were newly acknowledged at `now`. Grows the window (not while a loss
    /// event is being recovered from).
    pub(super) fn on_ack(&mut self, n: u32, now: Instant) {
        // The path delivers again: the RTO backoff ends with forward progress, not only
        // with an RTT sample (during go-back-N every packet is a retransmission and gives
        // none).
        if n > 0 {
            self.backoff = 0;
        }
        if let Some(r) = self.recover {
            if now < r {
                return;
            }
            self.recover = None;
        }
        if self.cwnd < self.ssthresh {
            self.cwnd = self.cwnd.saturating_add(n);
        } else {
            self.acked = self.acked.saturating_add(n);
            while self.acked >= self.cwnd {
                self.acked -= self.cwnd;
                self.cwnd += 1;
            }
        }
        self.cwnd = self.cwnd.min(self.max);
    }

    /// A loss was detected at `now`. Cuts the window in half unless the loss belongs to
    /// the event in progress (a cut less than a round trip ago). Returns whether it cut.
    pub(super) fn on_loss(&mut self, now: Instant) -> bool {
        self.undo = None;
        self.losses += 1.0;
        if self.recover.is_some_and(|r| now < r) {
            return false;
        }
        self.ssthresh = (self.cwnd / 2).max(self.go_back_n_window());
        self.cwnd = self.ssthresh;
        self.acked = 0;
        self.recover = Some(now + self.round_trip());
        true
    }

    /// The QP's ACK timeout passed without progress at `now`: the path may be gone; start
    /// again from the smallest window.
    pub(super) fn on_stall(&mut self, now: Instant) {
        self.ssthresh = (self.cwnd / 2).max(CWND_FLOOR);
        self.cwnd = CWND_FLOOR;
        self.acked = 0;
        self.recover = Some(now + self.round_trip());
    }

    /// `n` packets were sent (first transmissions or resends): the loss rate's base.
    pub(super) fn on_sent(&mut self, n: u32) {
        self.sent += f64::from(n);
        if self.sent >= LOSS_RATE_SPAN {
            self.sent /= 2.0;
            self.losses /= 2.0;
        }
    }

    /// The window a loss cuts no lower than: `1/(2p)` packets for the measured loss rate
    /// `p` (see the module's documentation), within [[`CWND_FLOOR`], the QP's window];
    /// [`CWND_FLOOR`] until enough packets were sent to measure `p`.
    pub(super) fn go_back_n_window(&self) -> u32 {
        if self.sent < LOSS_RATE_MIN_PACKETS || self.losses <= 0.0 {
            return CWND_FLOOR.min(self.max);
        }
        let w = (self.sent / (2.0 * self.losses)).min(f64::from(GO_BACK_N_MAX));
        (w.min(f64::from(self.max)) as u32).clamp(CWND_FLOOR.min(self.max), self.max)
    }

    /// A round trip: the smoothed RTT, or before any sample the RTO.
    fn round_trip(&self) -> Duration {
        self.srtt.unwrap_or_else(|| self.rto())
    }

    /// An RTT sample of a packet sent once.
    pub(super) fn on_rtt(&mut self, rtt: Duration) {
        match self.srtt {
            None => {
                self.srtt = Some(rtt);
                self.rttvar = rtt / 2;
            }
            Some(srtt) => {
                let err = srtt.abs_diff(rtt);
                self.rttvar = (self.rttvar * 3 + err) / 4;
                self.srtt = Some((srtt * 7 + rtt) / 8);
            }
        }
        self.backoff = 0;
    }

    /// The retransmit timer expired at `now`: the next RTO is twice as long (until
    /// progress or a sample), and the window is cut as for a loss — undone by
    /// [`Self::spurious`] if the retransmission turns out not to have been needed.
    pub(super) fn on_rto(&mut self, now: Instant) -> bool {
        self.backoff = (self.backoff + 1).min(16);
        let before = (self.cwnd, self.ssthresh);
        let cut = self.on_loss(now);
        if cut {
            self.undo = Some(before);
        }
        cut
    }

    /// Whether an early retransmission's cut is still waiting to be judged.
    pub(super) fn undo_pending(&self) -> bool {
        self.undo.is_some()
    }

    /// The forward progress after an early retransmission showed it was needed (`false`)
    /// or spurious (`true`: the peer acknowledged packets of the first transmission that
    /// were not sent again yet — the path was only slow, as a descheduled peer is): a
    /// spurious one's cut is undone (as Eifel, RFC 3522, does with timestamps).
    pub(super) fn judge_rto(&mut self, spurious: bool) {
        if let Some((cwnd, ssthresh)) = self.undo.take()
            && spurious
        {
            self.cwnd = cwnd;
            self.ssthresh = ssthresh;
            self.recover = None;
        }
    }

    /// Two READ responses of one READ came `gap` apart, the second (at `now`) carrying
    /// `bytes` of payload: the responder's pace (see the module's documentation).
    pub(super) fn on_answer_gap(&mut self, now: Instant, gap: Duration, bytes: u32) {
        let pace = gap.as_nanos() as f64 / f64::from(bytes.saturating_add(RESPONSE_OVERHEAD));
        let slowest = match self.answer_pace {
            Some((p, at)) => {
                let age = now.saturating_duration_since(at).as_secs_f64();
                pace.max(p * 0.5f64.powf(age / PACE_HALF_LIFE.as_secs_f64()))
            }
            None => pace,
        };
        self.answer_pace = Some((slowest, now));
    }

    /// The retransmission timeout while the next thing expected is a READ response of
    /// `bytes` bytes of payload: the RTO and twice the time that response takes at the
    /// responder's slowest recent pace (within the ACK timeout); before any pace was
    /// measured, the ACK timeout (no early retransmission of a READ on a round trip
    /// measured with small messages).
    pub(super) fn answer_rto(&self, bytes: u32) -> Duration {
        let rto = self.rto();
        let Some((pace, _)) = self.answer_pace else {
            return self.max_rto.unwrap_or(INITIAL_RTO).max(rto);
        };
        let wire = f64::from(bytes.saturating_add(RESPONSE_OVERHEAD));
        let allowance = Duration::from_nanos((2.0 * pace * wire).min(1e15) as u64);
        let rto = rto.saturating_add(allowance);
        match self.max_rto {
            Some(max) => rto.min(max),
            None => rto,
        }
    }

    /// The retransmission timeout now.
    pub(super) fn rto(&self) -> Duration {
        let base = match self.srtt {
            Some(srtt) => srtt + (self.rttvar * 4).max(Duration::from_micros(1)),
            None => self.max_rto.unwrap_or(INITIAL_RTO),
        };
        let rto = base.max(MIN_RTO).saturating_mul(1 << self.backoff.min(16));
        match self.max_rto {
            Some(max) => rto.min(max),
            None => rto,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const T: Option<Duration> = Some(Duration::from_millis(268));
    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn starts_at_the_window_and_does_not_slow_a_clean_link() {
        let mut p = Pacing::new(128, T);
        assert_eq!(p.limit(), 128);
        p.on_ack(1000, Instant::now());
        assert_eq!(p.limit(), 128, "capped by the QP's window");
    }

    #[test]
    fn halves_once_per_round_trip_of_losses() {
        let t0 = Instant::now();
        let mut p = Pacing::new(128, T);
        p.on_rtt(10 * MS);
        assert!(p.on_loss(t0));
        assert_eq!(p.cwnd(), 64);
        // More losses within the round trip: the same event.
        assert!(!p.on_loss(t0 + MS));
        assert!(!p.on_loss(t0 + 9 * MS));
        assert_eq!(p.cwnd(), 64);
        // No growth while recovering.
        p.on_ack(20, t0 + 5 * MS);
        assert_eq!(p.cwnd(), 64);
        // A loss a round trip later is a new event.
        assert!(p.on_loss(t0 + 10 * MS));
        assert_eq!(p.cwnd(), 32);
    }

    #[test]
    fn grows_additively_above_ssthresh() {
        let t0 = Instant::now();
        let mut p = Pacing::new(128, T);
        p.on_rtt(MS);
        p.on_loss(t0);
        assert_eq!(p.cwnd(), 64);
        let later = t0 + 2 * MS;
        p.on_ack(10, later); // recovery over; additive: 10 of 64 towards one more
        assert_eq!(p.cwnd(), 64);
        p.on_ack(54, later);
        assert_eq!(p.cwnd(), 65);
    }

    #[test]
    fn never_below_the_floor_and_a_stall_starts_from_it() {
        let t0 = Instant::now();
        let mut p = Pacing::new(128, T);
        p.on_rtt(MS);
        for i in 0..20u32 {
            p.on_loss(t0 + i * 2 * MS);
        }
        assert_eq!(p.cwnd(), CWND_FLOOR);
        let mut p = Pacing::new(128, T);
        p.on_rtt(MS);
        p.on_stall(t0);
        assert_eq!(p.cwnd(), CWND_FLOOR);
        // Slow start back up to ssthresh (64).
        p.on_ack(8, t0 + 2 * MS);
        assert_eq!(p.cwnd(), 16);
    }

    #[test]
    fn a_cut_stops_at_the_go_back_n_window_of_the_measured_loss_rate() {
        let t0 = Instant::now();
        let mut p = Pacing::new(1024, T);
        p.on_rtt(MS);
        // 2,000 packets sent and 20 losses: p = 1 %, 1/(2p) = 50 packets, capped.
        for i in 0..20u32 {
            p.on_sent(100);
            p.on_loss(t0 + (2 * i) * MS);
        }
        assert_eq!(p.go_back_n_window(), GO_BACK_N_MAX);
        for i in 0..20u32 {
            p.on_loss(t0 + (100 + 2 * i) * MS);
        }
        // 40 losses per 2,000: 25 packets, still above the floor.
        assert_eq!(p.go_back_n_window(), 25);
        assert_eq!(p.cwnd(), 25, "cut no lower");
        // A heavier loss rate narrows it down to the floor.
        for i in 0..400u32 {
            p.on_loss(t0 + (200 + 2 * i) * MS);
        }
        assert_eq!(p.cwnd(), CWND_FLOOR);
        // Loss-free packets bring it back up (the counts decay).
        for _ in 0..100 {
            p.on_sent(1000);
        }
        assert_eq!(p.go_back_n_window(), GO_BACK_N_MAX);
    }

    #[test]
    fn rto_follows_rfc_6298_within_its_clamps() {
        let mut p = Pacing::new(128, T);
        assert_eq!(p.rto(), T.unwrap(), "no sample: the ACK timeout");
        assert_eq!(Pacing::new(128, None).rto(), INITIAL_RTO);
        p.on_rtt(4 * MS);
        // SRTT 4 ms, RTTVAR 2 ms: 4 + 8 = 12 ms.
        assert_eq!(p.rto(), 12 * MS);
        for _ in 0..100 {
            p.on_rtt(4 * MS);
        }
        assert!(p.rto() < 5 * MS);
        // A tiny RTT: the floor.
        let mut q = Pacing::new(128, T);
        for _ in 0..100 {
            q.on_rtt(Duration::from_micros(10));
        }
        assert_eq!(q.rto(), MIN_RTO);
        // Backoff doubles, capped by the ACK timeout; a sample resets it.
        let t0 = Instant::now();
        q.on_rto(t0);
        assert_eq!(q.rto(), MIN_RTO * 2);
        for _ in 0..20 {
            q.on_rto(t0);
        }
        assert_eq!(q.rto(), T.unwrap());
        q.on_rtt(Duration::from_micros(10));
        assert_eq!(q.rto(), MIN_RTO);
        // No ACK timeout: no cap.
        let mut n = Pacing::new(128, None);
        for _ in 0..20 {
            n.on_rto(t0);
        }
        assert!(n.rto() > T.unwrap());
    }

    #[test]
    fn a_spurious_early_retransmission_is_undone() {
        let t0 = Instant::now();
        let mut p = Pacing::new(128, T);
        p.on_rtt(MS);
        assert!(p.on_rto(t0));
        assert_eq!(p.cwnd(), 64);
        assert!(p.undo_pending());
        p.judge_rto(true);
        assert_eq!(p.cwnd(), 128);
        assert!(!p.undo_pending());
        // A needed one stays cut; so does one a real loss followed.
        assert!(p.on_rto(t0 + 10 * MS));
        p.judge_rto(false);
        assert_eq!(p.cwnd(), 64);
        assert!(p.on_rto(t0 + 20 * MS));
        p.on_loss(t0 + 20 * MS);
        p.judge_rto(true);
        assert_eq!(p.cwnd(), 32);
    }

    #[test]
    fn a_read_is_timed_at_the_pace_of_its_responses() {
        let mut p = Pacing::new(128, T);
        // Small messages measured a 40 µs round trip: the RTO is its floor.
        for _ in 0..50 {
            p.on_rtt(Duration::from_micros(40));
        }
        assert_eq!(p.rto(), MIN_RTO);
        // No response pace measured yet: a READ waits for the ACK timeout.
        assert_eq!(p.answer_rto(4096), T.unwrap());
        // Responses of 4096 bytes a millisecond apart (4 MB/s): the RTO and twice that.
        let t0 = Instant::now();
        p.on_answer_gap(t0, MS, 4096);
        let rto = p.answer_rto(4096);
        assert!(
            rto >= MIN_RTO + 2 * MS - Duration::from_micros(1),
            "{rto:?}"
        );
        assert!(
            rto <= MIN_RTO + 2 * MS + Duration::from_micros(1),
            "{rto:?}"
        );
        // A smaller response is expected sooner.
        assert!(p.answer_rto(64) < MIN_RTO + Duration::from_micros(70));
        // A burst of back-to-back responses right after does not forget the pause...
        for i in 0..200u32 {
            p.on_answer_gap(
                t0 + i * Duration::from_micros(10),
                Duration::from_micros(10),
                4096,
            );
        }
        assert!(
            p.answer_rto(4096) > MIN_RTO + MS,
            "{:?}",
            p.answer_rto(4096)
        );
        // ...but fast responses for a few half-lives do.
        let later = t0 + PACE_HALF_LIFE * 12;
        p.on_answer_gap(later, Duration::from_micros(10), 4096);
        assert!(p.answer_rto(4096) < MIN_RTO + Duration::from_micros(30));
        // A pause raises it at once; the ACK timeout caps it.
        p.on_answer_gap(later, Duration::from_secs(5), 64);
        assert_eq!(p.answer_rto(4096), T.unwrap());
    }

    #[derive(Debug, Clone)]
    enum Ev {
        /// Packets sent.
        Sent(u32),
        Ack(u32),
        Loss,
        Stall,
        Rtt(u64),
        Rto,
        Judge(bool),
        /// Time passes (µs).
        Wait(u64),
    }

    fn ev() -> impl Strategy<Value = Ev> {
        prop_oneof![
            (0u32..300).prop_map(Ev::Ack),
            (0u32..3000).prop_map(Ev::Sent),
            Just(Ev::Loss),
            Just(Ev::Stall),
            (0u64..1_000_000).prop_map(Ev::Rtt),
            Just(Ev::Rto),
            any::<bool>().prop_map(Ev::Judge),
            (0u64..100_000).prop_map(Ev::Wait),
        ]
    }

    proptest! {
        /// Whatever happens, the window stays within [1, the QP's window] (and at least
        /// the floor when the QP's window allows it), and the RTO within its clamps.
        #[test]
        fn bounds_hold(window in 1u32..2048, evs in proptest::collection::vec(ev(), 0..200)) {
            let mut p = Pacing::new(window, T);
            let mut now = Instant::now();
            for e in evs {
                match e {
                    Ev::Ack(n) => p.on_ack(n, now),
                    Ev::Sent(n) => p.on_sent(n),
                    Ev::Loss => { p.on_loss(now); }
                    Ev::Stall => p.on_stall(now),
                    Ev::Rtt(us) => p.on_rtt(Duration::from_micros(us)),
                    Ev::Rto => { p.on_rto(now); }
                    Ev::Judge(spurious) => p.judge_rto(spurious),
                    Ev::Wait(us) => now += Duration::from_micros(us),
                }
                prop_assert!(p.limit() >= 1 && p.limit() <= window);
                prop_assert!(p.limit() >= CWND_FLOOR.min(window));
                prop_assert!(p.rto() >= MIN_RTO.min(T.unwrap()));
                prop_assert!(p.rto() <= T.unwrap());
            }
        }

        /// Losses within a round trip of the first cut the window once, however many.
        #[test]
        fn one_cut_per_round_trip(
            rtt_us in 1u64..100_000,
            at in proptest::collection::vec(0.0f64..1.0, 1..50),
        ) {
            let rtt = Duration::from_micros(rtt_us);
            let mut p = Pacing::new(1024, T);
            p.on_rtt(rtt);
            let t0 = Instant::now();
            let before = p.cwnd();
            prop_assert!(p.on_loss(t0));
            let cuts = at.iter().filter(|&&f| p.on_loss(t0 + rtt.mul_f64(f))).count();
            prop_assert_eq!(cuts, 0);
            prop_assert_eq!(p.cwnd(), before / 2);
        }
    }
}
