//! RoCEv2 packet formats (IBTA Annex A17, as Linux Soft-RoCE implements them) and the ICRC.
#![forbid(unsafe_code)]
