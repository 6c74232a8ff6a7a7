//! Where a new partition's replicas go: Kafka's assignment
//! (`StripedReplicaPlacer`, formerly `AdminUtils.assignReplicasToBrokers`),
//! so a topic created here is spread as an operator used to Kafka expects.
//!
//! Replicas are spread round-robin from a start index, with the followers of
//! successive rounds shifted so that a broker's leaderships do not all have
//! the same followers. When every broker names a rack, the brokers are
//! first interleaved rack by rack and each partition's replicas take one
//! broker per rack before any rack gets a second.
//!
//! Invariant: pure. The random start and shift are the caller's, so the
//! proposer decides and every replica of the image applies the same result.

use crate::types::NodeId;

/// A broker that can take replicas (registered and unfenced).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub node_id: NodeId,
    pub rack: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    #[error("Replication factor must be larger than 0.")]
    ReplicationFactorTooSmall,
    #[error(
        "Unable to replicate the partition {requested} time(s): The target replication factor of {requested} cannot be reached because only {available} broker(s) are registered."
    )]
    TooFewBrokers { requested: i16, available: usize },
}

/// Replica lists for partitions `first .. first + count`. `start` and
/// `shift` are the random start index and follower shift (any values; they
/// are reduced modulo the broker count).
pub fn assign(
    candidates: &[Candidate],
    first: i32,
    count: i32,
    replication_factor: i16,
    start: usize,
    shift: usize,
) -> Result<Vec<Vec<NodeId>>, PlacementError> {
    if replication_factor < 1 {
        return Err(PlacementError::ReplicationFactorTooSmall);
    }
    let rf = replication_factor as usize;
    let n = candidates.len();
    if rf > n {
        return Err(PlacementError::TooFewBrokers {
            requested: replication_factor,
            available: n,
        });
    }
    let mut sorted = candidates.to_vec();
    sorted.sort_by_key(|c| c.node_id);
    let rack_aware = sorted.iter().all(|c| c.rack.is_some());
    let brokers = if rack_aware {
        interleave_racks(&sorted)
    } else {
        sorted
    };
    let racks = {
        let mut racks: Vec<&Option<String>> = brokers.iter().map(|c| &c.rack).collect();
        racks.sort();
        racks.dedup();
        racks.len()
    };

    let start = start % n;
    let mut shift = shift % n;
    let mut out = Vec::with_capacity(count.max(0) as usize);
    for i in 0..count.max(0) {
        let partition = (first + i) as usize;
        if partition > 0 && partition.is_multiple_of(n) {
            shift += 1;
        }
        let leader_index = (partition + start) % n;
        let mut replicas = vec![brokers[leader_index].node_id];
        if rack_aware {
            let mut used_racks = vec![brokers[leader_index].rack.clone()];
            let mut k = 0;
            while replicas.len() < rf {
                let c = &brokers[replica_index(leader_index, shift * racks, k, n)];
                k += 1;
                let rack_ok = !used_racks.contains(&c.rack) || used_racks.len() == racks;
                let broker_ok = !replicas.contains(&c.node_id);
                if rack_ok && broker_ok {
                    replicas.push(c.node_id);
                    if !used_racks.contains(&c.rack) {
                        used_racks.push(c.rack.clone());
                    }
                }
            }
        } else {
            for j in 0..rf - 1 {
                replicas.push(brokers[replica_index(leader_index, shift, j, n)].node_id);
            }
        }
        out.push(replicas);
    }
    Ok(out)
}

/// Kafka's `replicaIndex`: the j-th follower of a partition whose leader is
/// at `first`, never the leader itself.
fn replica_index(first: usize, shift: usize, j: usize, n: usize) -> usize {
    if n == 1 {
        return first;
    }
    let shift = 1 + (shift + j) % (n - 1);
    (first + shift) % n
}

/// Orders brokers rack by rack: the first broker of each rack (racks in
/// name order), then the second of each, and so on.
fn interleave_racks(sorted: &[Candidate]) -> Vec<Candidate> {
    let mut racks: Vec<(&Option<String>, Vec<&Candidate>)> = Vec::new();
    for c in sorted {
        match racks.iter_mut().find(|(r, _)| *r == &c.rack) {
            Some((_, list)) => list.push(c),
            None => racks.push((&c.rack, vec![c])),
        }
    }
    racks.sort_by(|a, b| a.0.cmp(b.0));
    let longest = racks.iter().map(|(_, l)| l.len()).max().unwrap_or(0);
    let mut out = Vec::with_capacity(sorted.len());
    for i in 0..longest {
        for (_, list) in &racks {
            if let Some(c) = list.get(i) {
                out.push((*c).clone());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn plain(ids: &[i32]) -> Vec<Candidate> {
        ids.iter()
            .map(|&id| Candidate {
                node_id: NodeId(id),
                rack: None,
            })
            .collect()
    }

    #[test]
    fn too_few_brokers_is_an_invalid_replication_factor() {
        assert_eq!(
            assign(&plain(&[1, 2]), 0, 3, 3, 0, 0),
            Err(PlacementError::TooFewBrokers {
                requested: 3,
                available: 2
            })
        );
        assert_eq!(
            assign(&plain(&[1]), 0, 1, 0, 0, 0),
            Err(PlacementError::ReplicationFactorTooSmall)
        );
    }

    #[test]
    fn replicas_are_distinct_and_leaders_spread_evenly() {
        let brokers = plain(&[1, 2, 3, 4, 5]);
        for start in 0..5 {
            for shift in 0..5 {
                let out = assign(&brokers, 0, 50, 3, start, shift).unwrap();
                let mut leaders: BTreeMap<NodeId, usize> = BTreeMap::new();
                let mut all: BTreeMap<NodeId, usize> = BTreeMap::new();
                for replicas in &out {
                    let mut distinct = replicas.clone();
                    distinct.sort();
                    distinct.dedup();
                    assert_eq!(distinct.len(), 3, "{replicas:?}");
                    *leaders.entry(replicas[0]).or_default() += 1;
                    for r in replicas {
                        *all.entry(*r).or_default() += 1;
                    }
                }
                assert!(leaders.values().all(|&c| c == 10), "{leaders:?}");
                assert!(all.values().all(|&c| c == 30), "{all:?}");
            }
        }
    }

    #[test]
    fn matches_kafkas_assignment_for_a_known_case() {
        // Kafka's AdminUtils doc example: 5 brokers, 10 partitions, RF 3,
        // start index 0 and shift 0 (as in its unit test with fixed values).
        let out = assign(&plain(&[0, 1, 2, 3, 4]), 0, 10, 3, 0, 0).unwrap();
        let ids: Vec<Vec<i32>> = out
            .iter()
            .map(|r| r.iter().map(|n| n.0).collect())
            .collect();
        assert_eq!(
            ids,
            vec![
                vec![0, 1, 2],
                vec![1, 2, 3],
                vec![2, 3, 4],
                vec![3, 4, 0],
                vec![4, 0, 1],
                vec![0, 2, 3],
                vec![1, 3, 4],
                vec![2, 4, 0],
                vec![3, 0, 1],
                vec![4, 1, 2],
            ]
        );
    }

    #[test]
    fn rack_aware_placement_uses_every_rack_before_repeating_one() {
        let brokers: Vec<Candidate> = [(1, "a"), (2, "a"), (3, "b"), (4, "b"), (5, "c"), (6, "c")]
            .iter()
            .map(|&(id, rack)| Candidate {
                node_id: NodeId(id),
                rack: Some(rack.to_string()),
            })
            .collect();
        let rack_of = |n: NodeId| {
            brokers
                .iter()
                .find(|c| c.node_id == n)
                .unwrap()
                .rack
                .clone()
        };
        for start in 0..6 {
            for replicas in assign(&brokers, 0, 12, 3, start, start).unwrap() {
                let mut racks: Vec<_> = replicas.iter().map(|&n| rack_of(n)).collect();
                racks.sort();
                racks.dedup();
                assert_eq!(racks.len(), 3, "{replicas:?}");
            }
        }
        // Uneven racks still give distinct replicas.
        let uneven = &brokers[..5];
        for replicas in assign(uneven, 0, 10, 4, 1, 2).unwrap() {
            let mut distinct = replicas.clone();
            distinct.sort();
            distinct.dedup();
            assert_eq!(distinct.len(), 4);
        }
    }
}
