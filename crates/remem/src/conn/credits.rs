//! The credit window of a connection's message layer, as a pure state machine (no device,
//! no runtime).
//!
//! Each side grants its peer `window` credits (receive buffers it posted) in the
//! handshake. A sender spends one per message that consumes a receive at the peer and
//! waits when it has none. The receiver owes a credit back once the application has taken
//! the message; owed credits ride in the header of the next message going back, or in a
//! credit message of their own once a quarter of the window is owed. Both directions are
//! checked: a peer that sends more messages than it was granted, or returns more credits
//! than were spent, breaks the protocol.

use crate::error::ProtocolViolation;

/// Both directions of one connection's credits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CreditWindow {
    /// Credits this side grants its peer up front (its `recv_depth`).
    window: u32,
    /// Credits this side may spend now.
    available: u64,
    /// Credits this side has spent, and the peer has returned: it may not return more.
    spent: u64,
    returned: u64,
    /// Credits this side has granted (the window and every credit returned), and messages
    /// received that consume one: more received than granted breaks the protocol.
    granted: u64,
    received: u64,
    /// Credits owed to the peer (messages the application has taken), not yet returned.
    owed: u32,
    /// A credit message is in flight (at most one at a time).
    credit_msg_busy: bool,
}

impl CreditWindow {
    /// A window granting the peer `window` credits; this side has none until it learns the
    /// peer's window ([`CreditWindow::peer_window`]).
    pub(crate) fn new(window: u32) -> Self {
        CreditWindow {
            window,
            available: 0,
            spent: 0,
            returned: 0,
            granted: u64::from(window),
            received: 0,
            owed: 0,
            credit_msg_busy: false,
        }
    }

    /// The peer's window (from the handshake): credits this side may spend.
    pub(crate) fn peer_window(&mut self, credits: u32) {
        self.available += u64::from(credits);
    }

    /// Credits this side may spend now.
    #[cfg(test)]
    pub(crate) fn available(&self) -> u64 {
        self.available
    }

    /// Spends a credit to send a message, if one is left.
    pub(crate) fn try_spend(&mut self) -> bool {
        if self.available == 0 {
            return false;
        }
        self.available -= 1;
        self.spent += 1;
        true
    }

    /// A credit spent for a message that did not go after all.
    pub(crate) fn unspend(&mut self) {
        self.spent -= 1;
        self.available += 1;
    }

    /// The peer returned `n` credits (a message header's count).
    pub(crate) fn on_returned(&mut self, n: u16) -> Result<(), ProtocolViolation> {
        let returned = self.returned + u64::from(n);
        if returned > self.spent {
            return Err(ProtocolViolation::CreditsOverReturned);
        }
        self.returned = returned;
        self.available += u64::from(n);
        Ok(())
    }

    /// A message that consumes a credit arrived.
    pub(crate) fn on_received(&mut self) -> Result<(), ProtocolViolation> {
        self.received += 1;
        if self.received > self.granted {
            return Err(ProtocolViolation::CreditsExceeded {
                granted: self.granted,
            });
        }
        Ok(())
    }

    /// The application took a message (or this side handled it): its credit is owed.
    pub(crate) fn consumed(&mut self) {
        self.owed += 1;
    }

    /// Takes the credits owed to the peer (at most what a header carries) to return them
    /// in a message about to be posted: they count as granted from now on, before the peer
    /// can learn of them, so a message it sends on them never finds them missing.
    pub(crate) fn take_owed(&mut self) -> u16 {
        let take = self.owed.min(u32::from(u16::MAX));
        self.owed -= take;
        self.granted += u64::from(take);
        take as u16
    }

    /// Credits taken to return whose message did not go after all.
    pub(crate) fn untake_owed(&mut self, n: u16) {
        self.granted -= u64::from(n);
        self.owed += u32::from(n);
    }

    /// Whether to send a credit message now: a quarter of the window is owed and none is
    /// in flight. If so, one is taken to be in flight until
    /// [`CreditWindow::credit_msg_done`].
    pub(crate) fn want_credit_msg(&mut self) -> bool {
        if self.owed < (self.window / 4).max(1) || self.credit_msg_busy {
            return false;
        }
        self.credit_msg_busy = true;
        true
    }

    /// Whether a probe (a credit message, whatever is owed) may go now: none is in
    /// flight. If so, it is taken to be in flight until [`CreditWindow::credit_msg_done`].
    pub(crate) fn want_probe(&mut self) -> bool {
        !std::mem::replace(&mut self.credit_msg_busy, true)
    }

    /// The credit message in flight completed (or was not posted).
    pub(crate) fn credit_msg_done(&mut self) {
        self.credit_msg_busy = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spend_until_empty_then_wait_for_returns() {
        let mut c = CreditWindow::new(8);
        assert!(
            !c.try_spend(),
            "no credits before the peer's window is known"
        );
        c.peer_window(2);
        assert!(c.try_spend() && c.try_spend());
        assert!(!c.try_spend());
        c.on_returned(1).unwrap();
        assert_eq!(c.available(), 1);
        assert!(c.try_spend());
        c.unspend();
        assert_eq!(c.available(), 1);
    }

    #[test]
    fn over_returned_is_a_violation() {
        let mut c = CreditWindow::new(8);
        c.peer_window(4);
        assert!(c.try_spend());
        assert_eq!(
            c.on_returned(2),
            Err(ProtocolViolation::CreditsOverReturned)
        );
        assert_eq!(c.on_returned(1), Ok(()));
        assert_eq!(
            c.on_returned(1),
            Err(ProtocolViolation::CreditsOverReturned)
        );
    }

    #[test]
    fn received_beyond_granted_is_a_violation() {
        let mut c = CreditWindow::new(2);
        c.on_received().unwrap();
        c.on_received().unwrap();
        assert_eq!(
            c.on_received(),
            Err(ProtocolViolation::CreditsExceeded { granted: 2 })
        );
        // A returned credit grants one more.
        let mut c = CreditWindow::new(1);
        c.on_received().unwrap();
        c.consumed();
        assert_eq!(c.take_owed(), 1);
        c.on_received().unwrap();
        assert!(c.on_received().is_err());
    }

    #[test]
    fn owed_credits_and_the_credit_message() {
        let mut c = CreditWindow::new(8);
        c.consumed();
        assert!(
            !c.want_credit_msg(),
            "a quarter of the window (2) is not owed yet"
        );
        c.consumed();
        assert!(c.want_credit_msg());
        assert!(!c.want_credit_msg(), "one credit message at a time");
        assert_eq!(c.take_owed(), 2);
        c.untake_owed(2);
        assert_eq!(c.take_owed(), 2);
        assert_eq!(c.take_owed(), 0);
        c.credit_msg_done();
        assert!(c.want_probe());
        assert!(!c.want_probe());
    }

    #[test]
    fn a_header_returns_at_most_u16_max() {
        let mut c = CreditWindow::new(1);
        for _ in 0..70_000 {
            c.consumed();
        }
        assert_eq!(c.take_owed(), u16::MAX);
        assert_eq!(c.take_owed(), (70_000 - 65_535) as u16);
    }

    /// A model of two sides exchanging messages, each with the real [`CreditWindow`] and
    /// a send queue of `depth` entries for operations, sends and credit messages posted
    /// as the connection does (`ConnShared::credited_entry`, `post_control`,
    /// `retry_credits`). `credit_first` and `reserve` are the design: today's takes the
    /// credit before the entry and reserves `CONTROL_RESERVE` entries for control
    /// messages; the design before issue 29 took the entry first, from one pool.
    #[derive(Clone, Copy, Debug)]
    struct Design {
        credit_first: bool,
        reserve: u32,
    }

    const NOW: Design = Design {
        credit_first: true,
        reserve: crate::conn::posting::CONTROL_RESERVE,
    };
    const BEFORE: Design = Design {
        credit_first: false,
        reserve: 0,
    };

    #[derive(Clone, Copy, Debug)]
    enum Wire {
        /// A message that consumes a credit, returning `n`.
        Data(u16),
        /// A credit message returning `n` (on a control entry in `NOW`).
        Credit(u16),
    }

    struct Side {
        credits: CreditWindow,
        /// Entries for operations free; control entries free.
        data_free: u32,
        control_free: u32,
        /// Sends not yet begun; holding an entry, waiting for a credit (`BEFORE`);
        /// holding a credit, waiting for an entry (`NOW`).
        to_start: u32,
        with_entry: u32,
        with_credit: u32,
        /// On the wire to the other side, in order (RC).
        wire: std::collections::VecDeque<Wire>,
        /// Arrived, not yet taken by the application.
        inbox: u32,
        taken: u32,
        retry: bool,
    }

    impl Side {
        /// The application took a message, or a completion came: a credit message if
        /// one is due (`maybe_return_credits`).
        fn maybe_return(&mut self, d: Design) {
            if !self.credits.want_credit_msg() {
                return;
            }
            let free = if d.reserve > 0 {
                &mut self.control_free
            } else {
                &mut self.data_free
            };
            if *free == 0 {
                self.credits.credit_msg_done();
                self.retry = true;
                return;
            }
            *free -= 1;
            let n = self.credits.take_owed();
            self.wire.push_back(Wire::Credit(n));
        }
    }

    /// Runs the model, choosing among the steps that can be taken with `choices`, until
    /// every message has arrived and been taken (true) or nothing can move (false).
    fn run(d: Design, depth: u32, windows: [u32; 2], n: u32, choices: &[u16]) -> bool {
        let mut sides: Vec<Side> = (0..2)
            .map(|s| {
                let mut credits = CreditWindow::new(windows[s]);
                credits.peer_window(windows[1 - s]);
                Side {
                    credits,
                    data_free: depth,
                    control_free: d.reserve,
                    to_start: n,
                    with_entry: 0,
                    with_credit: 0,
                    wire: Default::default(),
                    inbox: 0,
                    taken: 0,
                    retry: false,
                }
            })
            .collect();
        let mut step = 0usize;
        loop {
            if sides.iter().all(|s| s.taken == n) {
                return true;
            }
            // Every step that can be taken now: (side, what).
            let mut can = Vec::new();
            for (i, s) in sides.iter().enumerate() {
                if s.to_start > 0 {
                    can.push((i, 0));
                }
                if s.with_entry > 0 && s.credits.available > 0 {
                    can.push((i, 1));
                }
                if s.with_credit > 0 && s.data_free > 0 {
                    can.push((i, 2));
                }
                if !s.wire.is_empty() {
                    can.push((i, 3));
                }
                if s.inbox > 0 {
                    can.push((i, 4));
                }
            }
            // A send begins once what it waits for first is there: a credit (`NOW`) or an
            // entry (`BEFORE`).
            can.retain(|&(i, what)| {
                let s = &sides[i];
                what != 0
                    || if d.credit_first {
                        s.credits.available > 0
                    } else {
                        s.data_free > 0
                    }
            });
            if can.is_empty() {
                return false;
            }
            let (i, what) = can[choices
                .get(step % choices.len().max(1))
                .copied()
                .unwrap_or(0) as usize
                % can.len()];
            step += 1;
            let (me, peer) = if i == 0 {
                let (a, b) = sides.split_at_mut(1);
                (&mut a[0], &mut b[0])
            } else {
                let (a, b) = sides.split_at_mut(1);
                (&mut b[0], &mut a[0])
            };
            match what {
                // A send begins: it waits for a credit first (`NOW`), or takes an entry.
                0 => {
                    me.to_start -= 1;
                    if d.credit_first {
                        assert!(me.credits.try_spend());
                        me.with_credit += 1;
                    } else {
                        me.data_free -= 1;
                        me.with_entry += 1;
                    }
                }
                // `BEFORE`: a send holding an entry spends a credit, and goes.
                1 => {
                    assert!(me.credits.try_spend());
                    me.with_entry -= 1;
                    let h = me.credits.take_owed();
                    me.wire.push_back(Wire::Data(h));
                }
                // `NOW`: a send holding a credit takes an entry, and goes.
                2 => {
                    me.with_credit -= 1;
                    me.data_free -= 1;
                    let h = me.credits.take_owed();
                    me.wire.push_back(Wire::Data(h));
                }
                // The next message on the wire arrives; its completion frees its entry.
                3 => {
                    match me.wire.pop_front().unwrap() {
                        Wire::Data(h) => {
                            peer.credits.on_received().expect("within the grant");
                            peer.credits.on_returned(h).expect("no more than spent");
                            peer.inbox += 1;
                            me.data_free += 1;
                        }
                        Wire::Credit(h) => {
                            peer.credits.on_returned(h).expect("no more than spent");
                            if d.reserve > 0 {
                                me.control_free += 1;
                            } else {
                                me.data_free += 1;
                            }
                            me.credits.credit_msg_done();
                            me.maybe_return(d);
                        }
                    }
                    if std::mem::take(&mut me.retry) {
                        me.maybe_return(d);
                    }
                }
                // The application takes a message: its credit is owed.
                _ => {
                    me.inbox -= 1;
                    me.taken += 1;
                    me.credits.consumed();
                    me.maybe_return(d);
                }
            }
        }
    }

    #[test]
    fn the_model_finds_the_stall_of_the_design_before() {
        // Issue 29: more sends than entries each way, both receiving — stuck, as it was.
        assert!(!run(BEFORE, 8, [4, 4], 40, &[0]));
        assert!(run(NOW, 8, [4, 4], 40, &[0]));
    }

    proptest::proptest! {
        /// Whatever the send queue's depth, both windows, the sends each way and the order
        /// things happen in, every message arrives and is taken: nothing waits for ever.
        #[test]
        fn credits_always_return(
            depth in 1u32..20,
            w0 in 1u32..40,
            w1 in 1u32..40,
            n in 0u32..120,
            choices in proptest::collection::vec(0u16..64, 1..64),
        ) {
            proptest::prop_assert!(run(NOW, depth, [w0, w1], n, &choices));
        }
    }
}
