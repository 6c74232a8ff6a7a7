//! Newtypes for Kafka's identifiers, so an offset cannot be passed where an
//! epoch is expected. Names follow Kafka's vocabulary exactly.

use std::fmt;
use std::sync::Arc;

macro_rules! newtype {
    ($(#[$m:meta])* $name:ident($inner:ty)) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
        pub struct $name(pub $inner);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }
    };
}

newtype!(
    /// A position in a partition's log.
    Offset(i64)
);
newtype!(
    /// The epoch of a partition's leader, stamped on every batch it appends.
    LeaderEpoch(i32)
);
newtype!(
    /// A producer id handed out by InitProducerId.
    ProducerId(i64)
);
newtype!(
    /// A producer's epoch; bumped to fence an older instance of the producer.
    ProducerEpoch(i16)
);
newtype!(
    /// A broker's (and controller's) `node.id`.
    NodeId(i32)
);

impl Offset {
    pub fn next(self) -> Offset {
        Offset(self.0 + 1)
    }
}

/// A topic's name and one of its partitions.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TopicPartition {
    pub topic: Arc<str>,
    pub partition: i32,
}

impl TopicPartition {
    pub fn new(topic: impl Into<Arc<str>>, partition: i32) -> Self {
        Self {
            topic: topic.into(),
            partition,
        }
    }
}

impl fmt::Display for TopicPartition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.topic, self.partition)
    }
}
