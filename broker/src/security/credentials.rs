//! SCRAM credentials as the SASL mechanisms read them: from the metadata
//! quorum's image, so a credential set with AlterUserScramCredentials on
//! any node authenticates on every node once the quorum has it.

use std::sync::Arc;

use tokio::sync::watch;

use super::sasl::{CredentialSource, ScramCredential, ScramMechanism};
use crate::metadata::MetadataImage;

/// The credentials in the latest metadata image.
pub struct MetadataCredentials {
    images: watch::Receiver<Arc<MetadataImage>>,
}

impl MetadataCredentials {
    pub fn new(images: watch::Receiver<Arc<MetadataImage>>) -> Self {
        Self { images }
    }
}

impl CredentialSource for MetadataCredentials {
    fn scram(&self, mechanism: ScramMechanism, user: &str) -> Option<ScramCredential> {
        let image = self.images.borrow().clone();
        let stored = image
            .scram_credentials
            .get(user)?
            .get(&mechanism.type_id())?;
        Some(ScramCredential {
            salt: stored.salt.clone(),
            stored_key: stored.stored_key.clone(),
            server_key: stored.server_key.clone(),
            iterations: stored.iterations,
        })
    }
}
