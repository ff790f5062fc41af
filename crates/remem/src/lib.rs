//! remem
