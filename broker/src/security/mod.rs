//! Security: TLS for SSL listeners, SASL mechanisms for SASL listeners, and
//! the credentials they check against.

pub mod credentials;
pub mod sasl;
pub mod tls;
