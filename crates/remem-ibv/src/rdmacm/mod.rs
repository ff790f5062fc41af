//! The drop-in librdmacm.
pub mod abi;
pub mod rsocket;
pub mod stubs;
