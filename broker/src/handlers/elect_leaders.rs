//! ElectLeaders (key 43): `kafka-leader-election.sh`, Admin `electLeaders`.
//!
//! As Kafka's controller (`ReplicationControlManager.electLeader`), per
//! partition: PREFERRED moves the leadership to the first replica of the
//! assignment when it is live and in sync (ELECTION_NOT_NEEDED when it leads
//! already, PREFERRED_LEADER_NOT_AVAILABLE when it cannot); UNCLEAN elects a
//! leader for a leaderless partition, from the ISR when a member is live and
//! else from any live replica (ELECTION_NOT_NEEDED when it has a leader,
//! ELIGIBLE_LEADERS_NOT_AVAILABLE when no replica is live). Without a
//! partition list every partition is tried and those that need no election
//! are left out of the answer. Needs ALTER on the cluster. Each election is
//! one metadata write, answered once committed; those not reached within the
//! request's timeout answer REQUEST_TIMED_OUT.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kafka_protocol::messages::elect_leaders_response::{PartitionResult, ReplicaElectionResult};
use kafka_protocol::messages::{ElectLeadersRequest, ElectLeadersResponse, TopicName};
use kafka_protocol::ResponseError;

use super::str_bytes;
use crate::broker::{metadata_error, Broker};
use crate::metadata::liveness::all_support;
use crate::metadata::{
    elected_leader, preferred_leader, MetadataCommand, MetadataError, FEATURE_ELECT_PREFERRED,
};

const PREFERRED: i8 = 0;
const UNCLEAN: i8 = 1;

pub async fn handle(
    broker: &Broker,
    version: i16,
    req: ElectLeadersRequest,
    allowed: bool,
) -> ElectLeadersResponse {
    let mut resp = ElectLeadersResponse::default();
    let image = broker.metadata.image();
    let all = req.topic_partitions.is_none();
    let wanted: BTreeMap<String, Vec<i32>> = match req.topic_partitions {
        Some(tps) => {
            let mut m: BTreeMap<String, Vec<i32>> = BTreeMap::new();
            for tp in tps {
                let parts = m.entry(tp.topic.0.to_string()).or_default();
                for p in tp.partitions {
                    if !parts.contains(&p) {
                        parts.push(p);
                    }
                }
            }
            m
        }
        None => image
            .topics
            .values()
            .map(|t| {
                (
                    t.name.clone(),
                    t.partitions.iter().map(|p| p.partition).collect(),
                )
            })
            .collect(),
    };
    let kind = if version == 0 {
        PREFERRED
    } else {
        req.election_type
    };
    // Every partition gets the same refusal when the request as a whole is.
    let refusal = if !allowed {
        Some((ResponseError::ClusterAuthorizationFailed, None))
    } else if kind != PREFERRED && kind != UNCLEAN {
        Some((
            ResponseError::InvalidRequest,
            Some(format!("Unknown election type {kind}")),
        ))
    } else if kind == PREFERRED && !all_support(&image, FEATURE_ELECT_PREFERRED) {
        Some((
            ResponseError::InvalidRequest,
            Some("not every broker runs a version that applies preferred elections yet: finish the upgrade first".to_string()),
        ))
    } else {
        None
    };
    if !allowed && version >= 1 {
        resp.error_code = ResponseError::ClusterAuthorizationFailed.code();
    }
    let deadline = Instant::now() + Duration::from_millis(req.timeout_ms.max(0) as u64);
    for (topic, partitions) in wanted {
        let mut result = ReplicaElectionResult::default();
        result.topic = TopicName(str_bytes(&topic));
        for partition in partitions {
            let outcome = match &refusal {
                Some((code, message)) => Err((*code, message.clone())),
                None => elect(broker, &topic, partition, kind, deadline).await,
            };
            if all && matches!(outcome, Err((ResponseError::ElectionNotNeeded, _))) {
                continue;
            }
            let mut r = PartitionResult::default();
            r.partition_id = partition;
            if let Err((code, message)) = outcome {
                r.error_code = code.code();
                r.error_message = message.map(str_bytes);
            }
            result.partition_result.push(r);
        }
        if !result.partition_result.is_empty() {
            resp.replica_election_results.push(result);
        }
    }
    resp
}

type Outcome = Result<(), (ResponseError, Option<String>)>;

async fn elect(
    broker: &Broker,
    topic: &str,
    partition: i32,
    kind: i8,
    deadline: Instant,
) -> Outcome {
    let image = broker.metadata.image();
    let Some(p) = image.topics.get(topic).and_then(|t| {
        t.partitions
            .get(usize::try_from(partition).ok()?)
            .map(|p| (t.topic_id, p))
    }) else {
        return Err((
            ResponseError::UnknownTopicOrPartition,
            Some(format!("The partition {topic}-{partition} does not exist.")),
        ));
    };
    let (topic_id, p) = p;
    // Decided on the image first, as the controller will: a partition that
    // needs no election, or cannot have one, costs no metadata write (the
    // command checks again when it applies, for a change in between).
    let check = if kind == PREFERRED {
        preferred_leader(p, &image.brokers).map(|_| ())
    } else {
        elected_leader(p, &image.brokers, true).map(|_| ())
    };
    let cmd = if kind == PREFERRED {
        MetadataCommand::ElectPreferredLeader {
            topic_id,
            partition,
        }
    } else {
        MetadataCommand::ElectLeader {
            topic_id,
            partition,
            unclean: true,
        }
    };
    let outcome = match check {
        Err(e) => Err(e),
        Ok(()) => {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                return Err((ResponseError::RequestTimedOut, None));
            };
            match tokio::time::timeout(left, broker.metadata.propose(cmd)).await {
                Err(_) => return Err((ResponseError::RequestTimedOut, None)),
                Ok(result) => result.map(|_| ()),
            }
        }
    };
    outcome.map_err(|e| match e {
        MetadataError::ElectionNotNeeded => (ResponseError::ElectionNotNeeded, None),
        // An election's one refusal but that: no replica it may choose is live.
        e @ MetadataError::InvalidRequest(_) if kind == UNCLEAN => (
            ResponseError::EligibleLeadersNotAvailable,
            Some(format!(
                "Failed to elect leader for partition {topic}-{partition}: {e}"
            )),
        ),
        e => (
            metadata_error(&e),
            Some(format!(
                "Failed to elect leader for partition {topic}-{partition}: {e}"
            )),
        ),
    })
}
