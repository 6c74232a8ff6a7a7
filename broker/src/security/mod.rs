//! Security: TLS for SSL listeners, SASL mechanisms for SASL listeners, and
//! the credentials they check against; the client side of both for the
//! broker's own connections to its peers (`peer`).

pub mod credentials;
pub mod peer;
pub mod sasl;
pub mod tls;
