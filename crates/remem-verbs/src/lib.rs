//! remem-verbs
