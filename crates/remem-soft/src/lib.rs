//! remem-soft
