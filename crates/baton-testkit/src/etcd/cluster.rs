//! Several etcd members that form one cluster, each on free loopback
//! ports with a data directory of its own: for tests of what a fleet does
//! when one member hangs or is cut from the others.

use std::time::Instant;

use serde_json::json;

use super::{Etcd, PORT_TRIES, START_LIMIT};
use crate::server::free_port;

/// A running etcd cluster. Dropping it stops every member (continuing a
/// paused one first).
pub struct EtcdCluster {
    members: Vec<Etcd>,
}

impl EtcdCluster {
    /// Starts `size` members as one new cluster and waits until every one
    /// reports itself healthy (the cluster has a leader). Panics with the
    /// members' logs when that does not happen within a bounded time.
    pub fn start(size: usize) -> EtcdCluster {
        assert!(size >= 1, "a cluster has at least one member");
        let mut members: Vec<Etcd> = (0..size).map(|_| Etcd::unstarted()).collect();
        for _ in 0..PORT_TRIES {
            for member in &mut members {
                member.client = free_port();
                member.peer = free_port();
                member.metrics = free_port();
            }
            let peers: Vec<String> =
                members.iter().map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer)).collect();
            let token = format!("{}-cluster", members[0].name);
            for member in &mut members {
                member.cluster = Some((peers.join(","), token.clone()));
                member.spawn();
            }
            // Each waits for the cluster's leader, which needs a quorum: all
            // are started before any is waited for.
            let healthy = members.iter_mut().all(Etcd::wait_healthy);
            if healthy {
                return EtcdCluster { members };
            }
            let taken = members.iter().any(|m| m.log_tail().contains("address already in use"));
            for member in &mut members {
                member.kill();
            }
            if !taken {
                break;
            }
            // Fresh data directories: a half-formed cluster's are spoilt.
            members = (0..size).map(|_| Etcd::unstarted()).collect();
        }
        let logs: Vec<String> = members.iter().map(|m| format!("--- {} ---\n{}", m.name, m.log_tail())).collect();
        panic!("the etcd cluster did not become healthy within {START_LIMIT:?}\n{}", logs.join("\n"));
    }

    /// How many members it has.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether it has no member (never: a cluster starts with one at least).
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Member `i`.
    pub fn member(&self, i: usize) -> &Etcd {
        &self.members[i]
    }

    /// Every member's client address, as baton takes them:
    /// `etcd://127.0.0.1:A,127.0.0.1:B,…`.
    pub fn endpoints(&self) -> String {
        let hosts: Vec<String> = self.members.iter().map(|m| format!("127.0.0.1:{}", m.port())).collect();
        format!("etcd://{}", hosts.join(","))
    }

    /// The member whose client URL is `endpoint` (as
    /// [`Etcd::endpoint`] gives it), if any.
    pub fn index_of(&self, endpoint: &str) -> Option<usize> {
        self.members.iter().position(|m| m.endpoint() == endpoint.trim_end_matches('/'))
    }

    /// The member that leads the cluster now, as every running member
    /// that answers agrees; waits (within the start limit) while they
    /// elect one.
    pub fn leader(&self) -> usize {
        let deadline = Instant::now() + START_LIMIT;
        loop {
            let statuses: Vec<Option<(String, String)>> =
                self.members.iter().map(|m| (!m.paused).then(|| m.status()).flatten()).collect();
            let leaders: Vec<&String> = statuses.iter().flatten().map(|(_, leader)| leader).collect();
            let agreed = leaders.first().filter(|first| leaders.iter().all(|l| l == *first));
            if let Some(leader) = agreed
                && let Some(i) = statuses.iter().position(|s| s.as_ref().is_some_and(|(id, _)| id == *leader))
            {
                return i;
            }
            assert!(Instant::now() < deadline, "the etcd members agree on no leader: {statuses:?}");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// Makes member `to` the leader (etcd's leadership transfer, asked of
    /// the leader), and waits until every member says so.
    pub fn move_leader(&self, to: usize) {
        let deadline = Instant::now() + START_LIMIT;
        let (target, _) = self.members[to].status().expect("the new leader answers");
        while self.leader() != to {
            let leader = self.leader();
            if leader != to {
                self.members[leader].gateway_any("/v3/maintenance/transfer-leadership", &json!({ "targetID": target }));
            }
            assert!(Instant::now() < deadline, "leadership did not move to member {to}");
        }
    }

    /// Stops member `i` with SIGSTOP: it accepts connections and answers
    /// nothing, neither clients nor its peers.
    pub fn pause(&mut self, i: usize) {
        self.members[i].pause();
    }

    /// Continues member `i`.
    pub fn resume(&mut self, i: usize) {
        self.members[i].resume();
    }
}
