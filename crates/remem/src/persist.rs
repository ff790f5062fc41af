//! Remote persistent memory, as librpma offers it: flush types and the peer configuration
//! descriptor. The operations are [`Connection::flush`](crate::Connection::flush),
//! [`Connection::atomic_write`](crate::Connection::atomic_write) and
//! [`Connection::post_write`](crate::Connection::post_write); file-backed regions come from
//! [`Rdma::register_file`](crate::Rdma::register_file).

use crate::error::{Error, Result};

/// What a flush guarantees once it completes (librpma's `RPMA_FLUSH_TYPE_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FlushType {
    /// The data is visible to every agent at the peer (RoCEv2 placement "global
    /// visibility").
    Visibility,
    /// The data is durable at the peer: on persistent memory, or written back to the file
    /// behind the region (RoCEv2 placement "persistence").
    Persistent,
}

/// What a peer declares about its memory, to be sent to the other side as a descriptor
/// ([`PeerConfig::descriptor`]) and applied there
/// ([`Connection::apply_peer_config`](crate::Connection::apply_peer_config)); librpma's
/// `rpma_peer_cfg`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PeerConfig {
    /// Writes to this side's memory go straight to its persistence domain (persistent
    /// memory with DDIO off, or eADR), so a READ after them is a persistent flush.
    pub direct_write_to_pmem: bool,
}

const MAGIC: &[u8; 3] = b"RPC";
const VERSION: u8 = 1;
/// Bytes of a peer configuration descriptor.
pub const PEER_CONFIG_DESCRIPTOR_LEN: usize = 5;

impl PeerConfig {
    /// Encodes it ([`PEER_CONFIG_DESCRIPTOR_LEN`] bytes: magic `RPC`, version, flags).
    pub fn descriptor(&self) -> [u8; PEER_CONFIG_DESCRIPTOR_LEN] {
        [
            MAGIC[0],
            MAGIC[1],
            MAGIC[2],
            VERSION,
            u8::from(self.direct_write_to_pmem),
        ]
    }

    /// Decodes a descriptor. Total: wrong length, magic or version, or unknown flag bits
    /// are an [`Error::Descriptor`], never a panic.
    pub fn from_descriptor(bytes: &[u8]) -> Result<PeerConfig> {
        let bad = |why: &str| Error::Descriptor(why.to_string());
        if bytes.len() != PEER_CONFIG_DESCRIPTOR_LEN || &bytes[..3] != MAGIC {
            return Err(bad("not a peer configuration descriptor"));
        }
        if bytes[3] != VERSION {
            return Err(Error::Descriptor(format!(
                "peer configuration version {} (this is version {VERSION})",
                bytes[3]
            )));
        }
        if bytes[4] & !1 != 0 {
            return Err(bad("unknown peer configuration flags"));
        }
        Ok(PeerConfig {
            direct_write_to_pmem: bytes[4] & 1 != 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RemoteMr;
    use proptest::prelude::*;

    #[test]
    fn peer_config_round_trips() {
        for direct_write_to_pmem in [false, true] {
            let c = PeerConfig {
                direct_write_to_pmem,
            };
            assert_eq!(PeerConfig::from_descriptor(&c.descriptor()).unwrap(), c);
        }
        let mut d = PeerConfig::default().descriptor();
        d[4] = 2;
        assert!(PeerConfig::from_descriptor(&d).is_err());
        d[4] = 0;
        d[3] = 2;
        assert!(PeerConfig::from_descriptor(&d).is_err());
        assert!(PeerConfig::from_descriptor(&d[..4]).is_err());
    }

    proptest! {
        #[test]
        fn descriptors_decode_totally(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            // Any bytes: a value or an error, never a panic; what decodes re-encodes
            // to the same bytes.
            if let Ok(mr) = RemoteMr::from_descriptor(&bytes) {
                prop_assert_eq!(mr.descriptor(), bytes.clone());
            }
            if let Ok(c) = PeerConfig::from_descriptor(&bytes) {
                prop_assert_eq!(&c.descriptor()[..], &bytes[..]);
            }
        }

        #[test]
        fn mr_descriptors_survive_mutation(flip in 0usize..28, bit in 0u8..8) {
            let mr = RemoteMr {
                addr: 0x7f00_0000_1000,
                len: 4096,
                rkey: 0x1234,
                access: remem_verbs::AccessFlags::REMOTE_WRITE
                    | remem_verbs::AccessFlags::FLUSH_PERSISTENT,
            };
            let good = mr.descriptor();
            prop_assert_eq!(RemoteMr::from_descriptor(&good).unwrap(), mr);
            let mut bad = good.clone();
            bad[flip] ^= 1 << bit;
            // A flipped bit is either rejected or decodes to a different region.
            if let Ok(other) = RemoteMr::from_descriptor(&bad) {
                prop_assert_ne!(other, mr);
            }
        }
    }
}
