//! The membership table of a shared device (see [`crate::io::host`]): which processes hold
//! which slots, at which index of the kernel's reuseport group, which slots were freed
//! when (their QP numbers rest before they are handed out again), and who listens on which
//! service. Pure: parsed from and written to the registry's `table` file under its lock.
//!
//! The index mirror follows the kernel: a socket joining a reuseport group takes the next
//! index; when a socket leaves, the group's last socket moves into the index it left
//! (`reuseport_detach_sock`).

use super::steer::{FIRST_SLOT, LAST_SLOT};

/// One process's membership.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Member {
    /// Its slot (1–254).
    pub slot: u8,
    /// Its process ID.
    pub pid: u32,
    /// Its start time (`/proc/<pid>/stat` field 22), which tells a reused pid apart.
    pub start: u64,
    /// Its socket's index in the reuseport group.
    pub index: u16,
}

/// The table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Table {
    /// The members, in no particular order.
    pub members: Vec<Member>,
    /// Slots freed, with when (milliseconds since the epoch).
    pub freed: Vec<(u8, u64)>,
    /// Who listens on what: (slot, service ID).
    pub listens: Vec<(u8, u64)>,
}

impl Table {
    /// Reads a table; lines it does not understand are left out.
    pub fn parse(text: &str) -> Table {
        let mut t = Table::default();
        for line in text.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            let num = |i: usize| f.get(i).and_then(|s| s.parse::<u64>().ok());
            match f.first() {
                Some(&"m") => {
                    if let (Some(slot), Some(pid), Some(start), Some(index)) =
                        (num(1), num(2), num(3), num(4))
                    {
                        t.members.push(Member {
                            slot: slot as u8,
                            pid: pid as u32,
                            start,
                            index: index as u16,
                        });
                    }
                }
                Some(&"f") => {
                    if let (Some(slot), Some(at)) = (num(1), num(2)) {
                        t.freed.push((slot as u8, at));
                    }
                }
                Some(&"l") => {
                    let sid = f.get(2).and_then(|s| u64::from_str_radix(s, 16).ok());
                    if let (Some(slot), Some(sid)) = (num(1), sid) {
                        t.listens.push((slot as u8, sid));
                    }
                }
                _ => {}
            }
        }
        t
    }

    /// The table as [`Table::parse`] reads it.
    pub fn format(&self) -> String {
        let mut s = String::new();
        for m in &self.members {
            s += &format!("m {} {} {} {}\n", m.slot, m.pid, m.start, m.index);
        }
        for (slot, at) in &self.freed {
            s += &format!("f {slot} {at}\n");
        }
        for (slot, sid) in &self.listens {
            s += &format!("l {slot} {sid:016x}\n");
        }
        s
    }

    /// The member holding `slot`.
    pub fn member(&self, slot: u8) -> Option<&Member> {
        self.members.iter().find(|m| m.slot == slot)
    }

    /// A slot for a new member: one never used, else the one freed longest ago (its QP
    /// numbers have rested longest). `None` when all are held.
    pub fn pick_slot(&self) -> Option<u8> {
        let held = |s: u8| self.members.iter().any(|m| m.slot == s);
        let freed_at = |s: u8| self.freed.iter().find(|f| f.0 == s).map(|f| f.1);
        (FIRST_SLOT..=LAST_SLOT)
            .filter(|&s| !held(s))
            .min_by_key(|&s| (freed_at(s).map_or(0, |t| t + 1), s))
    }

    /// Adds a member whose socket has just joined the group: it takes the next index.
    pub fn join(&mut self, slot: u8, pid: u32, start: u64) -> u16 {
        let index = self.members.len() as u16;
        self.freed.retain(|f| f.0 != slot);
        self.listens.retain(|l| l.0 != slot);
        self.members.push(Member {
            slot,
            pid,
            start,
            index,
        });
        index
    }

    /// Removes the member holding `slot` (its socket left the group, or is about to): the
    /// last index moves into its index, as in the kernel; its slot is freed at `now_ms`
    /// and its listens end. Returns the member.
    pub fn leave(&mut self, slot: u8, now_ms: u64) -> Option<Member> {
        let at = self.members.iter().position(|m| m.slot == slot)?;
        let gone = self.members.swap_remove(at);
        let last = self.members.len() as u16;
        if let Some(moved) = self.members.iter_mut().find(|m| m.index == last) {
            moved.index = gone.index;
        }
        self.freed.retain(|f| f.0 != slot);
        self.freed.push((slot, now_ms));
        self.listens.retain(|l| l.0 != slot);
        Some(gone)
    }

    /// The slot listening on service `sid`.
    pub fn listener(&self, sid: u64) -> Option<u8> {
        self.listens.iter().find(|l| l.1 == sid).map(|l| l.0)
    }

    /// (slot, index) of every member, for [`super::steer::program`].
    pub fn layout(&self) -> Vec<(u8, u16)> {
        self.members.iter().map(|m| (m.slot, m.index)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_index_mirror_follows_the_kernel() {
        let mut t = Table::default();
        for (slot, pid) in [(1, 10), (2, 11), (3, 12), (4, 13)] {
            t.join(slot, pid, 0);
        }
        // The second member leaves: the last (index 3) moves into index 1.
        t.leave(2, 5);
        assert_eq!(t.member(4).unwrap().index, 1);
        assert_eq!(t.member(1).unwrap().index, 0);
        assert_eq!(t.member(3).unwrap().index, 2);
        // The last leaves: nobody moves.
        t.leave(3, 6);
        assert_eq!(t.layout().len(), 2);
        assert_eq!(t.member(4).unwrap().index, 1);
        // A newcomer takes the next index, and the slot never used before the freed ones.
        let s = t.pick_slot().unwrap();
        assert_eq!(s, 5);
        assert_eq!(t.join(s, 14, 0), 2);
    }

    #[test]
    fn freed_slots_rest_longest_first_when_all_were_used() {
        let mut t = Table::default();
        for slot in FIRST_SLOT..=LAST_SLOT {
            t.join(slot, u32::from(slot), 0);
        }
        assert_eq!(t.pick_slot(), None);
        t.leave(9, 100);
        t.leave(7, 50);
        assert_eq!(t.pick_slot(), Some(7));
        t.join(7, 1000, 0);
        assert_eq!(t.pick_slot(), Some(9));
    }

    #[test]
    fn the_table_reads_back_what_it_wrote() {
        let mut t = Table::default();
        t.join(3, 100, 77);
        t.join(5, 101, 78);
        t.listens.push((5, 0x0106_0000_1234));
        t.leave(3, 123);
        let back = Table::parse(&t.format());
        assert_eq!(back, t);
        assert_eq!(back.listener(0x0106_0000_1234), Some(5));
        // Garbage lines are left out.
        assert_eq!(Table::parse("m x y\nzzz\nf 3\n"), Table::default());
    }
}
