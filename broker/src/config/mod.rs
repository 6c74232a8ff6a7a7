//! Configuration: the broker's own (`server.properties` keys) and per-topic
//! configs, both with Kafka's names and defaults.
//!
//! Everything feeds one plain struct: a properties file, then `--override
//! key=value` flags in order, exactly as `kafka-server-start.sh` does.

pub mod group;
mod security;
mod server;
mod topic;

pub use security::{
    SecurityProtocol, CONTROLLER_SASL_MECHANISMS, INTER_BROKER_SASL_MECHANISMS,
    SASL_MECHANISM_CONTROLLER_PROTOCOL, SASL_MECHANISM_INTER_BROKER_PROTOCOL,
    SUPPORTED_SASL_MECHANISMS,
};
pub use server::{BootstrapScram, ConfigError, Listener, ServerConfig};
pub use topic::{
    check_dynamic_broker_config, dynamic_broker_key, topic_config, BrokerSource,
    DynamicBrokerConfigs, TopicConfigEntry, TopicConfigError, TopicConfigs, TOPIC_CONFIGS,
};
